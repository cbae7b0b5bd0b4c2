//! Skipping requests, and counting them by the service's answer: hits the
//! answer does not count are refunded in their own window, never twice,
//! never lost. Memory on tokio's paused clock; Redis and a Redis Cluster
//! through the harness (tests/support/redis.rs); the race and the killed
//! client on PostgreSQL too (tests/support/postgres.rs).

mod support;
#[path = "support/trial.rs"]
mod trial;

use trial::Needs;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::http::{Body, by_client, from, multi_thread_runtime};
use tokio::sync::{Notify, watch};
use tokio::time::advance;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_pinned_window::backend::{Backend, BackendError, Counter, Hit, Hits, MemoryBackend};
use tower_pinned_window::key::{Allowlist, ClientIp, Key};
use tower_pinned_window::{Decision, Quota, RateLimitLayer};

#[allow(dead_code)]
#[path = "../../examples/login.rs"]
mod login;

/// How long a test waits for something that must happen before it fails
/// instead (on the paused clock, it passes as soon as nothing else can run).
const PATIENCE: Duration = Duration::from_secs(30);

fn quota(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

/// A memory backend on tokio's (paused) clock.
fn memory() -> MemoryBackend {
    MemoryBackend::new().tokio_clock()
}

/// A request from `client` that the app answers with `status`.
fn answered(client: &str, status: u16) -> Request<Body> {
    let mut request = from(client);
    request
        .headers_mut()
        .insert("x-status", status.to_string().parse().unwrap());
    request
}

/// [`answered`], after the app has waited `wait` on tokio's clock.
fn answered_after(client: &str, status: u16, wait: Duration) -> Request<Body> {
    let mut request = answered(client, status);
    request
        .headers_mut()
        .insert("x-wait-ms", wait.as_millis().to_string().parse().unwrap());
    request
}

/// [`answered`], once the app's gate is open (never, if it stays shut).
fn answered_when_released(client: &str, status: u16) -> Request<Body> {
    let mut request = answered(client, status);
    request.headers_mut().insert("x-hold", "1".parse().unwrap());
    request
}

/// The service behind the layer: answers with the status in `x-status`
/// (200 without one), after `x-wait-ms` on tokio's clock, and for a request
/// with `x-hold` only once `release` is open. `entered` counts the requests
/// that reached it.
#[derive(Clone)]
struct App {
    entered: Arc<AtomicUsize>,
    entered_notify: Arc<Notify>,
    release: Arc<watch::Sender<bool>>,
}

impl App {
    fn new() -> Self {
        Self {
            entered: Arc::default(),
            entered_notify: Arc::default(),
            release: Arc::new(watch::channel(false).0),
        }
    }

    fn service(
        &self,
    ) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static {
        let app = self.clone();
        service_fn(move |request: Request<Body>| {
            let app = app.clone();
            async move {
                app.entered.fetch_add(1, Ordering::SeqCst);
                app.entered_notify.notify_waiters();
                let header = |name: &str| {
                    request
                        .headers()
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                };
                if let Some(ms) = header("x-wait-ms") {
                    tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
                }
                if header("x-hold").is_some() {
                    let mut open = app.release.subscribe();
                    open.wait_for(|open| *open).await.unwrap();
                }
                tokio::task::yield_now().await;
                let status = header("x-status").map_or(200, |s| s.parse().unwrap());
                let mut response = Response::new(String::new());
                *response.status_mut() = StatusCode::from_u16(status).unwrap();
                Ok::<_, Infallible>(response)
            }
        })
    }

    /// Waits until `n` requests in all have reached the service (failing,
    /// not hanging, if they never do).
    async fn wait_entered(&self, n: usize) {
        let entered = async {
            loop {
                let notified = self.entered_notify.notified();
                if self.entered.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(PATIENCE, entered)
            .await
            .unwrap_or_else(|_| panic!("{n} requests never reached the service"));
    }

    fn release(&self) {
        self.release.send_replace(true);
    }
}

async fn send<S>(svc: &S, request: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    svc.clone().oneshot(request).await.unwrap()
}

fn ratelimit(response: &Response<Body>) -> Option<&str> {
    response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap())
}

fn decision(response: &Response<Body>) -> &Decision {
    response
        .extensions()
        .get::<Decision>()
        .expect("a decision in the extensions")
}

/// The live count of `client` on the counter `namespace`, 0 for none.
async fn count<B: Backend>(backend: &B, namespace: &str, client: &str) -> u64 {
    backend
        .peek(namespace, &Key::new(client))
        .await
        .unwrap()
        .map_or(0, |hit| hit.count)
}

// --- Observing the backend ---------------------------------------------

/// What the layer asked of an [`Observed`] backend.
#[derive(Default, Debug)]
struct Log {
    /// Hits the store counted (they came back with a deadline).
    counted: AtomicU64,
    /// Refunds the layer asked for.
    issued: AtomicU64,
    /// Refunds that took a hit back.
    refunded: AtomicU64,
    /// Refunds that found nothing to take back.
    nothing: AtomicU64,
    /// Refunds that failed.
    failed: AtomicU64,
    settled: Notify,
}

impl Log {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }

    fn done(&self) -> u64 {
        Self::get(&self.refunded) + Self::get(&self.nothing) + Self::get(&self.failed)
    }

    /// Waits until `n` refunds have come back (failing, not hanging, if
    /// they never do).
    async fn wait_settled(&self, n: u64) {
        let settled = async {
            loop {
                let settled = self.settled.notified();
                if self.done() >= n {
                    return;
                }
                settled.await;
            }
        };
        tokio::time::timeout(PATIENCE, settled)
            .await
            .unwrap_or_else(|_| panic!("{n} refunds never came back: {self:?}"));
    }
}

/// A backend that records what the layer asks of `inner`, and can fail its
/// refunds or hold them back (unsent) until released.
#[derive(Clone)]
struct Observed<B> {
    inner: B,
    log: Arc<Log>,
    fail_refunds: Arc<AtomicBool>,
    /// Refunds wait for this to be open before they reach `inner`.
    refunds_open: Arc<watch::Sender<bool>>,
}

impl<B> Observed<B> {
    fn new(inner: B) -> Self {
        Self {
            inner,
            log: Arc::default(),
            fail_refunds: Arc::default(),
            refunds_open: Arc::new(watch::channel(true).0),
        }
    }

    fn hold_refunds(&self, hold: bool) {
        self.refunds_open.send_replace(!hold);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B: Backend> Backend for Observed<B> {
    type Future = BoxFuture<Result<Hits, BackendError>>;
    type Refund = BoxFuture<Result<bool, BackendError>>;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        let hit = self.inner.hit_all(key, counters);
        let log = self.log.clone();
        Box::pin(async move {
            let hits = hit.await?;
            let counted = hits.iter().filter(|h| h.deadline.is_some()).count();
            log.counted.fetch_add(counted as u64, Ordering::SeqCst);
            Ok(hits)
        })
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
        self.log.issued.fetch_add(1, Ordering::SeqCst);
        let fail = self.fail_refunds.load(Ordering::SeqCst);
        // The inner refund is made (the memory backend's is taken then)
        // only once the gate is open.
        let (inner, namespace, key, hit) =
            (self.inner.clone(), namespace.to_owned(), key.clone(), *hit);
        let mut open = self.refunds_open.subscribe();
        let log = self.log.clone();
        Box::pin(async move {
            if !*open.borrow_and_update() {
                open.wait_for(|open| *open).await.unwrap();
            }
            let result = if fail {
                Err(BackendError::Unavailable("refunds are down".into()))
            } else {
                inner.refund(&namespace, &key, &hit).await
            };
            let counter = match &result {
                Ok(true) => &log.refunded,
                Ok(false) => &log.nothing,
                Err(_) => &log.failed,
            };
            counter.fetch_add(1, Ordering::SeqCst);
            log.settled.notify_waiters();
            result
        })
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        self.inner.peek(namespace, key).await
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        self.inner.reset(namespace, key).await
    }
}

// --- Skip ----------------------------------------------------------------

async fn skipped_requests_are_not_counted_and_carry_no_headers() {
    let backend = memory();
    let svc = RateLimitLayer::new("api", quota(1, 60))
        .key(by_client())
        .backend(backend.clone())
        .skip_if(|req| req.headers().contains_key("x-internal"))
        .skip_if(|req| req.uri().path() == "/health")
        .layer(App::new().service());
    let internal = || {
        let mut request = from("alice");
        request
            .headers_mut()
            .insert("x-internal", "1".parse().unwrap());
        request
    };
    for _ in 0..3 {
        let res = send(&svc, internal()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(ratelimit(&res), None, "a skipped request has no headers");
        assert!(
            res.extensions().get::<Decision>().is_none(),
            "nor a decision"
        );
    }
    let health = Request::get("/health").body(String::new()).unwrap();
    let res = send(&svc, health).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the second predicate skips too, before the key (this request has none)"
    );
    assert_eq!(count(&backend, "api", "alice").await, 0, "nothing counted");
    assert!(backend.is_empty());

    let res = send(&svc, from("alice")).await;
    assert_eq!(ratelimit(&res), Some("\"api\";r=0;t=60"));
    assert_eq!(
        send(&svc, from("alice")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&svc, internal()).await.status(),
        StatusCode::OK,
        "a skipped request passes even over the limit"
    );
    assert_eq!(count(&backend, "api", "alice").await, 2);
}

/// A request from the peer `peer`, with `X-Forwarded-For: forwarded`.
fn via(peer: &str, forwarded: Option<&str>) -> Request<Body> {
    let mut builder = Request::get("/");
    if let Some(value) = forwarded {
        builder = builder.header("x-forwarded-for", value);
    }
    let mut request = builder.body(String::new()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::new(peer.parse().unwrap(), 4711));
    request
}

async fn the_allowlist_skips_clients_directly_and_behind_a_trusted_proxy() {
    let backend = memory();
    let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
    let office = Allowlist::new(client_ip.clone())
        .allow("192.0.2.0/24")
        .unwrap();
    let svc = RateLimitLayer::new("api", quota(1, 60))
        .key(client_ip)
        .backend(backend.clone())
        .allowlist(office)
        .layer(App::new().service());
    let cases = [
        ("direct", "192.0.2.7", None),
        ("behind the trusted proxy", "10.0.0.1", Some("192.0.2.8")),
        (
            "behind two trusted hops",
            "10.0.0.1",
            Some("192.0.2.9, 10.0.0.2"),
        ),
    ];
    for (name, peer, forwarded) in cases {
        for _ in 0..3 {
            let res = send(&svc, via(peer, forwarded)).await;
            assert_eq!(res.status(), StatusCode::OK, "{name}");
            assert_eq!(ratelimit(&res), None, "{name}: skipped");
        }
    }
    assert!(backend.is_empty(), "no allowlisted client was counted");

    // Everyone else is counted, behind the proxy or not.
    let res = send(&svc, via("10.0.0.1", Some("203.0.113.9"))).await;
    assert_eq!(ratelimit(&res), Some("\"api\";r=0;t=60"));
    assert_eq!(
        send(&svc, via("10.0.0.1", Some("203.0.113.9")))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(count(&backend, "api", "203.0.113.9").await, 2);
}

async fn a_forged_forwarded_header_does_not_skip() {
    let backend = memory();
    let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
    let office = Allowlist::new(client_ip.clone())
        .allow("192.0.2.0/24")
        .unwrap();
    let svc = RateLimitLayer::new("api", quota(1, 60))
        .key(client_ip)
        .backend(backend.clone())
        .allowlist(office)
        .layer(App::new().service());
    // An untrusted peer names an allowlisted address: the header is its own
    // writing, so the peer is the client, counted and then denied.
    let forged = || via("198.51.100.4", Some("192.0.2.7"));
    assert_eq!(
        ratelimit(&send(&svc, forged()).await),
        Some("\"api\";r=0;t=60")
    );
    assert_eq!(
        send(&svc, forged()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(count(&backend, "api", "198.51.100.4").await, 2);
    // Through the trusted proxy, an allowlisted address written left of the
    // client is the client's writing too.
    let left = || via("10.0.0.1", Some("192.0.2.7, 203.0.113.5"));
    send(&svc, left()).await;
    assert_eq!(
        send(&svc, left()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(count(&backend, "api", "203.0.113.5").await, 2);
    // A malformed entry where the client should be is not skipped either:
    // the key extractor answers it (400).
    let malformed = via("10.0.0.1", Some("192.0.2.7, bogus"));
    assert_eq!(
        send(&svc, malformed).await.status(),
        StatusCode::BAD_REQUEST
    );
}

// --- Count by outcome: memory ------------------------------------------

async fn only_answers_that_count_are_kept_and_denials_are_refunded() {
    let backend = memory();
    let svc = RateLimitLayer::new("login", quota(3, 900))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_auth_failure())
        .layer(App::new().service());
    for _ in 0..5 {
        let res = send(&svc, answered("alice", 200)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            ratelimit(&res),
            Some("\"login\";r=3;t=900"),
            "the refunded hit is not in the headers"
        );
        let d = decision(&res);
        assert!(d.refunded());
        assert_eq!((d.count(), d.remaining()), (0, 3));
    }
    assert_eq!(count(&backend, "login", "alice").await, 0, "all refunded");
    for remaining in [2, 1, 0] {
        let res = send(&svc, answered("alice", 401)).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            ratelimit(&res).unwrap(),
            format!("\"login\";r={remaining};t=900")
        );
        assert!(!decision(&res).refunded());
    }
    // Over the limit, the right answer is denied too; a denial was never
    // served, so it is refunded.
    for status in [200, 401, 200] {
        let res = send(&svc, answered("alice", status)).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "900");
        assert_eq!(ratelimit(&res), Some("\"login\";r=0;t=900"));
        let d = decision(&res);
        assert_eq!(
            ((d.passed(), d.over_limit()), d.refunded(), d.count()),
            ((false, true), true, 3)
        );
    }
    assert_eq!(
        count(&backend, "login", "alice").await,
        3,
        "the three failures"
    );
    assert_eq!(
        send(&svc, answered("bob", 200)).await.status(),
        StatusCode::OK,
        "another client has its own budget"
    );
    // The window is pinned to the first hit (a refunded one): it closes 15
    // minutes after it.
    advance(Duration::from_secs(900)).await;
    assert_eq!(
        ratelimit(&send(&svc, answered("alice", 401)).await),
        Some("\"login\";r=2;t=900"),
        "a fresh window"
    );
}

async fn parallel_successes_never_lock_a_client_out() {
    // While requests are in flight they hold their hits, so a burst past the
    // limit is denied; once the answers are in, nothing is left counted.
    let backend = memory();
    let app = App::new();
    let svc = RateLimitLayer::new("burst", quota(5, 60))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(app.service());
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, answered_when_released("alice", 200)).await })
        })
        .collect();
    app.wait_entered(5).await;
    app.release();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap().status().as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429]);
    assert_eq!(
        count(&backend, "burst", "alice").await,
        0,
        "no failure, nothing counted"
    );
    assert_eq!(
        ratelimit(&send(&svc, answered("alice", 500)).await),
        Some("\"burst\";r=4;t=60"),
        "the whole budget is there for failures"
    );
}

