//! The response future's own tests: its states, polled by hand.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use tower::{Layer, Service, ServiceExt, service_fn};

use super::*;
use crate::backend::{Counter, Hit, MemoryBackend};
use crate::quota::{Quota, Window};
use crate::server::layer::RateLimitLayer;

/// The in-memory backend, answering each hit on its second poll: the
/// path of a backend that has to go out.
#[derive(Clone, Debug)]
struct Later(MemoryBackend);

struct SecondPoll<F> {
    polled: bool,
    inner: F,
}

impl<F: Future + Unpin> Future for SecondPoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if !self.polled {
            self.polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl Backend for Later {
    type Future = SecondPoll<<MemoryBackend as Backend>::Future>;
    type Refund = <MemoryBackend as Backend>::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        SecondPoll {
            polled: false,
            inner: self.0.hit_all(key, counters),
        }
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
        self.0.refund(namespace, key, hit)
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        self.0.peek(namespace, key).await
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        self.0.reset(namespace, key).await
    }
}

/// The state a passed request's future is in while the service works.
async fn state_while_serving<Bk: Backend>(layer: RateLimitLayer<(), Bk>) -> String {
    // A service that never answers: the future stays where the verdict
    // put it.
    let hangs = service_fn(|_request: Request<String>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    let mut service = layer.layer(hangs);
    let mut future = std::pin::pin!(
        service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
    );
    let mut cx = Context::from_waker(std::task::Waker::noop());
    for _ in 0..2 {
        assert!(future.as_mut().poll(&mut cx).is_pending());
    }
    format!("{future:?}")
}

#[tokio::test]
async fn only_a_layer_that_counts_by_outcome_takes_the_refund_step() {
    let quota = Quota::new(10, Duration::from_secs(60)).unwrap();
    let plain = || RateLimitLayer::new("api", quota);
    let counting = || plain().count_if(|_| true);
    let cases = [
        (
            "at once, plain",
            state_while_serving(plain()).await,
            "inner",
        ),
        (
            "at once, count_if",
            state_while_serving(counting()).await,
            "counting",
        ),
        (
            "later, plain",
            state_while_serving(plain().backend(Later(MemoryBackend::new()))).await,
            "inner",
        ),
        (
            "later, count_if",
            state_while_serving(counting().backend(Later(MemoryBackend::new()))).await,
            "counting",
        ),
    ];
    for (case, state, want) in cases {
        assert!(state.contains(&format!("\"{want}\"")), "{case}: {state}");
    }
}

/// A request body that never sends a frame.
struct Stalled;

impl http_body::Body for Stalled {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        Poll::Pending
    }
}

