//! The layer against `service_fn` services, on tokio's paused clock.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use support::http::{Body, burst, by_client, from, multi_thread_runtime, ok_count, ok_service};
use tokio::time::advance;
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_pinned_window::backend::{
    Backend, BackendError, Counter, Hit, Hits, LimitScope, MemoryBackend,
};
use tower_pinned_window::key::{Key, KeyError};
use tower_pinned_window::{
    ConfigError, Decision, DecisionIn, FailurePolicy, LimitBook, NamedQuota, Quota, RateLimitLayer,
    Window, response::HeaderStyle,
};

fn quota(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

/// A layer on a memory backend that reads tokio's (paused) clock.
fn limiter(name: &'static str, quota: Quota) -> RateLimitLayer {
    RateLimitLayer::new(name, quota).backend(MemoryBackend::new().tokio_clock())
}

fn get() -> Request<Body> {
    Request::new(String::new())
}

async fn send<S>(svc: &S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    svc.clone().oneshot(req).await.unwrap()
}

fn header<'a>(res: &'a Response<Body>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test(start_paused = true)]
async fn denies_past_the_limit_with_retry_after_and_ietf_headers() {
    // The decision in every response, to read it on the passed ones too.
    let svc = limiter("api", quota(3, 10))
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    for remaining in [2, 1, 0] {
        let res = send(&svc, get()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            header(&res, "ratelimit"),
            Some(format!("\"api\";r={remaining};t=10").as_str())
        );
        assert_eq!(header(&res, "ratelimit-policy"), Some("\"api\";q=3;w=10"));
        assert_eq!(
            header(&res, "retry-after"),
            None,
            "allowed responses carry no Retry-After"
        );
        let decision = res
            .extensions()
            .get::<Decision>()
            .expect("decision in extensions");
        assert_eq!((decision.limit(), decision.remaining()), (3, remaining));
    }
    advance(Duration::from_millis(2500)).await;
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&res, "retry-after"),
        Some("8"),
        "7.5 s left rounds up to 8"
    );
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=8"));
    assert!(res.body().is_empty());
    let decision = res.extensions().get::<Decision>().unwrap();
    assert!(!decision.passed() && decision.over_limit(), "denied");
    assert_eq!(decision.reset(), Duration::from_millis(7500));

    // The structured fields parse as RFC 9651 items.
    for name in ["ratelimit", "ratelimit-policy"] {
        let value = header(&res, name).unwrap();
        sfv::Parser::new(value)
            .parse::<sfv::List>()
            .unwrap_or_else(|e| panic!("{name}: {value}: {e}"));
    }

    advance(Duration::from_millis(7500)).await;
    assert_eq!(
        send(&svc, get()).await.status(),
        StatusCode::OK,
        "the window closed"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_at_least_one_second() {
    let q = Quota::new(1, Duration::from_millis(1500)).unwrap();
    let svc = limiter("short", q).layer(ok_service());
    send(&svc, get()).await;
    advance(Duration::from_millis(1499)).await;
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&res, "retry-after"),
        Some("1"),
        "1 ms left still says 1"
    );
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"short\";q=1;w=2"),
        "w rounds up"
    );
}