async fn count_if_reads_status_and_headers_and_refunds_every_quota() {
    let backend = memory();
    let svc = RateLimitLayer::new("api", quota(2, 60))
        .also(quota(3, 3600))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.status().is_server_error() || res.headers().contains_key("x-charge"))
        .layer(service_fn(|request: Request<Body>| async move {
            let mut response = Response::new(String::new());
            if request.headers().contains_key("x-charge") {
                response
                    .headers_mut()
                    .insert("x-charge", "1".parse().unwrap());
            }
            Ok::<_, Infallible>(response)
        }));
    let charged = || {
        let mut request = from("alice");
        request
            .headers_mut()
            .insert("x-charge", "1".parse().unwrap());
        request
    };
    for _ in 0..4 {
        assert!(decision(&send(&svc, from("alice")).await).refunded());
    }
    assert_eq!(count(&backend, "api", "alice").await, 0);
    assert_eq!(
        count(&backend, "api:3/3600000ms", "alice").await,
        0,
        "every quota"
    );
    assert!(!decision(&send(&svc, charged()).await).refunded());
    assert!(!decision(&send(&svc, charged()).await).refunded());
    assert_eq!(count(&backend, "api", "alice").await, 2);
    assert_eq!(count(&backend, "api:3/3600000ms", "alice").await, 2);
    assert_eq!(
        send(&svc, from("alice")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

async fn shadowed_requests_are_judged_by_their_answer_too() {
    let backend = memory();
    let svc = RateLimitLayer::new("shadow", quota(1, 60))
        .key(by_client())
        .backend(backend.clone())
        .shadow(true)
        .count_if(|res| res.is_failure())
        .layer(App::new().service());
    send(&svc, answered("alice", 500)).await;
    let res = send(&svc, answered("alice", 200)).await;
    assert_eq!(res.status(), StatusCode::OK);
    let d = decision(&res);
    assert_eq!(
        ((d.passed(), d.over_limit()), d.refunded(), d.count()),
        ((true, true), true, 1)
    );
    assert_eq!(count(&backend, "shadow", "alice").await, 1);
}

async fn a_refund_after_the_window_closed_leaves_no_counter() {
    let backend = memory();
    let svc = RateLimitLayer::new("late", quota(5, 10))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(App::new().service());
    // Hit at 0 s, answered at 11 s: the window closed at 10 s.
    let res = send(&svc, answered_after("alice", 200, Duration::from_secs(11))).await;
    assert!(decision(&res).refunded(), "the refund was issued");
    assert_eq!(
        backend.peek("late", &Key::new("alice")).await.unwrap(),
        None,
        "no live counter"
    );
    assert_eq!(
        backend.len(),
        1,
        "no counter was made: only the expired one"
    );
    assert_eq!(
        ratelimit(&send(&svc, answered("alice", 401)).await),
        Some("\"late\";r=4;t=10"),
        "the next hit opens a full window"
    );
}

async fn a_refund_racing_a_new_window_never_touches_it() {
    let backend = memory();
    let app = App::new();
    let svc = RateLimitLayer::new("race", quota(5, 10))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(app.service());
    // A is hit at 0 s and answered (200, refunded) at 11 s.
    let slow = {
        let svc = svc.clone();
        tokio::spawn(async move {
            send(&svc, answered_after("alice", 200, Duration::from_secs(11))).await
        })
    };
    app.wait_entered(1).await;
    advance(Duration::from_millis(10_500)).await;
    // B opens a new window at 10.5 s and is kept.
    let res = send(&svc, answered("alice", 401)).await;
    assert_eq!(ratelimit(&res), Some("\"race\";r=4;t=10"));
    let before = backend
        .peek("race", &Key::new("alice"))
        .await
        .unwrap()
        .unwrap();
    // A's answer comes at 11 s: its refund names the old window.
    let res = slow.await.unwrap();
    assert!(decision(&res).refunded());
    let after = backend
        .peek("race", &Key::new("alice"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.count, 1, "B's hit is still counted");
    assert_eq!(after.deadline, before.deadline, "B's window is unchanged");
    assert_eq!(after.reset, Duration::from_millis(9_500));
}

fn concurrent_hits_and_refunds_never_keep_more_than_the_limit_in_memory() {
    multi_thread_runtime().block_on(async {
        let limit = 20;
        let backend = MemoryBackend::new();
        let svc = RateLimitLayer::new("race", quota(limit, 3600))
            .key(by_client())
            .backend(backend.clone())
            .count_if(|res| res.is_auth_failure())
            .layer(App::new().service());
        let figures = race(&[svc], 16, 64).await;
        let counter = count(&backend, "race", "shared").await;
        figures.check(limit, counter, "memory");
    });
}

/// What a race of hits and refunds came to.
#[derive(Debug, Default)]
struct Figures {
    /// Admitted and answered 401: counted and kept.
    kept: u64,
    /// Admitted and answered 200: refunded.
    refunded: u64,
    denied: u64,
}

impl Figures {
    /// No more than `limit` admitted requests were kept, and every other
    /// hit (answered 200, or denied) came back: the counter holds exactly
    /// the kept hits.
    fn check(&self, limit: u64, counter: u64, what: &str) {
        eprintln!(
            "refund race ({what}): {} admitted and kept (limit {limit}), {} admitted and refunded, {} denied; counter {counter}",
            self.kept, self.refunded, self.denied
        );
        assert!(
            self.kept <= limit,
            "{what}: {} kept past the limit of {limit}",
            self.kept
        );
        assert!(self.kept > 0 && self.refunded > 0, "{what}: {self:?}");
        assert_eq!(counter, self.kept, "{what}: {self:?}");
    }
}

/// `workers` tasks at once, each on its own service of `services` (round
/// robin), each sending `per_worker` requests from one client in turn, so
/// that hits and refunds interleave; every third request is answered 401
/// (counted), the others 200 (refunded).
async fn race<S>(services: &[S], workers: usize, per_worker: usize) -> Figures
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let tasks: Vec<_> = (0..workers)
        .map(|worker| {
            let svc = services[worker % services.len()].clone();
            tokio::spawn(async move {
                let mut figures = Figures::default();
                for i in 0..per_worker {
                    let status = if (worker + i) % 3 == 0 { 401 } else { 200 };
                    let res = svc
                        .clone()
                        .oneshot(answered("shared", status))
                        .await
                        .unwrap();
                    match res.status() {
                        StatusCode::UNAUTHORIZED => figures.kept += 1,
                        StatusCode::OK => {
                            assert!(decision(&res).refunded());
                            figures.refunded += 1;
                        }
                        StatusCode::TOO_MANY_REQUESTS => figures.denied += 1,
                        other => panic!("unexpected {other}"),
                    }
                }
                figures
            })
        })
        .collect();
    let mut figures = Figures::default();
    for task in tasks {
        let part = task.await.unwrap();
        figures.kept += part.kept;
        figures.refunded += part.refunded;
        figures.denied += part.denied;
    }
    figures
}

async fn a_dropped_response_future_leaves_the_hit_counted() {
    let backend = Observed::new(memory());
    let app = App::new();
    let svc = RateLimitLayer::new("drop", quota(5, 60))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(app.service());
    // The client goes away while the service works on an answer that would
    // not have counted.
    let mut pending = svc.clone();
    let mut future = Box::pin(
        pending
            .ready()
            .await
            .unwrap()
            .call(answered_when_released("alice", 200)),
    );
    assert!(poll_once(&mut future).is_pending());
    assert_eq!(
        app.entered.load(Ordering::SeqCst),
        1,
        "the service was called"
    );
    drop(future);
    // So does one whose task is aborted mid-answer.
    let task = {
        let svc = svc.clone();
        tokio::spawn(async move { send(&svc, answered_when_released("alice", 200)).await })
    };
    app.wait_entered(2).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    app.release();
    tokio::task::yield_now().await;
    assert_eq!(count(&backend, "drop", "alice").await, 2, "both hits stay");
    assert_eq!(Log::get(&backend.log.issued), 0, "nothing was refunded");
    // The next one, answered, is refunded as usual, once.
    let res = send(&svc, answered("alice", 200)).await;
    assert!(decision(&res).refunded());
    assert_eq!(count(&backend, "drop", "alice").await, 2);
    assert_eq!(Log::get(&backend.log.issued), 1);
}

async fn a_service_error_is_no_answer_and_keeps_the_hit() {
    let backend = memory();
    let svc = RateLimitLayer::new("err", quota(5, 60))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(service_fn(|_: Request<Body>| async {
            Err::<Response<Body>, _>("the service failed")
        }));
    for _ in 0..2 {
        let err = svc.clone().oneshot(from("alice")).await.unwrap_err();
        assert_eq!(err, "the service failed");
    }
    assert_eq!(count(&backend, "err", "alice").await, 2);
}

async fn a_failed_refund_leaves_the_hit_counted() {
    let backend = Observed::new(memory());
    backend.fail_refunds.store(true, Ordering::SeqCst);
    let svc = RateLimitLayer::new("fail", quota(2, 60))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(App::new().service());
    for _ in 0..2 {
        let res = send(&svc, answered("alice", 200)).await;
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "the client is served all the same"
        );
    }
    backend.log.wait_settled(2).await;
    assert_eq!(Log::get(&backend.log.failed), 2);
    assert_eq!(
        count(&backend, "fail", "alice").await,
        2,
        "both stay counted"
    );
    assert_eq!(
        send(&svc, answered("alice", 200)).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "and are not retried"
    );
    backend.log.wait_settled(3).await;
    assert_eq!(
        Log::get(&backend.log.issued),
        3,
        "one refund per hit, the denial's included, none retried"
    );
    assert_eq!(count(&backend, "fail", "alice").await, 3);
}

async fn the_client_does_not_wait_for_a_refund_that_has_to_go_out() {
    let backend = Observed::new(memory());
    backend.hold_refunds(true);
    let svc = RateLimitLayer::new("bg", quota(2, 60))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(App::new().service());
    let res = send(&svc, answered("alice", 200)).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "answered while the refund waits"
    );
    assert!(decision(&res).refunded());
    assert_eq!((Log::get(&backend.log.issued), backend.log.done()), (1, 0));
    assert_eq!(
        count(&backend, "bg", "alice").await,
        1,
        "not taken back yet"
    );
    backend.hold_refunds(false);
    backend.log.wait_settled(1).await;
    assert_eq!(Log::get(&backend.log.refunded), 1, "finished on a task");
    assert_eq!(count(&backend, "bg", "alice").await, 0);
}

