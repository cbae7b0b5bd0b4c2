//! Reserve, then settle (`RateLimitLayer::reserve` with a `charge`),
//! through the layer on real stores: the memory backend, Redis (a server
//! the harness starts, tests/support/redis.rs) and PostgreSQL (a schema of
//! its own, tests/support/postgres.rs). A request spends its estimate all
//! or nothing, so concurrent requests never pass the budget; its answer
//! settles the reservation to the use its charge reads (a refund lets the
//! next call in, a use above the estimate is charged), in its own window; a
//! use the charge cannot read keeps the reservation and is logged once. A
//! denial by cost shows what is truly left, on Redis, a Redis Cluster and
//! Redis behind Sentinel too. Across two instances (two backends on
//! connections of their own), a settle on one frees the budget on the
//! other within its deny cache's recheck bound, while a plain route's
//! denial stays local.

mod support;
#[path = "support/trial.rs"]
mod trial;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::task::{Context, Poll};
use support::logs::Capture;

use tower::{Layer, Service, ServiceExt};
use tower_pinned_window::backend::{Backend, MemoryBackend, Spending};
use tower_pinned_window::cost::{Charged, Metered};
use tower_pinned_window::key::{Key, RequestHead};
use tower_pinned_window::outcome::ResponseHead;
use tower_pinned_window::response::DefaultDeny;
use tower_pinned_window::{ConfigError, Decision, Quota, RateLimit, RateLimitLayer};
use tracing_subscriber::filter::LevelFilter;
use trial::Needs;

/// How long a test waits for a settle that goes out to the store (spawned
/// on a tokio task) before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// Every test's budget: tokens per window.
const LIMIT: u64 = 1000;

/// Every test's estimate: what a call reserves.
const ESTIMATE: u64 = 300;

/// What the log says when a charge cannot read an answer's usage.
const UNREADABLE: &str = "could not read the answer's usage";

fn quota(limit: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(60)).unwrap()
}

fn number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// The estimate: the request's `x-max-tokens` (0 without one).
fn estimate(request: &RequestHead<'_>) -> u64 {
    number(request.headers(), "x-max-tokens").unwrap_or(0)
}

/// The use: the answer's `x-usage-tokens`, `None` when absent or not a
/// number.
fn usage(end: &ResponseHead<'_>) -> Option<u64> {
    number(end.headers(), "x-usage-tokens")
}

/// The provider behind the layer: answers with the status in `x-status`
/// (200 without one) and, when the request has `x-use`, that value, as it
/// is, in `x-usage-tokens`.
#[derive(Clone, Copy, Debug)]
struct Provider;

impl Service<Request<String>> for Provider {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let mut response = Response::new(String::from("completion"));
        if let Some(status) = request.headers().get("x-status") {
            *response.status_mut() = status.to_str().unwrap().parse().unwrap();
        }
        if let Some(used) = request.headers().get("x-use") {
            response
                .headers_mut()
                .insert("x-usage-tokens", used.clone());
        }
        std::future::ready(Ok(response))
    }
}

/// The layer under test on `backend`: [`LIMIT`] tokens a minute per
/// `x-api-key`, reserving [`estimate`], settled by [`usage`]; an answer
/// with a 5xx does not count (its reservation is refunded).
fn limited<Bk: Spending>(backend: Bk) -> RateLimit<Provider, HeaderName, Bk, DefaultDeny, Charged> {
    RateLimitLayer::new("tokens", quota(LIMIT))
        .key(HeaderName::from_static("x-api-key"))
        .backend(backend)
        .count_if(|res| !res.status().is_server_error())
        .reserve(estimate)
        .charge(usage)
        .layer(Provider)
}

/// A call with `key` reserving `max_tokens`, whose answer reports `used`
/// (raw: a number, or not), with status `status`.
fn call(key: &str, max_tokens: u64, used: Option<&str>, status: u16) -> Request<String> {
    let mut request = Request::post("/complete")
        .header("x-api-key", key)
        .header("x-max-tokens", max_tokens)
        .header("x-status", status);
    if let Some(used) = used {
        request = request.header("x-use", used);
    }
    request.body(String::new()).unwrap()
}