#[tokio::test(start_paused = true)]
async fn the_window_is_pinned_to_the_first_hit() {
    let layer = limiter("login", quota(2, 15 * 60))
        .key(by_client())
        .decision_in(DecisionIn::Response);
    let svc = layer.layer(ok_service());
    let minute = Duration::from_secs(60);

    assert_eq!(
        header(&send(&svc, from("alice")).await, "ratelimit"),
        Some("\"login\";r=1;t=900")
    );
    advance(14 * minute).await;
    let res = send(&svc, from("alice")).await;
    assert_eq!(
        header(&res, "ratelimit"),
        Some("\"login\";r=0;t=60"),
        "the knock at 14 min did not move the window"
    );
    advance(minute + Duration::from_millis(1)).await;
    let res = send(&svc, from("alice")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<Decision>().unwrap().count(),
        1,
        "15 min + 1 ms opens a new window"
    );

    // Knocking every 14 minutes past the limit is never locked out for good:
    // each window closes 15 minutes after the hit that opened it.
    let mut allowed = 0;
    for _ in 0..12 {
        advance(14 * minute).await;
        if send(&svc, from("alice")).await.status() == StatusCode::OK {
            allowed += 1;
        }
    }
    assert_eq!(
        allowed, 12,
        "two hits per window never exceed the limit of 2"
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_client_is_let_back_in_when_its_window_closes_not_later() {
    let svc = limiter("login", quota(1, 60))
        .key(by_client())
        .layer(ok_service());
    assert_eq!(send(&svc, from("bob")).await.status(), StatusCode::OK);
    // Bob keeps knocking every 10 s while denied; the window does not slide.
    for _ in 0..5 {
        advance(Duration::from_secs(10)).await;
        assert_eq!(
            send(&svc, from("bob")).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    advance(Duration::from_secs(10)).await;
    assert_eq!(
        send(&svc, from("bob")).await.status(),
        StatusCode::OK,
        "60 s after his first hit"
    );
}

#[tokio::test(start_paused = true)]
async fn keys_are_counted_apart_and_clones_share_one_budget() {
    let layer = limiter("api", quota(2, 60)).key(by_client());
    let a = layer.clone().layer(ok_service());
    let b = layer.layer(ok_service());
    let a2 = a.clone();
    assert_eq!(send(&a, from("x")).await.status(), StatusCode::OK);
    assert_eq!(send(&b, from("x")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&a2, from("x")).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "clones of layer and service share the budget"
    );
    assert_eq!(
        send(&a, from("y")).await.status(),
        StatusCode::OK,
        "another key has its own budget"
    );
}

#[tokio::test(start_paused = true)]
async fn layers_share_a_backend_only_under_one_name() {
    let store = MemoryBackend::new();
    let login = limiter("login", quota(1, 60))
        .backend(store.clone())
        .layer(ok_service());
    let search = limiter("search", quota(1, 60))
        .backend(store.clone())
        .layer(ok_service());
    let login_too = limiter("login", quota(1, 60))
        .backend(store.clone())
        .layer(ok_service());
    assert_eq!(send(&login, get()).await.status(), StatusCode::OK);
    assert_eq!(
        send(&search, get()).await.status(),
        StatusCode::OK,
        "another name, another counter"
    );
    assert_eq!(
        send(&login_too, get()).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "same name, same counter"
    );

    // reset unblocks the client.
    assert!(store.reset("login", &Key::new("*")).await.unwrap());
    assert_eq!(send(&login, get()).await.status(), StatusCode::OK);
    assert_eq!(
        store
            .peek("login", &Key::new("*"))
            .await
            .unwrap()
            .map(|h| h.count),
        Some(1)
    );
}

#[test]
fn exactly_the_limit_is_admitted_out_of_concurrent_hits() {
    multi_thread_runtime().block_on(async {
        for (limit, hits) in [(1u64, 200usize), (50, 1000), (999, 1000), (1000, 1000)] {
            let served = Arc::new(AtomicUsize::new(0));
            let counter = served.clone();
            let inner = service_fn(move |_req: Request<Body>| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(String::new())) }
            });
            let svc = limiter("burst", quota(limit, 60)).layer(inner);
            let ok = ok_count(&burst(&[svc], hits, get).await);
            assert_eq!(
                ok,
                limit.min(hits as u64) as usize,
                "limit {limit}, {hits} hits"
            );
            assert_eq!(
                served.load(Ordering::SeqCst),
                ok,
                "the service saw only the admitted"
            );
        }
    });
}

#[tokio::test(start_paused = true)]
async fn legacy_and_no_headers() {
    let svc = limiter("api", quota(1, 30))
        .headers(HeaderStyle::Legacy)
        .layer(ok_service());
    let res = send(&svc, get()).await;
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("1"));
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("30"));
    assert_eq!(header(&res, "ratelimit"), None);
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));

    let svc = limiter("api", quota(1, 30))
        .headers(HeaderStyle::None)
        .layer(ok_service());
    let res = send(&svc, get()).await;
    assert!(res.headers().is_empty(), "{:?}", res.headers());
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers().len(), 1);
    assert_eq!(header(&res, "retry-after"), Some("30"));
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_and_never_denies() {
    // (passed, over the limit)
    const ALLOWED: (bool, bool) = (true, false);
    const SHADOWED: (bool, bool) = (true, true);
    let outcome = |d: &Decision| (d.passed(), d.over_limit());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let svc = limiter("new-limit", quota(1, 60))
        .shadow(true)
        .decision_in(DecisionIn::Response)
        .on_decision(move |d| {
            log.lock()
                .unwrap()
                .push((d.count(), (d.passed(), d.over_limit())))
        })
        .layer(ok_service());
    for _ in 0..3 {
        assert_eq!(send(&svc, get()).await.status(), StatusCode::OK);
    }
    let res = send(&svc, get()).await;
    assert_eq!(
        outcome(res.extensions().get::<Decision>().unwrap()),
        SHADOWED
    );
    assert_eq!(header(&res, "ratelimit"), Some("\"new-limit\";r=0;t=60"));
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(1, ALLOWED), (2, SHADOWED), (3, SHADOWED), (4, SHADOWED)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_custom_denial_gets_the_headers_too() {
    let svc = limiter("api", quota(1, 60))
        .deny_with(|d| {
            let mut res = Response::new(format!("slow down, try again in {} s", d.reset_secs()));
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut()
                .insert("retry-after", HeaderValue::from_static("120"));
            res
        })
        .layer(ok_service());
    send(&svc, get()).await;
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.body(), "slow down, try again in 60 s");
    assert_eq!(
        header(&res, "retry-after"),
        Some("120"),
        "a header the denial set is kept"
    );
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=0;t=60"));
}