fn outside_a_tokio_runtime_the_response_waits_for_its_refund() {
    let backend = Observed::new(MemoryBackend::new());
    backend.hold_refunds(true);
    let svc = RateLimitLayer::new("plain", quota(2, 60))
        .key(by_client())
        .backend(backend.clone())
        .count_if(|res| res.is_failure())
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let client = std::thread::spawn({
        let log = backend.log.clone();
        move || {
            let res = block_on(svc.oneshot(from("alice"))).unwrap();
            // The refund had come back before the answer did.
            done_tx.send(log.done()).unwrap();
            res
        }
    });
    let deadline = std::time::Instant::now() + PATIENCE;
    while Log::get(&backend.log.issued) == 0 {
        assert!(std::time::Instant::now() < deadline, "no refund was issued");
        std::thread::yield_now();
    }
    assert!(
        done_rx.try_recv().is_err(),
        "the answer waits while the refund is held"
    );
    backend.hold_refunds(false);
    assert_eq!(done_rx.recv().unwrap(), 1);
    let res = client.join().unwrap();
    assert!(decision(&res).refunded());
    assert_eq!(Log::get(&backend.log.refunded), 1);
}

/// Polls `future` once.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Runs `future` on this thread, with no runtime.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

// --- examples/login.rs --------------------------------------------------