/// What a client saw of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: StatusCode,
    /// Budget left per the `RateLimit` header.
    left: Option<u64>,
    /// Seconds per `Retry-After`.
    retry_after: Option<u64>,
    never_fits: bool,
}

/// Sends `request` through `service` and reads the whole body (where the
/// settle happens).
async fn send<S>(service: &S, request: Request<String>) -> Seen
where
    S: Service<Request<String>, Response = Response<Metered<String>>, Error = Infallible> + Clone,
{
    let response = service.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let left = response.headers().get("ratelimit").map(|value| {
        let value = value.to_str().unwrap();
        let r = value.split(";r=").nth(1).unwrap();
        r.split(';').next().unwrap().parse().unwrap()
    });
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().parse().unwrap());
    let never_fits = response
        .extensions()
        .get::<Decision>()
        .is_some_and(Decision::never_fits);
    response.into_body().collect().await.unwrap();
    Seen {
        status,
        left,
        retry_after,
        never_fits,
    }
}

/// `key`'s count in `backend` (`None`: no live counter).
async fn count<Bk: Backend>(backend: &Bk, key: &str) -> Option<u64> {
    let hit = backend.peek("tokens", &Key::new(key)).await.unwrap();
    hit.map(|hit| hit.count)
}

/// Waits until `key`'s count is `want` (a settle that goes out to the
/// store lands on a tokio task), failing after [`PATIENCE`].
async fn settled<Bk: Backend>(backend: &Bk, key: &str, want: u64, what: &str) {
    let start = Instant::now();
    loop {
        let now = count(backend, key).await;
        if now == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{what}: the count is {now:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The budget of the cases across two instances: the 2,000 tokens
/// a minute.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
const SHARED: u64 = 2000;

/// What a test waits past a deny cache's recheck bound, so that the bound
/// has surely passed (the wait is never asserted on).
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
const PAST_THE_BOUND: Duration = Duration::from_millis(20);

/// One instance's layer for the cases across instances: [`SHARED`] tokens
/// a minute per `x-api-key`, `reserve` and `charge` and nothing else.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
fn reserving<Bk: Spending>(
    backend: Bk,
) -> RateLimit<Provider, HeaderName, Bk, DefaultDeny, Charged> {
    RateLimitLayer::new("tokens", quota(SHARED))
        .key(HeaderName::from_static("x-api-key"))
        .backend(backend)
        .reserve(estimate)
        .charge(usage)
        .layer(Provider)
}

/// One instance's plain route: 2 hits a minute per `x-api-key`, with no
/// option that lowers a count.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
fn plain<Bk: Backend>(backend: Bk) -> RateLimit<Provider, HeaderName, Bk, DefaultDeny> {
    RateLimitLayer::new("tokens", quota(2))
        .key(HeaderName::from_static("x-api-key"))
        .backend(backend)
        .layer(Provider)
}

/// The cases, on any backend that spends; `store` names it in messages.
mod cases {
    use super::*;

    /// The four steps, on instances A and B (`a`, `b`: backends on
    /// connections of their own, the same store): A's call reserves the
    /// whole budget and is still running; B's reservation is denied (and
    /// its deny cache learns the key is full); A's answer settles to 100;
    /// once B's `recheck` bound has passed, B's reservation is admitted
    /// with 1,800 left, not denied until the window ends.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub async fn a_settle_on_one_instance_frees_the_budget_on_another<Bk: Spending>(
        a: Bk,
        b: Bk,
        recheck: Duration,
        store: &str,
    ) {
        let (on_a, on_b) = (reserving(a.clone()), reserving(b));
        // 1. A's call reserves 2,000; its answer's body is not read yet.
        let running = on_a
            .clone()
            .oneshot(call("shared", SHARED, Some("100"), 200))
            .await
            .unwrap();
        assert_eq!(running.status(), StatusCode::OK, "{store}");
        assert_eq!(count(&a, "shared").await, Some(SHARED), "{store}");
        // 2. B's reservation of 100 does not fit.
        let denied = send(&on_b, call("shared", 100, Some("100"), 200)).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        // 3. A's answer ends: its use of 100 settles the reservation.
        running.into_body().collect().await.unwrap();
        settled(&a, "shared", 100, store).await;
        // 4. Once B's bound has passed, B sees the room A freed.
        tokio::time::sleep(recheck + PAST_THE_BOUND).await;
        let seen = send(&on_b, call("shared", 100, Some("100"), 200)).await;
        assert_eq!(
            (seen.status, seen.left),
            (StatusCode::OK, Some(SHARED - 100 - 100)),
            "{store}: B denied what A freed"
        );
        let seen = send(&on_a, call("shared", 100, Some("100"), 200)).await;
        assert_eq!(seen.left, Some(SHARED - 300), "{store}: A sees B's");
    }

    /// On a route with no option that lowers a count, B's denial is held
    /// for the whole window: past the recheck bound, B's requests are
    /// still denied with nothing sent to the store (a hit that reaches the
    /// store is counted, even a denied one; the count stays where B's
    /// first denial left it). Returns after B's local denials, for the
    /// caller to count the store's calls too.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub async fn a_plain_routes_denial_stays_local_past_the_bound<Bk: Backend>(
        a: Bk,
        b: Bk,
        recheck: Duration,
        store: &str,
        local: impl AsyncFnOnce(),
    ) {
        let (on_a, on_b) = (plain(a.clone()), plain(b));
        let request = || call("plain", 0, None, 200);
        for _ in 0..2 {
            let status = on_a.clone().oneshot(request()).await.unwrap().status();
            assert_eq!(status, StatusCode::OK, "{store}");
        }
        let status = on_b.clone().oneshot(request()).await.unwrap().status();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        assert_eq!(
            count(&a, "plain").await,
            Some(3),
            "{store}: B's denial was counted"
        );
        tokio::time::sleep(recheck + PAST_THE_BOUND).await;
        local().await;
        for _ in 0..5 {
            let status = on_b.clone().oneshot(request()).await.unwrap().status();
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        }
        assert_eq!(
            count(&a, "plain").await,
            Some(3),
            "{store}: B's later denials were answered locally"
        );
    }

    /// 50 calls at once, each reserving 300 of 1,000: never more admitted
    /// than estimates fit, whatever the interleaving; once settled, the
    /// stored count is what the admitted calls used, within the budget.
    pub async fn concurrent_reservations_never_pass_the_budget<Bk: Spending>(
        backend: Bk,
        store: &str,
    ) {
        let service = limited(backend.clone());
        let burst = |key: &'static str, used: &'static str| {
            let tasks: Vec<_> = (0..50)
                .map(|_| {
                    let service = service.clone();
                    tokio::spawn(async move {
                        send(&service, call(key, ESTIMATE, Some(used), 200)).await
                    })
                })
                .collect();
            async move {
                let mut admitted = 0;
                for task in tasks {
                    let seen = task.await.unwrap();
                    match seen.status {
                        StatusCode::OK => admitted += 1,
                        StatusCode::TOO_MANY_REQUESTS => {}
                        other => panic!("{store}: {other}"),
                    }
                }
                admitted
            }
        };
        // Each uses its whole estimate: exactly as many as estimates fit.
        let admitted = burst("full", "300").await;
        assert_eq!(admitted, LIMIT / ESTIMATE, "{store}: admitted");
        settled(&backend, "full", admitted * ESTIMATE, store).await;

        // Each uses less: refunds may let more in while the burst runs,
        // never past the budget. The last admitted call found its estimate
        // free beside at least the others' use.
        let admitted = burst("part", "120").await;
        assert!(
            (LIMIT / ESTIMATE..=(LIMIT - ESTIMATE) / 120 + 1).contains(&admitted),
            "{store}: {admitted} admitted"
        );
        settled(&backend, "part", admitted * 120, store).await;
        assert!(admitted * 120 <= LIMIT);
    }

    /// One call after another: the headers show the budget after each
    /// reservation; a use below the estimate is refunded, so more calls fit
    /// than estimates; a use above it is charged; an estimate above the
    /// limit never fits and spends nothing; an answer that does not count
    /// hands back its whole estimate.
    pub async fn settles_refund_and_charge_in_the_window<Bk: Spending>(backend: Bk, store: &str) {
        let service = limited(backend.clone());
        let mut spent = 0;
        let mut admitted = 0;
        while spent + ESTIMATE <= LIMIT {
            let seen = send(&service, call("refund", ESTIMATE, Some("120"), 200)).await;
            assert_eq!(seen.status, StatusCode::OK, "{store}: {spent} spent");
            assert_eq!(
                seen.left,
                Some(LIMIT - spent - ESTIMATE),
                "{store}: the budget after the reservation"
            );
            spent += 120;
            admitted += 1;
            settled(&backend, "refund", spent, store).await;
        }
        assert!(admitted > LIMIT / ESTIMATE, "{store}: {admitted} admitted");
        let denied = send(&service, call("refund", ESTIMATE, Some("120"), 200)).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        assert_eq!(
            count(&backend, "refund").await,
            Some(spent),
            "{store}: a denial spends nothing"
        );

        // A use above the estimate: the difference is charged.
        let seen = send(&service, call("over", ESTIMATE, Some("450"), 200)).await;
        assert_eq!(seen.left, Some(LIMIT - ESTIMATE), "{store}");
        settled(&backend, "over", 450, store).await;
        let seen = send(&service, call("over", ESTIMATE, Some("300"), 200)).await;
        assert_eq!(seen.left, Some(LIMIT - 450 - ESTIMATE), "{store}");
        settled(&backend, "over", 750, store).await;

        // An estimate above the limit is denied at once and spends nothing.
        let never = send(&service, call("over", LIMIT + 1, Some("1"), 200)).await;
        assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        assert!(never.never_fits, "{store}");
        assert_eq!(count(&backend, "over").await, Some(750), "{store}");

        // An answer that does not count: the whole estimate handed back,
        // its use not charged.
        let failed = send(&service, call("over", 200, Some("120"), 500)).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        // Its headers show the budget with the estimate handed back.
        assert_eq!(failed.left, Some(LIMIT - 750), "{store}");
        settled(&backend, "over", 750, store).await;
    }

    /// A denial because an estimate does not fit shows what is truly left
    /// (the store's count as it stands, nothing spent), with a
    /// `Retry-After` to the window's end, when a new window has room for
    /// it; an estimate above the limit is denied without a `Retry-After`
    /// (no wait brings room for it) and shows what is left too: all of it
    /// on a fresh key. At the limit nothing is left, also when the deny
    /// cache answers.
    pub async fn denials_by_cost_show_what_is_left<Bk: Spending>(backend: Bk, store: &str) {
        let service = limited(backend.clone());
        let never = send(&service, call("fresh", 5 * LIMIT, Some("1"), 200)).await;
        assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        assert!(never.never_fits, "{store}");
        assert_eq!(never.left, Some(LIMIT), "{store}: all of it is free");
        assert_eq!(never.retry_after, None, "{store}: no wait helps");
        assert_eq!(count(&backend, "fresh").await, None, "{store}");

        for left in [700, 400, 100] {
            let seen = send(&service, call("cost", ESTIMATE, Some("300"), 200)).await;
            assert_eq!(seen.left, Some(left), "{store}");
        }
        settled(&backend, "cost", 900, store).await;
        let denied = send(&service, call("cost", ESTIMATE, Some("300"), 200)).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{store}");
        assert_eq!(denied.left, Some(100), "{store}: 100 remain");
        assert!(!denied.never_fits, "{store}");
        let retry = denied.retry_after.expect("a new window has room");
        assert!((1..=60).contains(&retry), "{store}: Retry-After {retry}");
        let never = send(&service, call("cost", 5 * LIMIT, Some("1"), 200)).await;
        assert_eq!(
            (
                never.status,
                never.left,
                never.retry_after,
                never.never_fits
            ),
            (StatusCode::TOO_MANY_REQUESTS, Some(100), None, true),
            "{store}"
        );
        assert_eq!(count(&backend, "cost").await, Some(900), "{store}");

        let last = send(&service, call("cost", 100, Some("100"), 200)).await;
        assert_eq!(
            (last.status, last.left),
            (StatusCode::OK, Some(0)),
            "{store}"
        );
        settled(&backend, "cost", LIMIT, store).await;
        // At the limit the store remembers the key in the deny cache: the
        // second answer may come from there.
        for asked in ["first", "again"] {
            let full = send(&service, call("cost", ESTIMATE, Some("300"), 200)).await;
            assert_eq!(
                (full.status, full.left),
                (StatusCode::TOO_MANY_REQUESTS, Some(0)),
                "{store}, asked {asked}"
            );
            assert!(full.retry_after.is_some(), "{store}, asked {asked}");
        }
        let never = send(&service, call("cost", 5 * LIMIT, Some("1"), 200)).await;
        assert_eq!(
            (never.left, never.retry_after, never.never_fits),
            (Some(0), None, true),
            "{store}"
        );
    }

    /// A use the charge cannot read (absent, or not a number) settles
    /// nothing: the reservation stays spent. The warning is logged once.
    /// On a current-thread runtime, so the capture sees the layer's lines.
    pub async fn an_unreadable_use_keeps_the_reservation_and_logs_once<Bk: Spending>(
        backend: Bk,
        store: &str,
    ) {
        let service = limited(backend.clone());
        let capture = Capture::start(LevelFilter::WARN);
        let seen = send(&service, call("unread", ESTIMATE, None, 200)).await;
        assert_eq!(seen.status, StatusCode::OK, "{store}");
        let seen = send(&service, call("unread", ESTIMATE, Some("lots"), 200)).await;
        assert_eq!(seen.status, StatusCode::OK, "{store}");
        // A readable one after them still settles.
        send(&service, call("unread", ESTIMATE, Some("100"), 200)).await;
        settled(&backend, "unread", 2 * ESTIMATE + 100, store).await;
        let lines = capture.lines();
        let unreadable = lines.iter().filter(|l| l.contains(UNREADABLE)).count();
        assert_eq!(unreadable, 1, "{store}: {lines:#?}");
        assert!(lines.iter().any(|l| l.contains("WARN")), "{lines:#?}");
    }
}

async fn concurrent_on_memory() {
    cases::concurrent_reservations_never_pass_the_budget(MemoryBackend::new(), "memory").await;
}

async fn settles_on_memory() {
    cases::settles_refund_and_charge_in_the_window(MemoryBackend::new(), "memory").await;
}

async fn denials_by_cost_on_memory() {
    cases::denials_by_cost_show_what_is_left(MemoryBackend::new(), "memory").await;
}

async fn unreadable_on_memory() {
    cases::an_unreadable_use_keeps_the_reservation_and_logs_once(MemoryBackend::new(), "memory")
        .await;
}

/// `reserve` without a `charge`, or beside a `cost`, is refused in
/// `check`, whatever the order; `Layer::layer` panics with the same error.
fn bad_builder_input_is_refused_by_check() {
    let layer = || RateLimitLayer::new("tokens", quota(LIMIT));
    assert_eq!(
        layer().reserve(estimate).check(),
        Err(ConfigError::ReserveWithoutCharge)
    );
    for refused in [
        layer().reserve(estimate).charge(usage).cost(1).check(),
        layer().cost(1).reserve(estimate).charge(usage).check(),
        layer()
            .charge(usage)
            .cost_fn(estimate)
            .reserve(estimate)
            .check(),
        layer()
            .reserve(estimate)
            .cost_fn(estimate)
            .charge(usage)
            .check(),
    ] {
        assert_eq!(refused, Err(ConfigError::ReserveWithCost));
    }
    assert_eq!(layer().charge(usage).reserve(estimate).check(), Ok(()));
    assert_eq!(layer().reserve(estimate).charge(usage).check(), Ok(()));
    let built = std::panic::catch_unwind(|| layer().reserve(estimate).layer(Provider))
        .map(drop)
        .expect_err("a reservation nothing settles does not build");
    let message = built.downcast_ref::<String>().unwrap();
    assert_eq!(message, &ConfigError::ReserveWithoutCharge.to_string());
    assert!(message.contains("needs a charge"), "{message}");
}

/// `.charge(..).reserve(..)` and `.reserve(..).charge(..)` are one layer:
/// the same answers and the same counts for the same calls.
async fn the_order_of_reserve_and_charge_does_not_matter() {
    async fn run<S>(service: S, backend: MemoryBackend) -> (Vec<Seen>, Option<u64>)
    where
        S: Service<Request<String>, Response = Response<Metered<String>>, Error = Infallible>
            + Clone,
    {
        let mut seen = Vec::new();
        for used in ["120", "450", "300", "10", "300", "300"] {
            seen.push(send(&service, call("k", ESTIMATE, Some(used), 200)).await);
        }
        (seen, count(&backend, "k").await)
    }
    let layer = |backend: &MemoryBackend| {
        RateLimitLayer::new("tokens", quota(LIMIT))
            .key(HeaderName::from_static("x-api-key"))
            .backend(backend.clone())
    };
    let (first, second) = (MemoryBackend::new(), MemoryBackend::new());
    let charge_first = layer(&first)
        .charge(usage)
        .reserve(estimate)
        .layer(Provider);
    let reserve_first = layer(&second)
        .reserve(estimate)
        .charge(usage)
        .layer(Provider);
    let (a, a_count) = run(charge_first, first).await;
    let (b, b_count) = run(reserve_first, second).await;
    assert_eq!(a, b);
    assert_eq!(a_count, b_count);
    // Reserved, then settled: 120 + 450 + 300 spent; the next estimate
    // does not fit beside them.
    assert_eq!(a_count, Some(120 + 450 + 300));
    assert_eq!(
        a.iter()
            .map(|seen| seen.status.as_u16())
            .collect::<Vec<_>>(),
        [200, 200, 200, 429, 429, 429],
        "{a:#?}"
    );
}

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use support::redis::RedisServer;
    use tower_pinned_window_redis::{DEFAULT_DENY_CACHE_RECHECK, RedisBackend};

    async fn backend(server: &RedisServer) -> RedisBackend<redis::aio::ConnectionManager> {
        let manager = server.client().get_connection_manager().await.unwrap();
        RedisBackend::builder(manager).prefix("reserve").build()
    }

    pub async fn concurrent() {
        let server = redis_or_skip!(RedisServer::start("reserve_concurrent"));
        cases::concurrent_reservations_never_pass_the_budget(backend(&server).await, "Redis").await;
    }

    pub async fn settles() {
        let server = redis_or_skip!(RedisServer::start("reserve_settles"));
        cases::settles_refund_and_charge_in_the_window(backend(&server).await, "Redis").await;
    }

    pub async fn freed_across_instances() {
        let server = redis_or_skip!(RedisServer::start("reserve_freed_across_instances"));
        let (a, b) = (backend(&server).await, backend(&server).await);
        cases::a_settle_on_one_instance_frees_the_budget_on_another(
            a,
            b,
            DEFAULT_DENY_CACHE_RECHECK,
            "Redis",
        )
        .await;
    }

    pub async fn plain_stays_local() {
        let server = redis_or_skip!(RedisServer::start("reserve_plain_stays_local"));
        let (a, b) = (backend(&server).await, backend(&server).await);
        let calls = std::sync::atomic::AtomicU64::new(0);
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        cases::a_plain_routes_denial_stays_local_past_the_bound(
            a,
            b,
            DEFAULT_DENY_CACHE_RECHECK,
            "Redis",
            async || calls.store(server.script_calls(), relaxed),
        )
        .await;
        // The peek after B's denials is the one script call since.
        let since = server.script_calls() - calls.load(relaxed);
        assert_eq!(since, 1, "no hit of B's reached Redis");
    }

    pub async fn denials_by_cost() {
        let server = redis_or_skip!(RedisServer::start("reserve_denials_by_cost"));
        cases::denials_by_cost_show_what_is_left(backend(&server).await, "Redis").await;
    }

    #[cfg(feature = "redis-cluster")]
    pub async fn denials_by_cost_on_a_cluster() {
        use support::redis::RedisCluster;
        let cluster = redis_or_skip!(RedisCluster::start("reserve_denials_by_cost_cluster"));
        let backend = RedisBackend::builder(cluster.connection().await)
            .prefix("reserve")
            .build();
        cases::denials_by_cost_show_what_is_left(backend, "Cluster").await;
    }

    #[cfg(feature = "redis-sentinel")]
    pub async fn denials_by_cost_behind_sentinel() {
        use support::redis::{SENTINEL_MASTER, SentinelGroup};
        use tower_pinned_window_redis::connection::SentinelConnection;
        let group = redis_or_skip!(SentinelGroup::start("reserve_denials_by_cost_sentinel"));
        let connection = SentinelConnection::connect(group.sentinel_urls(), SENTINEL_MASTER)
            .await
            .unwrap_or_else(|e| panic!("connect through the sentinels: {e}\n{}", group.logs()));
        let backend = RedisBackend::builder(connection).prefix("reserve").build();
        cases::denials_by_cost_show_what_is_left(backend, "Sentinel").await;
    }

    pub async fn unreadable() {
        let server = redis_or_skip!(RedisServer::start("reserve_unreadable"));
        cases::an_unreadable_use_keeps_the_reservation_and_logs_once(
            backend(&server).await,
            "Redis",
        )
        .await;
    }
}