#[tokio::test(start_paused = true)]
async fn grpc_requests_get_resource_exhausted() {
    let svc = limiter("grpc", quota(1, 60)).layer(ok_service());
    let grpc = || {
        Request::builder()
            .header("content-type", "application/grpc+proto")
            .body(String::new())
            .unwrap()
    };
    assert_eq!(send(&svc, grpc()).await.status(), StatusCode::OK);
    let res = send(&svc, grpc()).await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "gRPC errors travel with HTTP 200"
    );
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    // tonic (feature `tonic`) percent-encodes the message; both are valid.
    let message = header(&res, "grpc-message").unwrap();
    assert!(
        matches!(message, "rate limit exceeded" | "rate%20limit%20exceeded"),
        "{message}"
    );
    assert_eq!(header(&res, "content-type"), Some("application/grpc"));
    assert_eq!(header(&res, "retry-after"), Some("60"));
}

#[tokio::test(start_paused = true)]
async fn requests_without_a_key() {
    let svc = limiter("api", quota(1, 60))
        .key(by_client())
        .layer(ok_service());
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST, "rejected by default");

    let svc = limiter("api", quota(1, 60))
        .key(by_client())
        .allow_missing_key(true)
        .layer(ok_service());
    for _ in 0..3 {
        let res = send(&svc, get()).await;
        assert_eq!(res.status(), StatusCode::OK, "passed uncounted");
        assert!(res.extensions().get::<Decision>().is_none());
    }

    let svc = limiter("api", quota(1, 60))
        .key_fn(|_req| Err(KeyError::Misconfigured("no connect info")))
        .layer(ok_service());
    assert_eq!(
        send(&svc, get()).await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let grpc = Request::builder()
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    assert_eq!(header(&send(&svc, grpc).await, "grpc-status"), Some("13"));
}

/// A backend that answers with a fixed error, or never: the failure paths of
/// the layer need a store that fails on demand.
#[derive(Clone, Debug)]
enum Broken {
    Down,
    Hangs,
    Corrupt,
}

impl Backend for Broken {
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Hits, BackendError>> + Send>>;
    type Refund = std::future::Ready<Result<bool, BackendError>>;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        let namespace = counters[0].namespace;
        let error = match self {
            Broken::Down => BackendError::Unavailable("connection refused".into()),
            Broken::Hangs => return Box::pin(std::future::pending()),
            Broken::Corrupt => BackendError::Corrupt {
                key: format!("{namespace}:{key}"),
                detail: "\"abc\"".into(),
            },
        };
        Box::pin(std::future::ready(Err(error)))
    }

    fn refund(&self, _: &str, _: &Key, _: &Hit) -> Self::Refund {
        std::future::ready(Ok(false))
    }

    async fn peek(&self, _: &str, _: &Key) -> Result<Option<Hit>, BackendError> {
        Ok(None)
    }

    async fn reset(&self, _: &str, _: &Key) -> Result<bool, BackendError> {
        Ok(false)
    }
}

