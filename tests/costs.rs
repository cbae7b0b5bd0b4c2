//! The layer's side of costs, charges, lockouts and resets on success,
//! through the memory backend on tokio's paused clock: what a request
//! spends, what its answer amends, and that a layer with none of them still
//! counts with `hit_all`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::time::advance;
use tower::{Layer, ServiceExt, service_fn};
use tower_pinned_window::backend::{
    Amend, Backend, BackendError, Counter, Hit, MemoryBackend, Spend, Spending,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::{Decision, DecisionIn, Quota, RateLimitLayer, Window};

fn quota(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

/// A memory backend on tokio's (paused) clock, recording which calls the
/// layer made.
#[derive(Clone, Debug, Default)]
struct Recorded {
    inner: MemoryBackend,
    hits: Arc<AtomicUsize>,
    spends: Arc<AtomicUsize>,
    amends: Arc<AtomicUsize>,
}

impl Recorded {
    fn new() -> Self {
        Self {
            inner: MemoryBackend::new().tokio_clock(),
            ..Self::default()
        }
    }

    async fn count(&self, namespace: &str) -> Option<u64> {
        let hit = self.inner.peek(namespace, &Key::new("*")).await.unwrap();
        hit.map(|hit| hit.count)
    }

    fn calls(&self) -> (usize, usize, usize) {
        (
            self.hits.load(Ordering::SeqCst),
            self.spends.load(Ordering::SeqCst),
            self.amends.load(Ordering::SeqCst),
        )
    }
}

impl Backend for Recorded {
    type Future = <MemoryBackend as Backend>::Future;
    type Refund = <MemoryBackend as Backend>::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        self.hits.fetch_add(1, Ordering::SeqCst);
        self.inner.hit_all(key, counters)
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
        self.inner.refund(namespace, key, hit)
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        self.inner.peek(namespace, key).await
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        self.inner.reset(namespace, key).await
    }
}

impl Spending for Recorded {
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Self::Future {
        self.spends.fetch_add(1, Ordering::SeqCst);
        self.inner.spend_all(key, counters, spend)
    }

    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Self::Refund {
        self.amends.fetch_add(1, Ordering::SeqCst);
        self.inner.amend(namespace, key, hit, amend)
    }
}

/// A body of the frames it was given (data, then trailers), one a poll.
struct Frames(std::vec::IntoIter<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.next().map(Ok))
    }
}

impl Default for Frames {
    fn default() -> Self {
        Self(Vec::new().into_iter())
    }
}

/// A service that answers with the status in `x-status` (200 without
/// one), a streamed body of two chunks, and `x-usage: N` in its trailers
/// for `x-usage: N` in the request.
fn streaming()
-> impl tower::Service<Request<()>, Response = Response<Frames>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    service_fn(|request: Request<()>| async move {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let mut frames = vec![
            Frame::data(Bytes::from_static(b"data: one\n\n")),
            Frame::data(Bytes::from_static(b"data: two\n\n")),
        ];
        if let Some(usage) = header("x-usage") {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-usage", usage.parse().unwrap());
            frames.push(Frame::trailers(trailers));
        }
        let mut response = Response::new(Frames(frames.into_iter()));
        let status = header("x-status").map_or(200, |s| s.parse().unwrap());
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok::<_, Infallible>(response)
    })
}