#[cfg(feature = "postgres")]
mod on_postgres {
    use super::*;
    use support::postgres::TestSchema;
    use tower_pinned_window_postgres::DEFAULT_DENY_CACHE_RECHECK;

    pub async fn concurrent() {
        let schema = pg_or_skip!(TestSchema::create("reserve_concurrent").await);
        let backend = schema.backend().await;
        cases::concurrent_reservations_never_pass_the_budget(backend, "PostgreSQL").await;
    }

    pub async fn settles() {
        let schema = pg_or_skip!(TestSchema::create("reserve_settles").await);
        let backend = schema.backend().await;
        cases::settles_refund_and_charge_in_the_window(backend, "PostgreSQL").await;
    }

    pub async fn freed_across_instances() {
        let schema = pg_or_skip!(TestSchema::create("reserve_freed").await);
        let (a, b) = (schema.backend().await, schema.backend().await);
        cases::a_settle_on_one_instance_frees_the_budget_on_another(
            a,
            b,
            DEFAULT_DENY_CACHE_RECHECK,
            "PostgreSQL",
        )
        .await;
    }

    pub async fn plain_stays_local() {
        let schema = pg_or_skip!(TestSchema::create("reserve_plain_local").await);
        let (a, b) = (schema.backend().await, schema.backend().await);
        cases::a_plain_routes_denial_stays_local_past_the_bound(
            a,
            b,
            DEFAULT_DENY_CACHE_RECHECK,
            "PostgreSQL",
            async || {},
        )
        .await;
    }