#[tokio::test(start_paused = true)]
async fn backend_failures_follow_the_policy_but_corruption_always_stops() {
    let base = || limiter("api", quota(1, 60));
    let cases = [
        (
            "down, fail closed",
            base().backend(Broken::Down),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "down, fail open",
            base()
                .backend(Broken::Down)
                .on_failure(FailurePolicy::FailOpen),
            StatusCode::OK,
        ),
        (
            "slow, fail closed",
            base().backend(Broken::Hangs),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        (
            "slow, fail open",
            base()
                .backend(Broken::Hangs)
                .on_failure(FailurePolicy::FailOpen),
            StatusCode::OK,
        ),
        (
            "corrupt, fail closed",
            base().backend(Broken::Corrupt),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (
            "corrupt, fail open",
            base()
                .backend(Broken::Corrupt)
                .on_failure(FailurePolicy::FailOpen),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    ];
    for (name, layer, want) in cases {
        let svc = layer.layer(ok_service());
        let started = tokio::time::Instant::now();
        let res = send(&svc, get()).await;
        assert_eq!(res.status(), want, "{name}");
        if want == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(header(&res, "retry-after"), Some("1"), "{name}");
        }
        if name.starts_with("slow") {
            assert_eq!(
                started.elapsed(),
                tower_pinned_window::DEFAULT_TIMEOUT,
                "{name}: the timeout bounds the wait"
            );
        } else {
            assert_eq!(started.elapsed(), Duration::ZERO, "{name}");
        }
    }
    let svc = base()
        .backend(Broken::Hangs)
        .timeout(Window::new(Duration::from_secs(2)).unwrap())
        .layer(ok_service());
    let started = tokio::time::Instant::now();
    assert_eq!(
        send(&svc, get()).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(started.elapsed(), Duration::from_secs(2));

    let grpc = || {
        Request::builder()
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap()
    };
    let svc = base().backend(Broken::Down).layer(ok_service());
    assert_eq!(header(&send(&svc, grpc()).await, "grpc-status"), Some("14"));
    let svc = base()
        .backend(Broken::Corrupt)
        .on_failure(FailurePolicy::FailOpen)
        .layer(ok_service());
    assert_eq!(header(&send(&svc, grpc()).await, "grpc-status"), Some("13"));
}

#[tokio::test]
async fn back_pressure_from_the_inner_service_passes_through() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let layer = limiter("bp", quota(10, 60));
    let mut svc = tower_test::mock::Spawn::new(layer.layer(mock));

    handle.allow(0);
    assert!(
        svc.poll_ready().is_pending(),
        "not ready while the inner service is not"
    );
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    // The memory backend answers at once, so the ready inner service is
    // called within `call`.
    let response = tokio::spawn(svc.call(get()));
    let (request, send_response) = handle.next_request().await.unwrap();
    assert!(request.body().is_empty());
    send_response.send_response(Response::new("inner".to_string()));
    let res = response.await.unwrap().unwrap();
    assert_eq!(res.body(), "inner");
    assert_eq!(header(&res, "ratelimit"), Some("\"bp\";r=9;t=60"));
    assert!(svc.poll_ready().is_pending(), "the one permit was used");
}

/// A service that counts its clones.
#[derive(Debug)]
struct CountsClones(Arc<AtomicUsize>);

impl Clone for CountsClones {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Self(self.0.clone())
    }
}

impl Service<Request<Body>> for CountsClones {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new("ok".into())))
    }
}

#[tokio::test(start_paused = true)]
async fn the_inner_service_is_cloned_only_to_wait_for_the_backend() {
    let clones = Arc::new(AtomicUsize::new(0));
    let mut svc = limiter("api", quota(1, 60)).layer(CountsClones(clones.clone()));
    for want in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let res = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(res.status(), want);
    }
    assert_eq!(
        clones.load(Ordering::SeqCst),
        0,
        "a backend that answers at once needs no clone"
    );

    let mut svc = limiter("api", quota(1, 60))
        .backend(Broken::Hangs)
        .on_failure(FailurePolicy::FailOpen)
        .layer(CountsClones(clones.clone()));
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        clones.load(Ordering::SeqCst),
        1,
        "one clone stays behind while the ready service waits in the future"
    );
}

#[tokio::test]
async fn inner_errors_pass_through_unchanged() {
    let failing = service_fn(|_req: Request<Body>| async { Err::<Response<Body>, _>("boom") });
    let svc = limiter("api", quota(5, 60)).layer(failing);
    assert_eq!(svc.oneshot(get()).await.unwrap_err(), "boom");
}