/// The state of the future of a request with `body`, under a layer
/// that reserves from the body, while its service works.
async fn state_reading_body<B: http_body::Body + Unpin>(body: B) -> String {
    use crate::cost::{BodyEstimate, Replay};
    use crate::outcome::ResponseHead;
    let quota = Quota::new(10, Duration::from_secs(60)).unwrap();
    let hangs = service_fn(|_request: Request<Replay<B>>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    let mut service = RateLimitLayer::new("api", quota)
        .reserve_from_body(BodyEstimate::new(1, |_| None))
        .charge(|_: &ResponseHead<'_>| None::<u64>)
        .layer(hangs);
    let mut future = std::pin::pin!(service.ready().await.unwrap().call(Request::new(body)));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    for _ in 0..2 {
        assert!(future.as_mut().poll(&mut cx).is_pending());
    }
    format!("{future:?}")
}

#[tokio::test]
async fn a_layer_that_reserves_from_the_body_reads_it_then_goes_on_as_from_the_head() {
    let stalled = state_reading_body(Stalled).await;
    assert!(stalled.contains("\"reading\""), "{stalled}");
    // Once read, the future is where a reservation from the head puts
    // it.
    let read = state_reading_body(String::from("{}")).await;
    let quota = Quota::new(10, Duration::from_secs(60)).unwrap();
    let from_head = RateLimitLayer::new("api", quota)
        .reserve(|_| 1)
        .charge(|_: &crate::outcome::ResponseHead<'_>| None::<u64>);
    let hangs = service_fn(|_request: Request<String>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    let mut service = from_head.layer(hangs);
    let mut future = std::pin::pin!(
        service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
    );
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(future.as_mut().poll(&mut cx).is_pending());
    assert_eq!(read, format!("{future:?}"));
    assert!(read.contains("\"counting\""), "{read}");
}

/// What a service that reports the decision in its request answers
/// with, behind `layer` on a backend that answers at once or later:
/// the decision the service saw, and the one its answer carries.
async fn carried<Bk: Backend>(
    layer: RateLimitLayer<(), Bk>,
    ask: bool,
) -> (Option<u64>, Option<u64>) {
    let reports = service_fn(|request: Request<String>| async move {
        let seen = request.extensions().get::<Decision>().map(Decision::count);
        Ok::<_, Infallible>(Response::new(format!("{seen:?}")))
    });
    let mut request = Request::new(String::new());
    if ask {
        request
            .extensions_mut()
            .insert(crate::decision::WantDecision);
    }
    let response = layer.layer(reports).oneshot(request).await.unwrap();
    let in_response = response.extensions().get::<Decision>().map(Decision::count);
    let seen = match response.body().as_str() {
        "None" => None,
        "Some(1)" => Some(1),
        other => panic!("{other}"),
    };
    (seen, in_response)
}

#[tokio::test]
async fn the_decision_goes_where_decision_in_says_at_once_and_later() {
    use crate::decision::DecisionIn::{Asked, Request as InRequest, Response as InResponse};
    let quota = Quota::new(10, Duration::from_secs(60)).unwrap();
    let cases = [
        (InResponse, false, (None, Some(1))),
        (InRequest, false, (Some(1), None)),
        (InRequest, true, (Some(1), Some(1))),
        (Asked, false, (None, None)),
        (Asked, true, (None, Some(1))),
    ];
    for (place, ask, want) in cases {
        let layer = || RateLimitLayer::new("api", quota).decision_in(place);
        assert_eq!(
            carried(layer(), ask).await,
            want,
            "{place:?} at once, asked: {ask}"
        );
        let later = layer().backend(Later(MemoryBackend::new()));
        assert_eq!(
            carried(later, ask).await,
            want,
            "{place:?} later, asked: {ask}"
        );
    }
}

/// A backend that is out: it fails every call at once, on its second
/// poll, or never answers (the layer's timeout ends the wait).
#[derive(Clone, Copy, Debug)]
enum Out {
    AtOnce,
    Later,
    Never,
}

impl Backend for Out {
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<crate::backend::Hits, BackendError>> + Send>>;
    type Refund = std::future::Ready<Result<bool, BackendError>>;

    fn hit_all(&self, _key: &Key, _counters: &[Counter<'_>]) -> Self::Future {
        let unavailable = || Err(BackendError::Unavailable("down".into()));
        match self {
            Self::AtOnce => Box::pin(std::future::ready(unavailable())),
            Self::Later => Box::pin(SecondPoll {
                polled: false,
                inner: std::future::ready(unavailable()),
            }),
            Self::Never => Box::pin(std::future::pending()),
        }
    }

    fn refund(&self, _namespace: &str, _key: &Key, _hit: &Hit) -> Self::Refund {
        panic!("nothing the insurance counted is refunded in the backend")
    }

    async fn peek(&self, _namespace: &str, _key: &Key) -> Result<Option<Hit>, BackendError> {
        Err(BackendError::Unavailable("down".into()))
    }

    async fn reset(&self, _namespace: &str, _key: &Key) -> Result<bool, BackendError> {
        Err(BackendError::Unavailable("down".into()))
    }
}

impl crate::backend::Spending for Out {
    fn spend_all(
        &self,
        key: &Key,
        counters: &[Counter<'_>],
        _spend: crate::backend::Spend,
    ) -> Self::Future {
        self.hit_all(key, counters)
    }

    fn amend(
        &self,
        _namespace: &str,
        _key: &Key,
        _hit: &Hit,
        _amend: crate::backend::Amend,
    ) -> Self::Refund {
        panic!("nothing the insurance counted is amended in the backend")
    }
}

/// The statuses, insured marks, counts and limits of `n` requests
/// through `layer`.
async fn answers<M: Counts<Out, String, Body = String>>(
    layer: RateLimitLayer<(), Out, crate::response::DefaultDeny, M>,
    n: usize,
) -> Vec<(u16, Option<(bool, u64, u64)>)> {
    let service = layer
        .decision_in(crate::decision::DecisionIn::Response)
        .layer(service_fn(|_request: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let mut seen = Vec::new();
    for _ in 0..n {
        let response = service
            .clone()
            .oneshot(Request::new(String::new()))
            .await
            .unwrap();
        let decision = response
            .extensions()
            .get::<Decision>()
            .map(|d| (d.insured(), d.count(), d.limit()));
        seen.push((response.status().as_u16(), decision));
    }
    seen
}

#[tokio::test]
async fn the_insurance_limiter_decides_however_the_backend_fails() {
    use crate::budget::failure::FailurePolicy;
    use crate::quota::Share;
    let quota = Quota::new(4, Duration::from_secs(60)).unwrap();
    let half = FailurePolicy::Insurance(Share::new(1, 2).unwrap());
    for out in [Out::AtOnce, Out::Later, Out::Never] {
        let layer = || {
            RateLimitLayer::new("api", quota)
                .backend(out)
                .timeout(Window::new(Duration::from_millis(20)).unwrap())
        };
        assert_eq!(
            answers(layer(), 2).await,
            vec![(503, None), (503, None)],
            "{out:?}: fail-closed by default"
        );
        let insured = vec![
            (200, Some((true, 1, 2))),
            (200, Some((true, 2, 2))),
            (429, Some((true, 3, 2))),
        ];
        assert_eq!(
            answers(layer().on_failure(half), 3).await,
            insured,
            "{out:?}: half the limit, counted locally"
        );
        // With count_if, the tab's path: an answer that does not count
        // is refunded in the insurance's own store (never in the
        // backend: `Out::refund` panics).
        assert_eq!(
            answers(layer().on_failure(half).count_if(|_| false), 3).await,
            vec![(200, Some((true, 0, 2))); 3],
            "{out:?}, count_if refunds locally"
        );
        // A denial is never served: its hit is refunded, as the
        // backend's would be.
        assert_eq!(
            answers(layer().on_failure(half).count_if(|_| true), 3).await,
            vec![
                (200, Some((true, 1, 2))),
                (200, Some((true, 2, 2))),
                (429, Some((true, 2, 2))),
            ],
            "{out:?}, count_if keeps what counts"
        );
        // A layer that spends counts its cost locally; a cost that
        // does not fit shows the count as it stands.
        assert_eq!(
            answers(layer().on_failure(half).cost(2), 2).await,
            vec![(200, Some((true, 2, 2))), (429, Some((true, 2, 2)))],
            "{out:?}, a cost of 2"
        );
        // Back to fail-closed: the insurance is gone.
        assert_eq!(
            answers(
                layer()
                    .on_failure(half)
                    .on_failure(FailurePolicy::FailClosed),
                1
            )
            .await,
            vec![(503, None)],
            "{out:?}: fail-closed again"
        );
    }
}

#[tokio::test]
async fn the_insurance_limiter_takes_charges_in_its_own_store() {
    use crate::budget::failure::FailurePolicy;
    use crate::quota::Share;
    use http_body_util::BodyExt;
    let quota = Quota::new(4, Duration::from_secs(60)).unwrap();
    for out in [Out::AtOnce, Out::Later, Out::Never] {
        let service = RateLimitLayer::new("tokens", quota)
            .backend(out)
            .timeout(Window::new(Duration::from_millis(20)).unwrap())
            .on_failure(FailurePolicy::Insurance(Share::new(1, 2).unwrap()))
            .charge(|_| 2)
            .layer(service_fn(|_request: Request<String>| async {
                Ok::<_, Infallible>(Response::new(String::from("answer")))
            }));
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let response = service
                .clone()
                .oneshot(Request::new(String::new()))
                .await
                .unwrap();
            statuses.push(response.status().as_u16());
            // The charge is taken when the body ends.
            response.into_body().collect().await.unwrap();
        }
        // Half of 4 is 2: the first answer's charge of 2 fills it.
        assert_eq!(statuses, [200, 429, 429], "{out:?}");
    }
}

/// A request from `client` (the `x-client` header).
fn from_client(client: &str) -> Request<String> {
    Request::builder()
        .header("x-client", client)
        .body(String::new())
        .unwrap()
}

/// The statuses of `requests` from `client`, through `service`, one after
/// the other.
async fn statuses<S>(service: &S, client: &str, requests: usize) -> Vec<u16>
where
    S: Service<Request<String>, Response = Response<String>> + Clone,
    S::Error: fmt::Debug,
{
    let mut statuses = Vec::new();
    for _ in 0..requests {
        let response = service.clone().oneshot(from_client(client)).await.unwrap();
        statuses.push(response.status().as_u16());
    }
    statuses
}

/// Five requests from "alice" and one from "bob" through `layer` (a limit
/// of 2), then alice's statuses, the table's entry for alice, and its
/// denials in all.
macro_rules! through {
    ($layer:expr) => {{
        let layer = $layer;
        let denied = layer.denied_keys().expect("top_denied is on");
        let ok = service_fn(|_request: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        });
        let service = layer.layer(ok);
        let alice = statuses(&service, "alice", 5).await;
        statuses(&service, "bob", 1).await;
        let entry = denied.get(&Key::new("alice")).map(|k| (k.denied, k.error));
        assert_eq!(denied.get(&Key::new("bob")), None, "bob was never denied");
        (alice, entry, denied.denials())
    }};
}

#[tokio::test]
async fn denials_are_counted_among_the_keys_denied_most_at_once_and_later() {
    use crate::denied::TopDenied;
    let quota = Quota::new(2, Duration::from_secs(60)).unwrap();
    let plain = || {
        RateLimitLayer::new("api", quota)
            .key(http::HeaderName::from_static("x-client"))
            .top_denied(TopDenied::new(8).unwrap())
    };
    let denied = vec![200, 200, 429, 429, 429];
    let cases = [
        ("at once, plain", through!(plain()), &denied),
        (
            "later, plain",
            through!(plain().backend(Later(MemoryBackend::new()))),
            &denied,
        ),
        (
            "at once, count_if",
            through!(plain().count_if(|_| true)),
            &denied,
        ),
        (
            "later, count_if",
            through!(
                plain()
                    .count_if(|_| true)
                    .backend(Later(MemoryBackend::new()))
            ),
            &denied,
        ),
        (
            "later, insured",
            through!(
                plain()
                    .on_failure(crate::FailurePolicy::Insurance(crate::Share::WHOLE))
                    .backend(Later(MemoryBackend::new()))
            ),
            &denied,
        ),
        (
            "at once, shadow: the would-be denials",
            through!(plain().shadow(true)),
            &vec![200; 5],
        ),
    ];
    for (case, (statuses, alice, denials), want) in cases {
        assert_eq!(&statuses, want, "{case}");
        assert_eq!(alice, Some((3, 0)), "{case}");
        assert_eq!(denials, 3, "{case}");
    }
}

#[tokio::test]
async fn allowed_requests_are_never_counted_among_the_keys_denied_most() {
    use crate::denied::TopDenied;
    let quota = Quota::new(100, Duration::from_secs(60)).unwrap();
    let layer = RateLimitLayer::new("api", quota)
        .key(http::HeaderName::from_static("x-client"))
        .top_denied(TopDenied::new(8).unwrap());
    let (statuses, alice, denials) = through!(layer);
    assert_eq!(statuses, [200; 5]);
    assert_eq!((alice, denials), (None, 0));
}