async fn the_login_example_limits_failures_never_counts_successes_and_locks_out() {
    let app = login::app(memory());
    let attempt = |from: [u8; 4], password: &str| {
        let body = format!(r#"{{"username": "alice", "password": "{password}"}}"#);
        let mut request = Request::post("/login")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::from((from, 4711))));
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap() }
    };
    let alice = [192, 0, 2, 7];
    for _ in 0..10 {
        let res = attempt(alice, "hunter2").await;
        assert_eq!(res.status(), StatusCode::OK, "successes are never counted");
    }
    for remaining in (0..5).rev() {
        let res = attempt(alice, "guess").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"login\";r={remaining};t=900").as_str()
        );
    }
    advance(Duration::from_secs(60)).await;
    // The 6th attempt locks the address out for an hour, from now: even the
    // right password waits.
    let locked = |res: &axum::response::Response, retry: u64| {
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], retry.to_string().as_str());
        assert_eq!(
            res.headers()["ratelimit"],
            format!("\"login\";r=0;t={retry}").as_str()
        );
    };
    for password in ["hunter2", "guess"] {
        locked(&attempt(alice, password).await, 3600);
    }
    assert_eq!(
        attempt([198, 51, 100, 1], "hunter2").await.status(),
        StatusCode::OK,
        "another address has its own budget"
    );
    // Pinned: more attempts never extend it, and it outlasts the window.
    advance(Duration::from_secs(60)).await;
    locked(&attempt(alice, "hunter2").await, 3540);
    advance(Duration::from_secs(900)).await;
    locked(&attempt(alice, "hunter2").await, 2640);
    advance(Duration::from_secs(2640)).await;
    assert_eq!(attempt(alice, "hunter2").await.status(), StatusCode::OK);
    let res = attempt(alice, "guess").await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["ratelimit"], "\"login\";r=4;t=900");
}