fn grpc_call(method: &str) -> Request<Body> {
    Request::post(method)
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_layer_applies_a_quota_per_grpc_method() {
    let login = Quota::new(2, Duration::from_secs(15 * 60)).unwrap();
    let svc = limiter("api", quota(100, 60))
        .route_quota("/auth.Auth/Login", login)
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    for _ in 0..2 {
        let res = send(&svc, grpc_call("/auth.Auth/Login")).await;
        assert_eq!(header(&res, "grpc-status"), None, "allowed");
    }
    let res = send(&svc, grpc_call("/auth.Auth/Login")).await;
    assert_eq!(header(&res, "grpc-status"), Some("8"));
    assert_eq!(header(&res, "retry-after"), Some("900"));
    assert_eq!(
        header(&res, "ratelimit"),
        Some("\"api /auth.Auth/Login\";r=0;t=900"),
        "a readable default name, never the counter's id"
    );
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"api /auth.Auth/Login\";q=2;w=900")
    );
    let decision = res.extensions().get::<Decision>().unwrap();
    assert_eq!(
        (decision.name(), decision.policy(), decision.route()),
        ("api", "api /auth.Auth/Login", Some("/auth.Auth/Login"))
    );
    // Every other method gets the layer's quota, with its own counter.
    let res = send(&svc, grpc_call("/shop.Shop/List")).await;
    assert_eq!(header(&res, "grpc-status"), None);
    assert_eq!(header(&res, "ratelimit"), Some("\"api\";r=99;t=60"));
    let decision = res.extensions().get::<Decision>().unwrap();
    assert_eq!(
        (decision.policy(), decision.route()),
        ("api", Some("/shop.Shop/List"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_is_checked_against_every_quota_in_one_call() {
    // 2 per minute AND 3 per hour.
    let svc = limiter("api", quota(2, 60))
        .also(quota(3, 3600))
        .layer(ok_service());
    for remaining in [1, 0] {
        let res = send(&svc, get()).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            header(&res, "ratelimit"),
            Some(format!("\"api\";r={remaining};t=60").as_str())
        );
        assert_eq!(
            header(&res, "ratelimit-policy"),
            Some("\"api\";q=2;w=60, \"api 3/1h\";q=3;w=3600")
        );
    }
    let res = send(&svc, get()).await;
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "over the minute quota"
    );
    assert_eq!(header(&res, "retry-after"), Some("60"));
    // The minute window closes; the hour quota has counted 3 (the denial too).
    advance(Duration::from_secs(61)).await;
    let res = send(&svc, get()).await;
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "over the hour quota"
    );
    assert_eq!(header(&res, "retry-after"), Some("3539"));
    assert_eq!(header(&res, "ratelimit"), Some("\"api 3/1h\";r=0;t=3539"));
    let decision = res.extensions().get::<Decision>().unwrap();
    assert_eq!(
        (
            decision.name(),
            decision.policy(),
            decision.limit(),
            decision.count()
        ),
        ("api", "api 3/1h", 3, 4)
    );
    assert_eq!(decision.route(), None, "a plain request outside a router");
    advance(Duration::from_secs(3540)).await;
    assert_eq!(
        send(&svc, get()).await.status(),
        StatusCode::OK,
        "both windows closed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tier_picked_per_request() {
    let pro = quota(5, 60);
    let svc = limiter("tiers", quota(1, 60))
        .key(by_client())
        .quota_by(move |head| (head.headers().get("x-tier")? == "pro").then_some(pro))
        .layer(ok_service());
    let pro_req = || {
        Request::builder()
            .header("x-client", "p")
            .header("x-tier", "pro")
            .body(String::new())
            .unwrap()
    };
    let mut ok = 0;
    for _ in 0..7 {
        if send(&svc, pro_req()).await.status() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 5, "the pro tier's quota");
    assert_eq!(send(&svc, from("f")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&svc, from("f")).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the default tier's quota"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tier_that_changes_keeps_the_count() {
    // The layer's own quota is the free tier; `x-tier: pro` picks 10/min.
    let svc = limiter("plans", quota(4, 60))
        .key(by_client())
        .quota_by(|head| (head.headers().get("x-tier")? == "pro").then(|| quota(10, 60)))
        .layer(ok_service());
    let as_tier = |tier: &str| {
        Request::builder()
            .header("x-client", "k")
            .header("x-tier", tier)
            .body(String::new())
            .unwrap()
    };
    for n in 1..=8 {
        assert_eq!(
            send(&svc, as_tier("pro")).await.status(),
            StatusCode::OK,
            "pro {n}"
        );
    }
    // Downgraded at 8 of 10: denied under the free tier's 4 until the
    // window ends, never a fresh budget of 4.
    assert_eq!(
        send(&svc, as_tier("free")).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a downgrade keeps the count"
    );
    // Upgraded again: the count so far (9, the denial counted) is under 10.
    assert_eq!(send(&svc, as_tier("pro")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&svc, as_tier("pro")).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "an upgrade does not start afresh either"
    );
    advance(Duration::from_secs(60)).await;
    let mut free = 0;
    for _ in 0..6 {
        if send(&svc, as_tier("free")).await.status() == StatusCode::OK {
            free += 1;
        }
    }
    assert_eq!(free, 4, "the next window, under the free tier's quota");
}

/// How many of `n` requests `make` makes are let through.
async fn oks<S>(svc: &S, make: impl Fn() -> Request<Body>, n: usize) -> usize
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    let mut ok = 0;
    for _ in 0..n {
        if send(svc, make()).await.status() == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

/// Lets the background read of stored limits, spawned by a request, run.
async fn let_the_read_run() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn limits_held_in_the_store_change_the_limit_and_keep_the_count() {
    let backend = MemoryBackend::new().tokio_clock();
    let book = LimitBook::new(&backend, Duration::from_secs(1)).unwrap();
    let svc = RateLimitLayer::new("stored", quota(10, 60))
        .backend(backend)
        .key(by_client())
        .quota_by(|head| {
            (head.headers().get("x-tier")? == "pro").then(|| NamedQuota::new("pro", quota(20, 60)))
        })
        .limits(book.clone())
        .layer(ok_service());
    for n in 1..=8 {
        assert_eq!(
            send(&svc, from("a")).await.status(),
            StatusCode::OK,
            "a {n}"
        );
    }
    // Throttled at 8: a limit of 5 for the key, set while it runs.
    let a = Key::new("a");
    book.set("stored", LimitScope::Key(&a), quota(5, 60))
        .await
        .unwrap();
    // The request that finds its copy stale is judged by it (9 of 10) and
    // reads the store in the background; the next is judged by the new
    // limit, with the count kept.
    assert_eq!(send(&svc, from("a")).await.status(), StatusCode::OK);
    let_the_read_run().await;
    let res = send(&svc, from("a")).await;
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "10 > 5: no fresh budget"
    );
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"stored\";q=5;w=60")
    );

    // The layer's limit, for every other key, within the staleness bound.
    book.set("stored", LimitScope::Layer, quota(3, 60))
        .await
        .unwrap();
    send(&svc, from("b")).await;
    let_the_read_run().await;
    let ok = oks(&svc, || from("b"), 5).await;
    assert_eq!(
        ok, 2,
        "3 for the layer, one of them spent by the stale request"
    );
    // Raised to 4: the policy of the layer's limit kept beside the copy is
    // not the one applied once the copy changes.
    book.set("stored", LimitScope::Layer, quota(4, 60))
        .await
        .unwrap();
    send(&svc, from("warm-4")).await;
    let_the_read_run().await;
    assert_eq!(oks(&svc, || from("f"), 6).await, 4, "4 for the layer");
    let res = send(&svc, from("e")).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"stored\";q=4;w=60")
    );
    book.set("stored", LimitScope::Layer, quota(3, 60))
        .await
        .unwrap();
    send(&svc, from("warm-3")).await;
    let_the_read_run().await;

    // A tier's limit, by its name; the key's still beats it.
    book.set("stored", LimitScope::Tier("pro"), quota(2, 60))
        .await
        .unwrap();
    let pro = |client: &str| {
        Request::builder()
            .header("x-client", client)
            .header("x-tier", "pro")
            .body(String::new())
            .unwrap()
    };
    send(&svc, pro("warm")).await;
    let_the_read_run().await;
    assert_eq!(oks(&svc, || pro("c"), 4).await, 2, "the stored tier limit");
    assert_eq!(
        send(&svc, pro("a")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // Cleared: the quotas as built apply again, after the staleness bound.
    book.clear("stored", LimitScope::Layer).await.unwrap();
    book.clear("stored", LimitScope::Tier("pro")).await.unwrap();
    send(&svc, from("warm")).await;
    let_the_read_run().await;
    assert_eq!(oks(&svc, || from("d"), 12).await, 10);
    assert!(
        book.read("stored")
            .await
            .unwrap()
            .get(LimitScope::Key(&a))
            .is_some()
    );
}

#[test]
fn a_limit_book_refuses_a_zero_staleness() {
    assert_eq!(
        LimitBook::new(&MemoryBackend::new(), Duration::ZERO).unwrap_err(),
        ConfigError::ZeroStaleness
    );
}

#[tokio::test(start_paused = true)]
async fn tier_names_are_given_or_readable() {
    let pro = NamedQuota::new("pro", quota(5, 60));
    let svc = limiter("tiers", quota(1, 60))
        .key(by_client())
        .also(NamedQuota::new("daily", quota(1_000, 86_400)))
        .quota_by(move |head| match head.headers().get("x-tier")?.as_bytes() {
            b"pro" => Some(pro.clone()),
            b"team" => Some(quota(20, 60).into()),
            _ => None,
        })
        .layer(ok_service());
    let tier = |client: &str, tier: &str| {
        Request::builder()
            .header("x-client", client)
            .header("x-tier", tier)
            .body(String::new())
            .unwrap()
    };
    let cases = [
        (
            "named tier",
            tier("a", "pro"),
            "\"pro\";r=4;t=60",
            "\"pro\";q=5;w=60, \"daily\";q=1000;w=86400",
        ),
        (
            "unnamed tier",
            tier("b", "team"),
            "\"tiers 20/1min\";r=19;t=60",
            "\"tiers 20/1min\";q=20;w=60, \"daily\";q=1000;w=86400",
        ),
        (
            "no tier",
            from("c"),
            "\"tiers\";r=0;t=60",
            "\"tiers\";q=1;w=60, \"daily\";q=1000;w=86400",
        ),
    ];
    for (name, request, ratelimit, policy) in cases {
        let res = send(&svc, request).await;
        assert_eq!(res.status(), StatusCode::OK, "{name}");
        assert_eq!(header(&res, "ratelimit"), Some(ratelimit), "{name}");
        assert_eq!(header(&res, "ratelimit-policy"), Some(policy), "{name}");
    }
}

#[tokio::test(start_paused = true)]
async fn named_route_and_extra_quotas_in_the_headers() {
    let svc = limiter("api", quota(100, 60))
        .route_quota(
            "/auth.Auth/Login",
            NamedQuota::new("login \"strict\"", quota(2, 900)),
        )
        .also(NamedQuota::new("daily", quota(10_000, 86_400)))
        .decision_in(DecisionIn::Response)
        .layer(ok_service());
    let res = send(&svc, grpc_call("/auth.Auth/Login")).await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"login \\\"strict\\\"\";q=2;w=900, \"daily\";q=10000;w=86400"),
        "a quote in a name is escaped as an sf-string"
    );
    assert_eq!(
        header(&res, "ratelimit"),
        Some("\"login \\\"strict\\\"\";r=1;t=900")
    );
    let decision = res.extensions().get::<Decision>().unwrap();
    assert_eq!(decision.policy(), "login \"strict\"");
    for name in ["ratelimit", "ratelimit-policy"] {
        let value = header(&res, name).unwrap();
        let list = sfv::Parser::new(value)
            .parse::<sfv::List>()
            .unwrap_or_else(|e| panic!("{name}: {value}: {e}"));
        let sfv::ListEntry::Item(first) = &list[0] else {
            panic!("{name}: an item");
        };
        assert_eq!(
            first.bare_item.as_string().map(|s| s.as_str()),
            Some("login \"strict\""),
            "{name}"
        );
    }
    assert_eq!(
        NamedQuota::try_new("caf\u{e9}", quota(1, 1)),
        Err(ConfigError::InvalidPolicyName("caf\u{e9}".into()))
    );
}