fn request(headers: &[(&'static str, &str)]) -> Request<()> {
    let mut request = Request::builder();
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(()).unwrap()
}

fn usage_in_trailers(end: &tower_pinned_window::outcome::ResponseHead<'_>) -> u64 {
    end.trailers()
        .and_then(|t| t.get("x-usage"))
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn without_any_option_the_layer_counts_with_hit_all_and_amends_nothing() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("api", quota(5, 60))
        .count_if(|res| res.is_failure())
        .backend(backend.clone());
    let service = layer.layer(streaming());
    for status in ["200", "500"] {
        let response = service
            .clone()
            .oneshot(request(&[("x-status", status)]))
            .await
            .unwrap();
        // The service's own body type: nothing wraps it.
        let _: &Frames = response.body();
    }
    assert_eq!(backend.calls(), (2, 0, 0), "two hits, no spend, no amend");
    assert_eq!(backend.count("api").await, Some(1), "the 200 was refunded");
}

#[tokio::test(start_paused = true)]
async fn a_cost_counts_whole_a_denial_spends_nothing_and_zero_only_checks() {
    let backend = Recorded::new();
    let also = quota(100, 3600);
    let layer = RateLimitLayer::new("api", quota(10, 60))
        .also(also)
        .backend(backend.clone())
        .decision_in(DecisionIn::Response)
        .cost_fn(|req| {
            req.headers()
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        });
    let service = layer.layer(streaming());
    let call = |cost: &str| {
        let request = request(&[("x-cost", cost)]);
        service.clone().oneshot(request)
    };
    let zero = call("0").await.unwrap();
    assert_eq!(zero.status(), StatusCode::OK);
    assert_eq!(backend.count("api").await, None, "a check creates nothing");
    assert_eq!(call("4").await.unwrap().status(), StatusCode::OK);
    assert_eq!(call("4").await.unwrap().status(), StatusCode::OK);
    let denied = call("3").await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry = denied.headers()["retry-after"].to_str().unwrap().to_owned();
    assert_eq!(retry, "60");
    assert_eq!(
        backend.count("api").await,
        Some(8),
        "the denial spent nothing"
    );
    let hour = format!("api:{}/{}ms", also.limit(), also.window().as_millis());
    assert_eq!(
        backend.count(&hour).await,
        Some(8),
        "every quota of the policy counts the cost, and none the denial"
    );
    let fits = call("2").await.unwrap();
    assert_eq!(fits.status(), StatusCode::OK);
    let decision = fits.extensions().get::<Decision>().unwrap();
    assert_eq!((decision.count(), decision.remaining()), (10, 0));
    let checked = call("0").await.unwrap();
    assert_eq!(
        checked.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a check at the limit does not fit"
    );
    // Above the smallest limit: never admitted; the backend is asked only
    // what the counters hold, and nothing is spent.
    let (hits, spends, amends) = backend.calls();
    let never = call("11").await.unwrap();
    assert_eq!(never.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(never.headers().get("retry-after").is_none());
    let decision = never.extensions().get::<Decision>().unwrap();
    assert!(decision.never_fits() && !decision.passed());
    assert_eq!((decision.count(), decision.limit()), (10, 10));
    assert_eq!(backend.calls(), (hits, spends + 1, amends), "one spend");
    assert_eq!(backend.count("api").await, Some(10), "nothing spent");
}

#[tokio::test(start_paused = true)]
async fn a_denial_by_cost_shows_what_is_left() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("tokens", quota(1000, 60))
        .backend(backend.clone())
        .cost_fn(|req| {
            req.headers()
                .get("x-max-tokens")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        });
    let service = layer.layer(streaming());
    let call = |tokens: &str| {
        service
            .clone()
            .oneshot(request(&[("x-max-tokens", tokens)]))
    };
    // A cost that can never fit, on a fresh key: all of it is left, and no
    // wait helps.
    let never = call("5000").await.unwrap();
    assert_eq!(never.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(never.headers()["ratelimit"], "\"tokens\";r=1000;t=60");
    assert!(never.headers().get("retry-after").is_none());
    assert_eq!(backend.count("tokens").await, None, "nothing created");
    for left in [700, 400, 100] {
        let response = call("300").await.unwrap();
        let want = format!("\"tokens\";r={left};t=60");
        assert_eq!(response.headers()["ratelimit"], want.as_str());
    }
    advance(Duration::from_secs(15)).await;
    let denied = call("300").await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit"], "\"tokens\";r=100;t=45");
    assert_eq!(
        denied.headers()["retry-after"],
        "45",
        "a new window has room"
    );
    let decision = denied.extensions().get::<Decision>().unwrap();
    assert_eq!(
        (
            decision.count(),
            decision.remaining(),
            decision.never_fits()
        ),
        (900, 100, false)
    );
    assert!(!decision.passed() && decision.over_limit());
    let never = call("5000").await.unwrap();
    assert_eq!(never.headers()["ratelimit"], "\"tokens\";r=100;t=45");
    assert!(never.headers().get("retry-after").is_none());
    assert_eq!(backend.count("tokens").await, Some(900), "nothing spent");
    assert_eq!(call("100").await.unwrap().status(), StatusCode::OK);
    let full = call("300").await.unwrap();
    assert_eq!(full.headers()["ratelimit"], "\"tokens\";r=0;t=45");
}

#[tokio::test(start_paused = true)]
async fn a_denial_by_cost_in_shadow_mode_passes_showing_what_is_left() {
    let layer = RateLimitLayer::new("tokens", quota(10, 60))
        .shadow(true)
        .decision_in(DecisionIn::Response)
        .cost_fn(|req| {
            req.headers()
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        });
    let service = layer.layer(streaming());
    let call = |cost: &str| service.clone().oneshot(request(&[("x-cost", cost)]));
    assert_eq!(call("8").await.unwrap().status(), StatusCode::OK);
    let shadowed = call("3").await.unwrap();
    assert_eq!(shadowed.status(), StatusCode::OK);
    assert_eq!(shadowed.headers()["ratelimit"], "\"tokens\";r=2;t=60");
    let decision = shadowed.extensions().get::<Decision>().unwrap();
    assert!(decision.passed() && decision.over_limit(), "shadowed");
    assert_eq!((decision.count(), decision.remaining()), (8, 2));
}

#[tokio::test(start_paused = true)]
async fn a_lockout_by_cost_shows_nothing_left() {
    let layer = RateLimitLayer::new("otp", quota(5, 60))
        .block_for(Window::new(Duration::from_secs(600)).unwrap())
        .cost(3);
    let service = layer.layer(streaming());
    let call = || service.clone().oneshot(request(&[]));
    assert_eq!(call().await.unwrap().status(), StatusCode::OK);
    for attempt in ["locks it", "locked"] {
        let locked = call().await.unwrap();
        assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS, "{attempt}");
        assert_eq!(
            locked.headers()["ratelimit"],
            "\"otp\";r=0;t=600",
            "{attempt}"
        );
        assert_eq!(locked.headers()["retry-after"], "600", "{attempt}");
    }
}

/// A limit held in the store applies to costs and lockouts as the layer's
/// own quota does: a cost is spent against it, and a request that does not
/// fit it locks the key out.
#[tokio::test(start_paused = true)]
async fn costs_and_lockouts_follow_a_stored_limit() {
    use tower_pinned_window::LimitBook;
    use tower_pinned_window::backend::LimitScope;

    let backend = MemoryBackend::new().tokio_clock();
    let book = LimitBook::new(&backend, Duration::from_secs(1)).unwrap();
    // Set before the first request: its copy is read in the background,
    // and the first request finds none yet.
    book.set("otp", LimitScope::Layer, quota(7, 60))
        .await
        .unwrap();
    let layer = RateLimitLayer::new("otp", quota(100, 60))
        .backend(backend)
        .limits(book)
        .block_for(Window::new(Duration::from_secs(600)).unwrap())
        .cost(3);
    let service = layer.layer(streaming());
    let call = || service.clone().oneshot(request(&[]));
    // The first request reads the store (and is judged by the quota as
    // built): 3 of 100.
    let first = call().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // 6 of 7: fits; 9 of 7 does not, and locks the key out.
    let second = call().await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(second.headers()["ratelimit"], "\"otp\";r=1;t=60");
    let locked = call().await.unwrap();
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(locked.headers()["ratelimit"], "\"otp\";r=0;t=600");
    assert_eq!(locked.headers()["retry-after"], "600");
}

/// A store that is out: every call fails.
#[derive(Clone, Debug)]
struct Out;

type Failed<T> = std::future::Ready<Result<T, BackendError>>;

fn failed<T>() -> Failed<T> {
    std::future::ready(Err(BackendError::Unavailable("out".into())))
}

impl Backend for Out {
    type Future = Failed<tower_pinned_window::backend::Hits>;
    type Refund = Failed<bool>;

    fn hit_all(&self, _: &Key, _: &[Counter<'_>]) -> Self::Future {
        failed()
    }

    fn refund(&self, _: &str, _: &Key, _: &Hit) -> Self::Refund {
        failed()
    }

    async fn peek(&self, _: &str, _: &Key) -> Result<Option<Hit>, BackendError> {
        failed().await
    }

    async fn reset(&self, _: &str, _: &Key) -> Result<bool, BackendError> {
        failed().await
    }
}

impl Spending for Out {
    fn spend_all(&self, _: &Key, _: &[Counter<'_>], _: Spend) -> Self::Future {
        failed()
    }

    fn amend(&self, _: &str, _: &Key, _: &Hit, _: Amend) -> Self::Refund {
        failed()
    }
}

fn by_max_tokens(req: &tower_pinned_window::key::RequestHead<'_>) -> u64 {
    req.headers()
        .get("x-max-tokens")
        .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_cost_that_never_fits_is_denied_even_when_the_store_is_out() {
    use tower_pinned_window::FailurePolicy;
    for failure in [FailurePolicy::FailOpen, FailurePolicy::FailClosed] {
        let layer = RateLimitLayer::new("tokens", quota(1000, 60))
            .backend(Out)
            .on_failure(failure)
            .cost_fn(by_max_tokens);
        let service = layer.layer(streaming());
        let call = |tokens: &str| {
            service
                .clone()
                .oneshot(request(&[("x-max-tokens", tokens)]))
        };
        let never = call("5000").await.unwrap();
        assert_eq!(never.status(), StatusCode::TOO_MANY_REQUESTS, "{failure:?}");
        // What is left is not known: nothing is promised.
        assert_eq!(never.headers()["ratelimit"], "\"tokens\";r=0;t=60");
        assert!(never.headers().get("retry-after").is_none(), "{failure:?}");
        assert!(
            never
                .extensions()
                .get::<Decision>()
                .is_some_and(Decision::never_fits)
        );
        let fits = call("300").await.unwrap().status();
        let want = match failure {
            FailurePolicy::FailOpen => StatusCode::OK,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        assert_eq!(fits, want, "a cost that fits follows the policy");
    }
}

#[tokio::test(start_paused = true)]
async fn a_grpc_cost_that_never_fits_gets_no_retry_info() {
    let layer = RateLimitLayer::new("tokens", quota(1000, 60)).cost_fn(by_max_tokens);
    let grpc = |tokens: &str| {
        request(&[
            ("x-max-tokens", tokens),
            ("content-type", "application/grpc"),
        ])
    };
    let service = layer.layer(streaming());
    assert_eq!(
        service.clone().oneshot(grpc("300")).await.unwrap().status(),
        StatusCode::OK
    );
    let never = service.clone().oneshot(grpc("5000")).await.unwrap();
    assert_eq!(never.headers()["grpc-status"], "8");
    assert_eq!(never.headers()["ratelimit"], "\"tokens\";r=700;t=60");
    assert!(
        never.headers().get("grpc-status-details-bin").is_none(),
        "no RetryInfo: no wait brings room"
    );
    assert!(never.headers().get("retry-after").is_none());
    // A denial that a wait does help carries its RetryInfo.
    for _ in 0..2 {
        service.clone().oneshot(grpc("300")).await.unwrap();
    }
    let later = service.clone().oneshot(grpc("300")).await.unwrap();
    assert_eq!(later.headers()["ratelimit"], "\"tokens\";r=100;t=60");
    assert!(later.headers().get("grpc-status-details-bin").is_some());
}

#[tokio::test(start_paused = true)]
async fn count_if_with_a_cost_refunds_the_whole_cost() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("api", quota(10, 60))
        .backend(backend.clone())
        .cost(3)
        .count_if(|res| res.is_failure());
    let service = layer.layer(streaming());
    let ok = service.clone().oneshot(request(&[])).await.unwrap();
    let decision = ok.extensions().get::<Decision>().unwrap();
    assert!(decision.refunded());
    assert_eq!(decision.count(), 0);
    assert_eq!(
        backend.count("api").await,
        Some(0),
        "the cost of 3 refunded"
    );
    let failed = service
        .clone()
        .oneshot(request(&[("x-status", "500")]))
        .await
        .unwrap();
    assert!(!failed.extensions().get::<Decision>().unwrap().refunded());
    assert_eq!(backend.count("api").await, Some(3));
}

/// A store, and the streaming service behind a layer of 1,000 tokens a
/// minute charged from each answer's `x-usage` trailer.
fn charged_by_usage() -> (
    Recorded,
    impl tower::Service<
        Request<()>,
        Response = Response<tower_pinned_window::cost::Metered<Frames>>,
        Error = Infallible,
    > + Clone,
) {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("tokens", quota(1000, 60))
        .backend(backend.clone())
        .charge(usage_in_trailers);
    (backend, layer.layer(streaming()))
}

#[tokio::test(start_paused = true)]
async fn a_charge_lands_when_a_streamed_body_ends_and_may_pass_the_limit() {
    let (backend, service) = charged_by_usage();
    let call = |usage: &str| service.clone().oneshot(request(&[("x-usage", usage)]));
    let response = call("700").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit"], "\"tokens\";r=1000;t=60");
    assert_eq!(
        backend.count("tokens").await,
        Some(0),
        "the window is opened at 0, the charge not yet known"
    );
    let body = response.into_body().collect().await.unwrap();
    assert_eq!(body.trailers().unwrap()["x-usage"], "700");
    assert_eq!(
        backend.count("tokens").await,
        Some(700),
        "charged at the end"
    );
    // Under the limit: admitted; its charge takes the count past it.
    let response = call("700").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    assert_eq!(backend.count("tokens").await, Some(1400));
    let denied = call("1").await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "60");
    denied.into_body().collect().await.unwrap();
    assert_eq!(
        backend.count("tokens").await,
        Some(1400),
        "a denial is not charged"
    );
    advance(Duration::from_secs(60)).await;
    let response = call("5").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "the next window");
    response.into_body().collect().await.unwrap();
    assert_eq!(backend.count("tokens").await, Some(5));
}

#[tokio::test(start_paused = true)]
async fn a_charge_never_creates_a_counter_nor_reaches_another_window() {
    let (backend, service) = charged_by_usage();
    let call = |usage: &str| service.clone().oneshot(request(&[("x-usage", usage)]));
    // The window is reset while the body streams: the charge finds nothing.
    let response = call("300").await.unwrap();
    assert!(backend.reset("tokens", &Key::new("*")).await.unwrap());
    response.into_body().collect().await.unwrap();
    assert_eq!(backend.count("tokens").await, None, "never created");
    // Its window closed and another opened: the charge does not cross.
    let late = call("300").await.unwrap();
    advance(Duration::from_secs(61)).await;
    let next = call("1").await.unwrap();
    next.into_body().collect().await.unwrap();
    late.into_body().collect().await.unwrap();
    assert_eq!(
        backend.count("tokens").await,
        Some(1),
        "only its own window"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_mid_stream_is_charged_and_a_plain_one_from_its_head() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("tokens", quota(1000, 60))
        .backend(backend.clone())
        .charge(|end| {
            let header = end.headers().get("x-usage");
            let usage: u64 = header.map_or(0, |v| v.to_str().unwrap().parse().unwrap());
            if end.complete() { usage } else { usage * 2 }
        });
    let head_usage = service_fn(|_request: Request<()>| async {
        let mut response = Response::new(Frames(
            vec![
                Frame::data(Bytes::from_static(b"a")),
                Frame::data(Bytes::from_static(b"b")),
            ]
            .into_iter(),
        ));
        response
            .headers_mut()
            .insert("x-usage", "10".parse().unwrap());
        Ok::<_, Infallible>(response)
    });
    let service = layer.layer(head_usage);
    let mut body = service
        .clone()
        .oneshot(request(&[]))
        .await
        .unwrap()
        .into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "a");
    assert_eq!(backend.count("tokens").await, Some(0));
    drop(body);
    assert_eq!(
        backend.count("tokens").await,
        Some(20),
        "charged when dropped, marked incomplete"
    );
    let body = service.oneshot(request(&[])).await.unwrap().into_body();
    body.collect().await.unwrap();
    assert_eq!(backend.count("tokens").await, Some(30));
}

#[tokio::test(start_paused = true)]
async fn a_lockout_is_pinned_and_outlasts_the_window() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("otp", quota(2, 60))
        .backend(backend.clone())
        .block_for(Window::new(Duration::from_secs(600)).unwrap());
    let service = layer.layer(streaming());
    let call = || service.clone().oneshot(request(&[]));
    for _ in 0..2 {
        assert_eq!(call().await.unwrap().status(), StatusCode::OK);
    }
    let locked = call().await.unwrap();
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(locked.headers()["retry-after"], "600");
    assert_eq!(locked.headers()["ratelimit"], "\"otp\";r=0;t=600");
    advance(Duration::from_secs(100)).await;
    let locked = call().await.unwrap();
    assert_eq!(locked.headers()["retry-after"], "500", "never extended");
    advance(Duration::from_secs(499)).await;
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the window closed long ago; the lockout holds"
    );
    advance(Duration::from_secs(1)).await;
    assert_eq!(call().await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn reset_if_clears_the_run_and_never_creates_a_counter() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("login", quota(3, 900))
        .backend(backend.clone())
        .reset_if(|res| res.status() == StatusCode::OK);
    let service = layer.layer(streaming());
    let call = |status: &str| service.clone().oneshot(request(&[("x-status", status)]));
    for _ in 0..2 {
        call("401").await.unwrap();
    }
    assert_eq!(backend.count("login").await, Some(2));
    let ok = call("200").await.unwrap();
    let decision = ok.extensions().get::<Decision>().unwrap();
    assert!(decision.cleared());
    assert_eq!(decision.count(), 0);
    assert_eq!(backend.count("login").await, None, "cleared, not recreated");
    for _ in 0..3 {
        assert_eq!(
            call("401").await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    let denied = call("200").await.unwrap();
    assert_eq!(
        denied.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a denial resets nothing"
    );
    assert_eq!(backend.count("login").await, Some(3));
}

/// Charged answers still go through axum (its `IntoResponse` takes the
/// metered body) and other tower layers.
#[tokio::test(start_paused = true)]
async fn a_charged_layer_is_an_axum_layer() {
    use axum::{Router, routing::get};
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("tokens", quota(10, 60))
        .backend(backend.clone())
        .charge(|_| 4);
    let outer = RateLimitLayer::new("outer", quota(100, 60));
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer)
        .layer(outer);
    for _ in 0..3 {
        let response = app
            .clone()
            .oneshot(Request::new(axum::body::Body::empty()))
            .await
            .unwrap();
        axum::body::to_bytes(response.into_body(), 64)
            .await
            .unwrap();
    }
    assert_eq!(backend.count("tokens").await, Some(12));
    let _: RateLimitLayer<()> = RateLimitLayer::new("plain", quota(1, 1));
}

/// A reservation settles like a charge: a body dropped mid-stream settles
/// with what the charge reads then; a settle never recreates a counter
/// that was reset, nor reaches the window after its own.
#[tokio::test(start_paused = true)]
async fn a_reservation_settles_when_cut_short_and_only_in_its_own_window() {
    let backend = Recorded::new();
    let layer = RateLimitLayer::new("tokens", quota(1000, 60))
        .backend(backend.clone())
        .reserve(|req| {
            let header = req.headers().get("x-max-tokens");
            header.map_or(0, |v| v.to_str().unwrap().parse().unwrap())
        })
        .charge(|end| {
            let header = end.headers().get("x-usage");
            let usage: u64 = header.map_or(0, |v| v.to_str().unwrap().parse().unwrap());
            if end.complete() { usage } else { usage / 2 }
        });
    let head_usage = service_fn(|_request: Request<()>| async {
        let mut response = Response::new(Frames(
            vec![
                Frame::data(Bytes::from_static(b"a")),
                Frame::data(Bytes::from_static(b"b")),
            ]
            .into_iter(),
        ));
        response
            .headers_mut()
            .insert("x-usage", "100".parse().unwrap());
        Ok::<_, Infallible>(response)
    });
    let service = layer.layer(head_usage);
    let call = || service.clone().oneshot(request(&[("x-max-tokens", "300")]));
    let response = call().await.unwrap();
    assert_eq!(response.headers()["ratelimit"], "\"tokens\";r=700;t=60");
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(backend.count("tokens").await, Some(300), "reserved");
    drop(body);
    assert_eq!(
        backend.count("tokens").await,
        Some(50),
        "settled to what the charge read of a body cut short"
    );
    // Reset while the body streams: the settle creates nothing.
    let response = call().await.unwrap();
    assert!(backend.reset("tokens", &Key::new("*")).await.unwrap());
    response.into_body().collect().await.unwrap();
    assert_eq!(backend.count("tokens").await, None, "never recreated");
    // Its window closed and another opened: the refund does not cross.
    let late = call().await.unwrap();
    advance(Duration::from_secs(61)).await;
    let next = call().await.unwrap();
    assert_eq!(backend.count("tokens").await, Some(300));
    late.into_body().collect().await.unwrap();
    assert_eq!(
        backend.count("tokens").await,
        Some(300),
        "only its own window"
    );
    next.into_body().collect().await.unwrap();
    assert_eq!(backend.count("tokens").await, Some(100));
}