// --- Backend-generic cases: Redis, Redis Cluster, PostgreSQL ----------

#[cfg(any(feature = "redis", feature = "postgres"))]
mod cases {
    use super::*;

    pub type ObservedLayer<B> = RateLimitLayer<http::HeaderName, Observed<B>>;

    /// The layer under test: `limit` failed logins per `window` per client,
    /// counted in `backend`, observed.
    pub fn observed<B: Backend>(
        backend: B,
        limit: u64,
        window: Duration,
    ) -> (ObservedLayer<B>, Observed<B>) {
        let backend = Observed::new(backend);
        let layer = RateLimitLayer::new("login", Quota::new(limit, window).unwrap())
            .key(by_client())
            .backend(backend.clone())
            .count_if(|res| res.is_auth_failure())
            // Real servers on a busy machine: no answer here may turn into
            // an outage because the machine is slow (timeouts have tests of
            // their own).
            .timeout(tower_pinned_window::Window::new(Duration::from_secs(10)).unwrap());
        (layer, backend)
    }

    /// Eight instances, each with its own backend (and deny cache, for
    /// Redis), race hits and refunds on one key: never more than `limit`
    /// admitted hits kept, and the counter ends holding exactly what was
    /// counted and not refunded: the kept hits.
    pub async fn concurrent_hits_and_refunds_keep_at_most_the_limit<B: Backend>(
        backends: Vec<B>,
        what: &str,
    ) {
        let limit = 20;
        let app = App::new();
        let instances: Vec<_> = backends
            .into_iter()
            .map(|backend| observed(backend, limit, Duration::from_secs(600)))
            .collect();
        let services: Vec<_> = instances
            .iter()
            .map(|(layer, _)| layer.clone().layer(app.service()))
            .collect();
        let figures = race(&services, 16, 40).await;
        let (mut counted, mut issued) = (0, 0);
        for (_, backend) in &instances {
            let log = &backend.log;
            log.wait_settled(Log::get(&log.issued)).await;
            counted += Log::get(&log.counted);
            issued += Log::get(&log.issued);
            assert_eq!(Log::get(&log.failed) + Log::get(&log.nothing), 0, "{log:?}");
        }
        // Every hit the store counted, but the kept ones, was refunded: the
        // refunded answers and the denials it counted (those a deny cache
        // answered were never counted).
        let counted_denials = counted - figures.kept - figures.refunded;
        assert_eq!(
            issued,
            figures.refunded + counted_denials,
            "one refund per hit not kept"
        );
        let counter = count(&instances[0].1, "login", "shared").await;
        let what = format!(
            "{what}; {counted_denials} denials counted in the store and refunded, the rest answered by the deny cache"
        );
        assert_eq!(counter, counted - issued, "counted hits, less the refunds");
        figures.check(limit, counter, &what);
    }