/// `outer` around `inner` around the ok service.
fn nested(
    outer: RateLimitLayer,
    inner: RateLimitLayer,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    outer.layer(inner.layer(ok_service()))
}

#[tokio::test(start_paused = true)]
async fn nested_layers_each_add_their_item_to_the_lists() {
    let svc = nested(
        limiter("outer", quota(5, 600)),
        limiter("inner", quota(1, 60)).also(quota(3, 3600)),
    );
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        header(&res, "ratelimit"),
        Some("\"inner\";r=0;t=60, \"outer\";r=4;t=600"),
        "every limiter that applied"
    );
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some("\"inner\";q=1;w=60, \"inner 3/1h\";q=3;w=3600, \"outer\";q=5;w=600")
    );
    assert_eq!(
        res.headers().get_all("ratelimit").iter().count(),
        1,
        "one field line, so a client reading the first line sees the whole list"
    );
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&res, "ratelimit"),
        Some("\"inner\";r=0;t=60, \"outer\";r=3;t=600")
    );
    assert_eq!(
        header(&res, "retry-after"),
        Some("60"),
        "the outer layer would admit a retry: the inner wait stands"
    );
    for name in ["ratelimit", "ratelimit-policy"] {
        let value = header(&res, name).unwrap();
        let list = sfv::Parser::new(value)
            .parse::<sfv::List>()
            .unwrap_or_else(|e| panic!("{name}: {value}: {e}"));
        assert!(list.len() >= 2, "{name}: {value}");
    }

    let legacy = nested(
        limiter("outer", quota(5, 600)).headers(HeaderStyle::Legacy),
        limiter("inner", quota(1, 60)).headers(HeaderStyle::Legacy),
    );
    let res = send(&legacy, get()).await;
    assert_eq!(
        header(&res, "x-ratelimit-limit"),
        Some("1"),
        "legacy fields hold one value: the innermost layer's"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_the_longest_wait() {
    // The outer layer's window outlasts the inner one's, and the request
    // that the inner layer denies uses up the outer layer's last hit: a
    // retry before the outer window closes would be denied there.
    let svc = nested(
        limiter("outer", quota(2, 600)),
        limiter("inner", quota(1, 60)),
    );
    assert_eq!(send(&svc, get()).await.status(), StatusCode::OK);
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("600"));
    assert_eq!(
        header(&res, "ratelimit"),
        Some("\"inner\";r=0;t=60, \"outer\";r=0;t=600")
    );

    // The other way round, the inner wait is the longer one and stays.
    let svc = nested(
        limiter("outer", quota(2, 30)),
        limiter("inner", quota(1, 60)),
    );
    send(&svc, get()).await;
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("60"));

    // A shadowed outer layer never denies, so it never lengthens the wait.
    let svc = nested(
        limiter("outer", quota(1, 600)).shadow(true),
        limiter("inner", quota(1, 60)),
    );
    send(&svc, get()).await;
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("60"));
}