    pub async fn denials_by_cost() {
        let schema = pg_or_skip!(TestSchema::create("reserve_denials_by_cost").await);
        let backend = schema.backend().await;
        cases::denials_by_cost_show_what_is_left(backend, "PostgreSQL").await;
    }

    pub async fn unreadable() {
        let schema = pg_or_skip!(TestSchema::create("reserve_unreadable").await);
        let backend = schema.backend().await;
        cases::an_unreadable_use_keeps_the_reservation_and_logs_once(backend, "PostgreSQL").await;
    }
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test
/// whose server is missing is reported as ignored.
fn main() {
    #[allow(unused_mut)]
    let mut trials = vec![
        trial::multi(
            "memory::concurrent_reservations_never_pass_the_budget",
            Needs::Nothing,
            concurrent_on_memory,
        ),
        trial::current(
            "memory::settles_refund_and_charge_in_the_window",
            Needs::Nothing,
            settles_on_memory,
        ),
        trial::current(
            "memory::denials_by_cost_show_what_is_left",
            Needs::Nothing,
            denials_by_cost_on_memory,
        ),
        trial::current(
            "memory::an_unreadable_use_keeps_the_reservation_and_logs_once",
            Needs::Nothing,
            unreadable_on_memory,
        ),
        trial::trial(
            "bad_builder_input_is_refused_by_check",
            Needs::Nothing,
            bad_builder_input_is_refused_by_check,
        ),
        trial::current(
            "the_order_of_reserve_and_charge_does_not_matter",
            Needs::Nothing,
            the_order_of_reserve_and_charge_does_not_matter,
        ),
    ];
    #[cfg(feature = "redis")]
    trials.extend([
        trial::multi(
            "redis::concurrent_reservations_never_pass_the_budget",
            Needs::Redis,
            on_redis::concurrent,
        ),
        trial::current(
            "redis::settles_refund_and_charge_in_the_window",
            Needs::Redis,
            on_redis::settles,
        ),
        trial::current(
            "redis::denials_by_cost_show_what_is_left",
            Needs::Redis,
            on_redis::denials_by_cost,
        ),
        trial::current(
            "redis::an_unreadable_use_keeps_the_reservation_and_logs_once",
            Needs::Redis,
            on_redis::unreadable,
        ),
        trial::multi(
            "redis::a_settle_on_one_instance_frees_the_budget_on_another",
            Needs::Redis,
            on_redis::freed_across_instances,
        ),
        trial::multi(
            "redis::a_plain_routes_denial_stays_local_past_the_bound",
            Needs::Redis,
            on_redis::plain_stays_local,
        ),
    ]);
    #[cfg(feature = "redis-cluster")]
    trials.push(trial::current(
        "redis_cluster::denials_by_cost_show_what_is_left",
        Needs::Redis,
        on_redis::denials_by_cost_on_a_cluster,
    ));
    #[cfg(feature = "redis-sentinel")]
    trials.push(trial::current(
        "redis_sentinel::denials_by_cost_show_what_is_left",
        Needs::Redis,
        on_redis::denials_by_cost_behind_sentinel,
    ));
    #[cfg(feature = "postgres")]
    trials.extend([
        trial::multi(
            "postgres::concurrent_reservations_never_pass_the_budget",
            Needs::Postgres,
            on_postgres::concurrent,
        ),
        trial::current(
            "postgres::settles_refund_and_charge_in_the_window",
            Needs::Postgres,
            on_postgres::settles,
        ),
        trial::current(
            "postgres::denials_by_cost_show_what_is_left",
            Needs::Postgres,
            on_postgres::denials_by_cost,
        ),
        trial::current(
            "postgres::an_unreadable_use_keeps_the_reservation_and_logs_once",
            Needs::Postgres,
            on_postgres::unreadable,
        ),
        trial::multi(
            "postgres::a_settle_on_one_instance_frees_the_budget_on_another",
            Needs::Postgres,
            on_postgres::freed_across_instances,
        ),
        trial::multi(
            "postgres::a_plain_routes_denial_stays_local_past_the_bound",
            Needs::Postgres,
            on_postgres::plain_stays_local,
        ),
    ]);
    trial::run(trials, ())
}