    /// The client side dies between hits and refunds: its runtime is dropped
    /// while some requests are still being served and some answered requests'
    /// refunds have not gone out. Every one of those hits stays counted, and
    /// nothing is refunded twice: what the next process sees is exactly the
    /// kept hits plus the interrupted ones. `connect` makes a backend on the
    /// runtime it is called on.
    pub fn a_process_killed_between_hit_and_refund_leaves_the_hits_counted<B, F, Fut>(
        connect: F,
        what: &str,
    ) where
        B: Backend,
        F: Fn() -> Fut + Clone + Send + 'static,
        Fut: Future<Output = B> + Send,
    {
        let (kept, refunded, in_service, unsent) = (4, 4, 3, 3);
        let doomed = multi_thread_runtime();
        doomed.block_on({
            let connect = connect.clone();
            async move {
                let (layer, backend) = observed(connect().await, 100, Duration::from_secs(600));
                let app = App::new();
                let svc = layer.layer(app.service());
                for status in [401; 4].into_iter().chain([200; 4]) {
                    send(&svc, answered("alice", status)).await;
                }
                backend.log.wait_settled(refunded).await;
                assert_eq!(Log::get(&backend.log.refunded), refunded);
                // Requests the service is still working on.
                for _ in 0..in_service {
                    let svc = svc.clone();
                    tokio::spawn(
                        async move { send(&svc, answered_when_released("alice", 200)).await },
                    );
                }
                app.wait_entered((kept + refunded + in_service) as usize)
                    .await;
                // Answered requests whose refunds have not gone out.
                backend.hold_refunds(true);
                for _ in 0..unsent {
                    let res = send(&svc, answered("alice", 200)).await;
                    assert!(decision(&res).refunded());
                }
                assert_eq!(Log::get(&backend.log.issued), refunded + unsent);
                assert_eq!(backend.log.done(), refunded);
            }
        });
        // The kill: every task of that runtime (connections included) is
        // dropped where it stands.
        drop(doomed);
        let next = multi_thread_runtime();
        next.block_on(async move {
            let backend = connect().await;
            let left = count(&backend, "login", "alice").await;
            eprintln!(
                "killed between hit and refund ({what}): {kept} kept + {in_service} in service + {unsent} answered with refunds unsent = {left} left counted, {refunded} refunded before the kill"
            );
            assert_eq!(left, kept + in_service + unsent);
            // The next process goes on from there; each of its refunds takes
            // back its own hit and no other.
            let (layer, observed_backend) = observed(backend.clone(), 100, Duration::from_secs(600));
            let svc = layer.layer(App::new().service());
            send(&svc, answered("alice", 200)).await;
            send(&svc, answered("alice", 401)).await;
            observed_backend.log.wait_settled(1).await;
            assert_eq!(count(&backend, "login", "alice").await, left + 1);
        });
    }
}