#[tokio::test(start_paused = true)]
async fn a_shadow_layer_with_one_hit_left_never_lengthens_the_wait() {
    // The request the inner layer denies uses up the shadow layer's last
    // hit: a layer that never denies must still not raise the inner wait,
    // since the retry it would announce is admitted after 10 s.
    let svc = nested(
        limiter("outer", quota(2, 100)).shadow(true),
        limiter("inner", quota(1, 10)),
    );
    assert_eq!(send(&svc, get()).await.status(), StatusCode::OK);
    let res = send(&svc, get()).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("10"));
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        send(&svc, get()).await.status(),
        StatusCode::OK,
        "the retry Retry-After announced is admitted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_the_denial_set_is_kept_and_only_raised_by_outer_layers() {
    let custom = |secs: &'static str| {
        limiter("inner", quota(1, 60)).deny_with(move |_| {
            let mut res = Response::new(String::new());
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res.headers_mut()
                .insert("retry-after", HeaderValue::from_static(secs));
            res
        })
    };
    let svc = limiter("outer", quota(2, 600)).layer(custom("5").layer(ok_service()));
    send(&svc, get()).await;
    let res = send(&svc, get()).await;
    assert_eq!(
        header(&res, "retry-after"),
        Some("600"),
        "the outer layer would deny a retry for 600 s"
    );
    let svc = limiter("outer", quota(2, 600)).layer(custom("900").layer(ok_service()));
    send(&svc, get()).await;
    let res = send(&svc, get()).await;
    assert_eq!(header(&res, "retry-after"), Some("900"), "never lowered");
    let svc = limiter("outer", quota(9, 600)).layer(custom("5").layer(ok_service()));
    send(&svc, get()).await;
    let res = send(&svc, get()).await;
    assert_eq!(
        header(&res, "retry-after"),
        Some("5"),
        "kept as the denial set it"
    );
}

#[tokio::test(start_paused = true)]
async fn closures_infer_their_argument_types() {
    // No annotations: `key_fn` and `deny_with` name `Fn` in their bounds.
    let svc = limiter("api", quota(1, 60))
        .key_fn(|req| {
            req.headers()
                .get("x-client")
                .map(|v| Key::new(v.as_bytes()))
                .ok_or(KeyError::missing("x-client"))
        })
        .deny_with(|d| Response::new(format!("{} over {}", d.policy(), d.limit())))
        .layer(ok_service());
    assert_eq!(send(&svc, from("a")).await.status(), StatusCode::OK);
    let res = send(&svc, from("a")).await;
    assert_eq!(res.body(), "api over 1");
    assert_eq!(send(&svc, from("b")).await.status(), StatusCode::OK);
    assert_eq!(send(&svc, get()).await.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn a_zero_timeout_cannot_be_written() {
    // A timeout is a `Window`: zero is refused where the value is made.
    assert_eq!(
        Window::new(Duration::ZERO).unwrap_err(),
        ConfigError::NonPositiveWindow
    );
    let _ = limiter("api", quota(1, 60)).timeout(Window::new(Duration::from_millis(1)).unwrap());
}