// --- Redis and Redis Cluster -------------------------------------------

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use redis::aio::ConnectionLike;
    use support::redis::RedisServer;
    use tower_pinned_window_redis::RedisBackend;

    /// A Redis backend under `prefix`.
    fn redis_backend<C>(con: C, prefix: &str, deny_cache: usize) -> RedisBackend<C>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RedisBackend::builder(con)
            .prefix(prefix)
            .deny_cache(deny_cache)
            .build()
    }

    /// [`cases::observed`] on a Redis backend under `prefix`, without a deny
    /// cache.
    fn observed_layer<C>(
        con: C,
        prefix: &str,
        window: Duration,
    ) -> (
        cases::ObservedLayer<RedisBackend<C>>,
        Observed<RedisBackend<C>>,
    )
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        cases::observed(redis_backend(con, prefix, 0), 5, window)
    }

    async fn get<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> Option<i64> {
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut con.clone())
            .await
            .unwrap()
    }

    async fn exists<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> bool {
        let n: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut con.clone())
            .await
            .unwrap();
        n == 1
    }

    async fn expiry<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut con.clone())
            .await
            .unwrap()
    }

    /// Waits (polling Redis) until `key`'s window has closed.
    async fn wait_expired<C: ConnectionLike + Clone>(con: &C, key: &[u8]) {
        let expired = async {
            while exists(con, key).await {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, expired)
            .await
            .expect("the window never closed");
    }

    /// A refund that lands after the hit's window closed finds nothing and
    /// creates nothing: no key, no lifetime.
    pub async fn a_late_refund_leaves_no_key<C>(con: C, prefix: &str)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let (layer, backend) = observed_layer(con.clone(), prefix, Duration::from_millis(200));
        let app = App::new();
        let svc = layer.layer(app.service());
        let stored = backend.inner.storage_key("login", &Key::new("alice"));
        let slow = tokio::spawn({
            let svc = svc.clone();
            async move { send(&svc, answered_when_released("alice", 200)).await }
        });
        app.wait_entered(1).await;
        assert_eq!(get(&con, &stored).await, Some(1), "the hit is counted");
        wait_expired(&con, &stored).await;
        app.release();
        assert!(decision(&slow.await.unwrap()).refunded());
        backend.log.wait_settled(1).await;
        assert_eq!(Log::get(&backend.log.nothing), 1, "nothing to take back");
        assert!(!exists(&con, &stored).await, "no key was created");
    }

    /// A refund for an old window, landing after a new window opened, leaves
    /// the new window's count and lifetime alone.
    pub async fn a_refund_racing_a_new_window_never_touches_it<C>(con: C, prefix: &str)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let (layer, backend) = observed_layer(con.clone(), prefix, Duration::from_millis(200));
        let app = App::new();
        let svc = layer.layer(app.service());
        let stored = backend.inner.storage_key("login", &Key::new("alice"));
        let slow = tokio::spawn({
            let svc = svc.clone();
            async move { send(&svc, answered_when_released("alice", 200)).await }
        });
        app.wait_entered(1).await;
        let old = expiry(&con, &stored).await;
        wait_expired(&con, &stored).await;
        // A new window, opened by another instance of the layer (same name,
        // same counter) whose window outlasts the test.
        let (long, _) = observed_layer(con.clone(), prefix, Duration::from_secs(60));
        let res = send(&long.layer(app.service()), answered("alice", 401)).await;
        assert_eq!(res.headers()["ratelimit"], "\"login\";r=4;t=60");
        let new = expiry(&con, &stored).await;
        assert_ne!(old, new, "another window");
        app.release();
        assert!(decision(&slow.await.unwrap()).refunded());
        backend.log.wait_settled(1).await;
        assert_eq!(
            Log::get(&backend.log.nothing),
            1,
            "the old window's refund did nothing"
        );
        assert_eq!(
            get(&con, &stored).await,
            Some(1),
            "the new window's hit is still counted"
        );
        assert_eq!(expiry(&con, &stored).await, new, "its lifetime unchanged");
    }

    async fn manager(server: &RedisServer) -> redis::aio::ConnectionManager {
        server.client().get_connection_manager().await.unwrap()
    }

    pub async fn late_and_racing_refunds_on_redis() {
        let server = redis_or_skip!(RedisServer::start("late_and_racing_refunds_on_redis"));
        a_late_refund_leaves_no_key(manager(&server).await, "late:").await;
        a_refund_racing_a_new_window_never_touches_it(manager(&server).await, "racing:").await;
    }

    pub fn concurrent_hits_and_refunds_on_redis() {
        let server = redis_or_skip!(RedisServer::start("concurrent_hits_and_refunds_on_redis"));
        multi_thread_runtime().block_on(async {
            for (prefix, deny_cache) in [("race0:", 0), ("race1:", 1024)] {
                let con = manager(&server).await;
                let backends = (0..8)
                    .map(|_| redis_backend(con.clone(), prefix, deny_cache))
                    .collect();
                let what = format!("Redis, deny cache {deny_cache}");
                cases::concurrent_hits_and_refunds_keep_at_most_the_limit(backends, &what).await;
            }
        });
    }

    pub fn a_killed_client_leaves_its_hits_counted_on_redis() {
        let server = redis_or_skip!(RedisServer::start(
            "a_killed_client_leaves_its_hits_counted_on_redis"
        ));
        let client = server.client();
        cases::a_process_killed_between_hit_and_refund_leaves_the_hits_counted(
            move || {
                let client = client.clone();
                async move { redis_backend(client.get_connection_manager().await.unwrap(), "kill:", 0) }
            },
            "Redis",
        );
    }

    #[cfg(feature = "redis-cluster")]
    pub fn refunds_on_a_cluster() {
        use support::redis::RedisCluster;
        let cluster = redis_or_skip!(RedisCluster::start("refunds_on_a_cluster"));
        let urls = cluster.urls();
        let connect = move || {
            let urls = urls.clone();
            async move {
                redis::cluster::ClusterClient::new(urls)
                    .unwrap()
                    .get_async_connection()
                    .await
                    .unwrap()
            }
        };
        multi_thread_runtime().block_on(async {
            a_late_refund_leaves_no_key(connect().await, "late:").await;
            a_refund_racing_a_new_window_never_touches_it(connect().await, "racing:").await;
            for (prefix, deny_cache) in [("race0:", 0), ("race1:", 1024)] {
                let con = connect().await;
                let backends = (0..8)
                    .map(|_| redis_backend(con.clone(), prefix, deny_cache))
                    .collect();
                let what = format!("Cluster, deny cache {deny_cache}");
                cases::concurrent_hits_and_refunds_keep_at_most_the_limit(backends, &what).await;
            }
        });
        cases::a_process_killed_between_hit_and_refund_leaves_the_hits_counted(
            move || {
                let connect = connect.clone();
                async move { redis_backend(connect().await, "kill:", 0) }
            },
            "Cluster",
        );
    }
}

// --- PostgreSQL ------------------------------------------------------------

#[cfg(feature = "postgres")]
mod on_postgres {
    use super::*;
    use support::postgres::{TestSchema, pool};
    use tower_pinned_window_postgres::PostgresBackend;

    /// A backend on `schema`'s table, its pool made on the runtime this is
    /// called on.
    fn backend(url: &str, schema: &str) -> PostgresBackend {
        PostgresBackend::builder(pool(url, schema, 2))
            .schema(schema)
            .build()
    }

    pub fn refund_races_and_a_killed_client_on_postgres() {
        let setup = multi_thread_runtime();
        let Some(schema) = setup.block_on(TestSchema::create("outcome_refunds")) else {
            return;
        };
        let (url, name) = (schema.url.clone(), schema.name.clone());
        setup.block_on(async {
            backend(&url, &name).migrate().await.unwrap();
            let backends = (0..8).map(|_| backend(&url, &name)).collect();
            cases::concurrent_hits_and_refunds_keep_at_most_the_limit(backends, "PostgreSQL").await;
        });
        cases::a_process_killed_between_hit_and_refund_leaves_the_hits_counted(
            move || {
                let (url, name) = (url.clone(), name.clone());
                async move { backend(&url, &name) }
            },
            "PostgreSQL",
        );
        drop(schema);
    }
}

/// The tests, listed for libtest-mimic (`tests/support/trial.rs`): a test whose
/// server is missing is reported as ignored.
fn main() {
    // Pushed to below, with the redis and postgres features.
    #[allow(unused_mut)]
    let mut trials = vec![
        trial::paused(
            "skipped_requests_are_not_counted_and_carry_no_headers",
            Needs::Nothing,
            skipped_requests_are_not_counted_and_carry_no_headers,
        ),
        trial::paused(
            "the_allowlist_skips_clients_directly_and_behind_a_trusted_proxy",
            Needs::Nothing,
            the_allowlist_skips_clients_directly_and_behind_a_trusted_proxy,
        ),
        trial::paused(
            "a_forged_forwarded_header_does_not_skip",
            Needs::Nothing,
            a_forged_forwarded_header_does_not_skip,
        ),
        trial::paused(
            "only_answers_that_count_are_kept_and_denials_are_refunded",
            Needs::Nothing,
            only_answers_that_count_are_kept_and_denials_are_refunded,
        ),
        trial::paused(
            "parallel_successes_never_lock_a_client_out",
            Needs::Nothing,
            parallel_successes_never_lock_a_client_out,
        ),
        trial::paused(
            "count_if_reads_status_and_headers_and_refunds_every_quota",
            Needs::Nothing,
            count_if_reads_status_and_headers_and_refunds_every_quota,
        ),
        trial::paused(
            "shadowed_requests_are_judged_by_their_answer_too",
            Needs::Nothing,
            shadowed_requests_are_judged_by_their_answer_too,
        ),
        trial::paused(
            "a_refund_after_the_window_closed_leaves_no_counter",
            Needs::Nothing,
            a_refund_after_the_window_closed_leaves_no_counter,
        ),
        trial::paused(
            "a_refund_racing_a_new_window_never_touches_it",
            Needs::Nothing,
            a_refund_racing_a_new_window_never_touches_it,
        ),
        trial::trial(
            "concurrent_hits_and_refunds_never_keep_more_than_the_limit_in_memory",
            Needs::Nothing,
            concurrent_hits_and_refunds_never_keep_more_than_the_limit_in_memory,
        ),
        trial::paused(
            "a_dropped_response_future_leaves_the_hit_counted",
            Needs::Nothing,
            a_dropped_response_future_leaves_the_hit_counted,
        ),
        trial::paused(
            "a_service_error_is_no_answer_and_keeps_the_hit",
            Needs::Nothing,
            a_service_error_is_no_answer_and_keeps_the_hit,
        ),
        trial::paused(
            "a_failed_refund_leaves_the_hit_counted",
            Needs::Nothing,
            a_failed_refund_leaves_the_hit_counted,
        ),
        trial::paused(
            "the_client_does_not_wait_for_a_refund_that_has_to_go_out",
            Needs::Nothing,
            the_client_does_not_wait_for_a_refund_that_has_to_go_out,
        ),
        trial::trial(
            "outside_a_tokio_runtime_the_response_waits_for_its_refund",
            Needs::Nothing,
            outside_a_tokio_runtime_the_response_waits_for_its_refund,
        ),
        trial::paused(
            "the_login_example_limits_failures_never_counts_successes_and_locks_out",
            Needs::Nothing,
            the_login_example_limits_failures_never_counts_successes_and_locks_out,
        ),
    ];
    #[cfg(feature = "redis")]
    trials.push(trial::current(
        "on_redis::late_and_racing_refunds_on_redis",
        Needs::Redis,
        on_redis::late_and_racing_refunds_on_redis,
    ));
    #[cfg(feature = "redis")]
    trials.push(trial::trial(
        "on_redis::concurrent_hits_and_refunds_on_redis",
        Needs::Redis,
        on_redis::concurrent_hits_and_refunds_on_redis,
    ));
    #[cfg(feature = "redis")]
    trials.push(trial::trial(
        "on_redis::a_killed_client_leaves_its_hits_counted_on_redis",
        Needs::Redis,
        on_redis::a_killed_client_leaves_its_hits_counted_on_redis,
    ));
    #[cfg(feature = "redis")]
    #[cfg(feature = "redis-cluster")]
    trials.push(trial::trial(
        "on_redis::refunds_on_a_cluster",
        Needs::Redis,
        on_redis::refunds_on_a_cluster,
    ));
    #[cfg(feature = "postgres")]
    trials.push(trial::trial(
        "on_postgres::refund_races_and_a_killed_client_on_postgres",
        Needs::Postgres,
        on_postgres::refund_races_and_a_killed_client_on_postgres,
    ));
    trial::run(trials, ())
}
