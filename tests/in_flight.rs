//! The in-flight cap through its layer, on the memory backend: a slot is
//! held from before the service is called until the answer's body ends,
//! and given back however the request ends (a body read or dropped, a
//! panicking handler, a cancelled call, a client gone mid-stream); leases
//! are extended while a request runs; the failure policies; gRPC; and a
//! cap beside a rate-limit layer's quotas, decided in one store step.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_pinned_window::backend::{
    Backend, BackendError, Cap, Counter, Held, Hit, Leasing, MemoryBackend, SlotId, Taken,
};
use tower_pinned_window::key::Key;
use tower_pinned_window::{ConfigError, FailurePolicy, InFlight, InFlightLayer, Share, Window};

use support::http::{by_client, from, ok_service};

fn cap(max: u64, lease: Duration) -> InFlight {
    InFlight::new(max, lease).unwrap()
}

/// One request through a clone of `service`, answered.
async fn ask<S, B>(service: &S) -> Response<B>
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    service
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap()
}

fn header(response: &Response<impl Sized>, name: &str) -> String {
    response.headers()[name].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_slot_is_held_until_the_body_ends_or_is_dropped() {
    let layer = InFlightLayer::new("jobs", cap(1, Duration::from_secs(30))).key(by_client());
    let mut service = layer.layer(ok_service());
    let first = service
        .ready()
        .await
        .unwrap()
        .call(from("a"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit"), "\"jobs\";r=0");
    assert_eq!(
        header(&first, "ratelimit-policy"),
        "\"jobs\";q=1;qu=\"concurrent-requests\""
    );
    assert!(first.body().holds_slot());
    assert_eq!(layer.held(), 1);

    let refused = service
        .ready()
        .await
        .unwrap()
        .call(from("a"))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), "30");
    assert_eq!(header(&refused, "ratelimit"), "\"jobs\";r=0;t=30");
    assert!(!refused.body().holds_slot());
    let other = service
        .ready()
        .await
        .unwrap()
        .call(from("b"))
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another key has its own cap"
    );
    drop(other);

    // Read to its end, the body gives the slot back.
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    assert_eq!(layer.held(), 0);
    let second = service
        .ready()
        .await
        .unwrap()
        .call(from("a"))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    // Dropped unread, too.
    drop(second);
    let third = service
        .ready()
        .await
        .unwrap()
        .call(from("a"))
        .await
        .unwrap();
    assert_eq!(third.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_panicking_handler_gives_its_slot_back() {
    let panicked = Arc::new(AtomicBool::new(false));
    let inner = {
        let panicked = Arc::clone(&panicked);
        service_fn(move |_request: Request<String>| {
            let panicked = Arc::clone(&panicked);
            async move {
                if !panicked.swap(true, Ordering::SeqCst) {
                    panic!("the handler fails");
                }
                Ok::<_, Infallible>(Response::new(String::from("ok")))
            }
        })
    };
    let layer = InFlightLayer::new("jobs", cap(1, Duration::from_secs(30)));
    let service = layer.layer(inner);
    let crashed = tokio::spawn(service.clone().oneshot(Request::new(String::new()))).await;
    assert!(crashed.unwrap_err().is_panic());
    assert_eq!(layer.held(), 0, "the slot went back as the call unwound");
    let next = service.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_cancelled_call_gives_its_slot_back() {
    let inner = service_fn(|_request: Request<String>| async {
        std::future::pending::<()>().await;
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let layer = InFlightLayer::new("jobs", cap(1, Duration::from_secs(30)));
    let service = layer.layer(inner);
    let call = service.clone().oneshot(Request::new(String::new()));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err()
    );
    assert_eq!(layer.held(), 0, "the call was dropped: its slot went back");
    let waiting = service.clone().oneshot(Request::new(String::new()));
    let refused = tokio::select! {
        _ = waiting => unreachable!("the handler never answers"),
        refused = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            ask(&service).await
        } => refused,
    };
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "while a call runs, its slot is held"
    );
}

/// One frame, then nothing more, ever: a stream that never ends.
struct Endless {
    sent: bool,
}

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent {
            return Poll::Pending;
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first chunk\n")))))
    }
}

#[tokio::test]
async fn a_client_gone_mid_stream_frees_its_slot() {
    let layer = InFlightLayer::new("stream", cap(1, Duration::from_secs(30)));
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(|| async { axum::body::Body::new(Endless { sent: false }) }),
        )
        .layer(layer.clone());
    let server = support::http::serve(app).await;
    let addr = server.url.trim_start_matches("http://").to_owned();

    let mut client = tokio::net::TcpStream::connect(&addr).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut read = vec![0; 4096];
    let mut seen = String::new();
    while !seen.contains("first chunk") {
        let n = client.read(&mut read).await.unwrap();
        assert!(n > 0, "the stream's first chunk arrives");
        seen.push_str(&String::from_utf8_lossy(&read[..n]));
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert_eq!(layer.held(), 1, "the stream holds its slot");
    let busy = support::http::Client::new().get(&server.url).send().await;
    assert_eq!(busy.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);

    drop(client);
    let start = tokio::time::Instant::now();
    while layer.held() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the slot of a client gone is given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let served = support::http::Client::new().get(&server.url).send();
    let served = tokio::time::timeout(Duration::from_millis(200), served).await;
    assert!(served.is_err(), "served again: the new stream never ends");
}

#[tokio::test(start_paused = true)]
async fn leases_are_extended_while_a_request_runs_and_a_dead_holders_run_out() {
    let store = MemoryBackend::new().tokio_clock();
    let lease = Duration::from_millis(300);
    let layer = InFlightLayer::new("jobs", cap(1, lease))
        .backend(store.clone())
        .key(by_client());
    let service = layer.layer(ok_service());
    let held = service.clone().oneshot(from("a")).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    // Ten leases later, the running request still holds its slot.
    tokio::time::sleep(10 * lease).await;
    let refused = service.clone().oneshot(from("a")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(held);

    // A holder that never extends (a process killed while it held the
    // slot): its slot is back within the lease, and not before.
    let dead = SlotId::next();
    let key = Key::new("a");
    let taken = store
        .take(
            &key,
            Cap {
                namespace: "jobs",
                in_flight: cap(1, lease),
            },
            dead,
        )
        .await
        .unwrap();
    assert!(taken.granted);
    tokio::time::sleep(lease - Duration::from_millis(20)).await;
    let early = service.clone().oneshot(from("a")).await.unwrap();
    assert_eq!(
        early.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "not before the lease"
    );
    tokio::time::sleep(Duration::from_millis(40)).await;
    let after = service.oneshot(from("a")).await.unwrap();
    assert_eq!(after.status(), StatusCode::OK, "back within the lease");
}

#[tokio::test]
async fn two_instances_on_one_store_share_the_cap() {
    let store = MemoryBackend::new();
    let c = cap(2, Duration::from_secs(30));
    let a = InFlightLayer::new("jobs", c)
        .backend(store.clone())
        .layer(ok_service());
    let b = InFlightLayer::new("jobs", c)
        .backend(store.clone())
        .layer(ok_service());
    let one = ask(&a).await;
    let two = ask(&b).await;
    assert_eq!(
        (one.status(), two.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let three = ask(&a).await;
    assert_eq!(
        three.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "2 of 2 across both"
    );
    drop(two);
    let four = a.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(
        four.status(),
        StatusCode::OK,
        "the other instance's slot went back"
    );
    drop(one);
}

#[tokio::test]
async fn a_refused_request_waits_for_a_slot_up_to_its_bound() {
    let layer =
        InFlightLayer::new("jobs", cap(1, Duration::from_secs(30))).wait(Duration::from_secs(5));
    let service = layer.layer(ok_service());
    let first = ask(&service).await;
    let waiting = tokio::spawn(service.clone().oneshot(Request::new(String::new())));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "it waits while the slot is held");
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("served once the slot is back")
        .unwrap()
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);

    let bounded = InFlightLayer::new("jobs", cap(1, Duration::from_secs(30)))
        .wait(Duration::from_millis(150))
        .layer(ok_service());
    let held = ask(&bounded).await;
    let start = std::time::Instant::now();
    let refused = bounded.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "refused once the wait is over"
    );
    drop(held);
}

#[tokio::test]
async fn grpc_calls_are_refused_with_resource_exhausted() {
    let service = InFlightLayer::new("jobs", cap(1, Duration::from_secs(30))).layer(ok_service());
    let grpc = || {
        Request::builder()
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap()
    };
    let held = service.clone().oneshot(grpc()).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let refused = service.oneshot(grpc()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::OK, "a trailers-only answer");
    assert_eq!(header(&refused, "grpc-status"), "8");
    assert_eq!(header(&refused, "retry-after"), "30");
    drop(held);
}

/// A memory backend whose takes fail as `mode` says.
#[derive(Clone)]
struct Failing {
    inner: MemoryBackend,
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Down,
    Corrupt,
    /// The take is made in the store at once, but answered 300 ms later:
    /// past the layer's timeout.
    Slow,
}

impl Backend for Failing {
    type Future = <MemoryBackend as Backend>::Future;
    type Refund = <MemoryBackend as Backend>::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
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

impl Leasing for Failing {
    type Take = Pin<Box<dyn Future<Output = Result<Taken, BackendError>> + Send>>;

    fn take(&self, key: &Key, cap: Cap<'_>, slot: SlotId) -> Self::Take {
        match self.mode {
            Mode::Down => Box::pin(std::future::ready(Err(BackendError::Unavailable(
                "down".into(),
            )))),
            Mode::Corrupt => Box::pin(std::future::ready(Err(BackendError::Corrupt {
                key: "jobs".into(),
                detail: "not a set of slots".into(),
            }))),
            Mode::Slow => {
                let taken = self.inner.take(key, cap, slot).into_inner();
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    taken
                })
            }
        }
    }

    fn take_all(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<tower_pinned_window::backend::Spend>,
    ) -> Self::Future {
        match self.mode {
            Mode::Down => std::future::ready(Err(BackendError::Unavailable("down".into()))),
            Mode::Corrupt => std::future::ready(Err(BackendError::Corrupt {
                key: "jobs".into(),
                detail: "not a set of slots".into(),
            })),
            // The memory backend's future is answered at once: so is this.
            Mode::Slow => self.inner.take_all(key, cap, slot, counters, spend),
        }
    }

    fn give_back(
        &self,
        namespace: &str,
        key: &Key,
        slot: SlotId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static + use<> {
        let given = match self.mode {
            Mode::Slow => {
                // The memory backend answers at once.
                let call = std::pin::pin!(self.inner.give_back(namespace, key, slot));
                match call.poll(&mut Context::from_waker(std::task::Waker::noop())) {
                    Poll::Ready(given) => Some(given),
                    Poll::Pending => None,
                }
            }
            _ => None,
        };
        std::future::ready(given.unwrap_or(Err(BackendError::Unavailable("down".into()))))
    }

    fn extend(
        &self,
        _held: &[Held<'_>],
        _lease: Window,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send + 'static + use<> {
        std::future::ready(Err(BackendError::Unavailable("down".into())))
    }

    async fn in_use(&self, _namespace: &str, _key: &Key) -> Result<u64, BackendError> {
        Err(BackendError::Unavailable("down".into()))
    }
}

#[tokio::test]
async fn a_store_that_fails_is_answered_by_the_failure_policy() {
    let down = Failing {
        inner: MemoryBackend::new(),
        mode: Mode::Down,
    };
    let c = cap(4, Duration::from_secs(30));
    let call = |layer: InFlightLayer<(), Failing>| {
        layer
            .layer(ok_service())
            .oneshot(Request::new(String::new()))
    };

    let closed = call(InFlightLayer::new("jobs", c).backend(down.clone()))
        .await
        .unwrap();
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(closed.extensions().get::<Arc<BackendError>>().is_some());

    let open = InFlightLayer::new("jobs", c)
        .backend(down.clone())
        .on_failure(FailurePolicy::FailOpen);
    let passed = call(open).await.unwrap();
    assert_eq!(passed.status(), StatusCode::OK);
    assert!(
        passed.headers().get("ratelimit").is_none(),
        "uncounted: no fields"
    );
    assert!(!passed.body().holds_slot());

    // Insured: this instance holds its share of the cap, 2 of 4, in memory.
    let insured = InFlightLayer::new("jobs", c)
        .backend(down.clone())
        .on_failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()))
        .layer(ok_service());
    let one = ask(&insured).await;
    let two = ask(&insured).await;
    assert_eq!(
        (one.status(), two.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(header(&two, "ratelimit"), "\"jobs\";r=0");
    let three = ask(&insured).await;
    assert_eq!(
        three.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the share, never the cap"
    );
    drop(one);
    let four = insured.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(
        four.status(),
        StatusCode::OK,
        "a local slot goes back locally"
    );

    // Corrupt slots stop the request whatever the policy.
    let corrupt = Failing {
        inner: MemoryBackend::new(),
        mode: Mode::Corrupt,
    };
    let stopped = call(
        InFlightLayer::new("jobs", c)
            .backend(corrupt)
            .on_failure(FailurePolicy::FailOpen),
    )
    .await
    .unwrap();
    assert_eq!(stopped.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// A take the store made but answered too late (the layer's timeout) is
/// given back by its name: the slot never outlives the call that gave up.
#[tokio::test]
async fn a_take_answered_too_late_is_given_back() {
    let store = MemoryBackend::new();
    let slow = Failing {
        inner: store.clone(),
        mode: Mode::Slow,
    };
    let service = InFlightLayer::new("jobs", cap(1, Duration::from_secs(30)))
        .backend(slow)
        .layer(ok_service());
    let answer = service.oneshot(Request::new(String::new())).await.unwrap();
    assert_eq!(
        answer.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "timed out: fail closed"
    );
    assert_eq!(
        store.in_use("jobs", &Key::new("*")).await.unwrap(),
        0,
        "the slot the store took for it went back"
    );
}

#[test]
fn bad_caps_are_refused_where_they_are_made() {
    assert_eq!(
        InFlight::new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroInFlight)
    );
    assert_eq!(
        InFlight::new(1, Duration::ZERO),
        Err(ConfigError::NonPositiveWindow)
    );
    let layer = InFlightLayer::new("jobs", cap(1, Duration::from_millis(100)));
    assert_eq!(
        layer.check().err(),
        Some(ConfigError::LeaseNotAboveTimeout {
            lease_ms: 100,
            timeout_ms: 100
        })
    );
    let fine = InFlightLayer::new("jobs", cap(1, Duration::from_millis(100)))
        .timeout(Duration::from_millis(50));
    assert!(fine.check().is_ok());
    let refused =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| layer.layer(ok_service())));
    assert!(refused.is_err(), "layer() panics with check()'s error");
    assert!(InFlightLayer::try_new("bad name", cap(1, Duration::from_secs(1))).is_err());
}

/// The outbound layer's cap: a call waits in its line for a slot as for a
/// window, and holds it until its answer's body ends; a call that fails
/// gives it back at once.
#[tokio::test]
async fn outbound_calls_wait_in_their_line_for_a_slot() {
    use tower_pinned_window::Quota;
    use tower_pinned_window::outbound::BudgetLayer;

    let fail_next = Arc::new(AtomicBool::new(false));
    let client = {
        let fail_next = Arc::clone(&fail_next);
        service_fn(move |_request: Request<String>| {
            let fail = fail_next.swap(false, Ordering::SeqCst);
            async move {
                if fail {
                    return Err(std::io::Error::other("connection reset"));
                }
                Ok(Response::new(http_body_util::Full::new(
                    Bytes::from_static(b"answer"),
                )))
            }
        })
    };
    let store = MemoryBackend::new();
    let budget = BudgetLayer::new("partner", Quota::new(100, Duration::from_secs(60)).unwrap())
        .backend(store.clone())
        .in_flight(cap(1, Duration::from_secs(30)))
        .max_wait(Duration::from_secs(5));
    let client = budget.layer(client);
    let call = || client.clone().oneshot(Request::new(String::new()));

    let first = call().await.unwrap();
    assert_eq!(store.in_use("partner", &Key::new("*")).await.unwrap(), 1);
    let waiting = tokio::spawn(call());
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(!waiting.is_finished(), "the second call waits for the slot");
    // The first answer's body read to its end gives the slot back.
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "answer");
    let second = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the waiting call is sent once the slot is back")
        .unwrap()
        .unwrap();
    drop(second);
    assert_eq!(store.in_use("partner", &Key::new("*")).await.unwrap(), 0);

    // A call the client fails gives its slot back.
    fail_next.store(true, Ordering::SeqCst);
    assert!(call().await.is_err());
    assert_eq!(store.in_use("partner", &Key::new("*")).await.unwrap(), 0);
    let fine = call().await.unwrap();
    assert_eq!(fine.status(), StatusCode::OK);

    // No slot within the wait: the call fails, naming the budget.
    let short = BudgetLayer::new("partner", Quota::new(100, Duration::from_secs(60)).unwrap())
        .backend(store.clone())
        .in_flight(cap(1, Duration::from_secs(30)))
        .max_wait(Duration::from_millis(100))
        .layer(service_fn(|_request: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let err = short
        .oneshot(Request::new(String::new()))
        .await
        .unwrap_err();
    let err = err
        .downcast::<tower_pinned_window::outbound::BudgetError>()
        .expect("a budget error");
    assert!(err.to_string().contains("partner"), "{err}");
    drop(fine);
}

#[test]
#[should_panic(expected = "call `backend` before `in_flight`")]
fn an_outbound_cap_is_set_after_its_backend() {
    use tower_pinned_window::Quota;
    use tower_pinned_window::outbound::BudgetLayer;
    let _ = BudgetLayer::new("partner", Quota::new(1, Duration::from_secs(1)).unwrap())
        .in_flight(cap(1, Duration::from_secs(30)))
        .backend(MemoryBackend::new());
}

// --- An in-flight cap beside a layer's quotas: one store step for both. ---

/// A memory backend that records which of its steps are called.
#[derive(Clone, Default)]
struct Recording {
    inner: MemoryBackend,
    calls: Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl Recording {
    fn record(&self, step: &'static str) {
        self.calls.lock().unwrap().push(step);
    }

    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
}

impl Backend for Recording {
    type Future = <MemoryBackend as Backend>::Future;
    type Refund = <MemoryBackend as Backend>::Refund;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        self.record("hit_all");
        self.inner.hit_all(key, counters)
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
        self.record("refund");
        self.inner.refund(namespace, key, hit)
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        self.inner.peek(namespace, key).await
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        self.inner.reset(namespace, key).await
    }
}

impl tower_pinned_window::backend::Spending for Recording {
    fn spend_all(
        &self,
        key: &Key,
        counters: &[Counter<'_>],
        spend: tower_pinned_window::backend::Spend,
    ) -> Self::Future {
        self.record("spend_all");
        self.inner.spend_all(key, counters, spend)
    }

    fn amend(
        &self,
        namespace: &str,
        key: &Key,
        hit: &Hit,
        amend: tower_pinned_window::backend::Amend,
    ) -> Self::Refund {
        self.record("amend");
        self.inner.amend(namespace, key, hit, amend)
    }
}

impl Leasing for Recording {
    type Take = <MemoryBackend as Leasing>::Take;

    fn take(&self, key: &Key, cap: Cap<'_>, slot: SlotId) -> Self::Take {
        self.record("take");
        self.inner.take(key, cap, slot)
    }

    fn take_all(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<tower_pinned_window::backend::Spend>,
    ) -> Self::Future {
        self.record("take_all");
        self.inner.take_all(key, cap, slot, counters, spend)
    }

    fn give_back(
        &self,
        namespace: &str,
        key: &Key,
        slot: SlotId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static + use<> {
        self.record("give_back");
        self.inner.give_back(namespace, key, slot)
    }

    fn extend(
        &self,
        held: &[Held<'_>],
        lease: Window,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send + 'static + use<> {
        self.record("extend");
        self.inner.extend(held, lease)
    }

    fn in_use(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send {
        self.inner.in_use(namespace, key)
    }
}

fn quota(limit: u64) -> tower_pinned_window::Quota {
    tower_pinned_window::Quota::new(limit, Duration::from_secs(60)).unwrap()
}

fn all(response: &Response<impl Sized>, name: &str) -> Vec<String> {
    let values = response.headers().get_all(name).iter();
    values.map(|v| v.to_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn quotas_and_a_cap_are_decided_in_one_store_step() {
    let store = Recording::default();
    let layer = tower_pinned_window::RateLimitLayer::new("api", quota(2))
        .backend(store.clone())
        .in_flight(cap(1, Duration::from_secs(30)));
    let service = layer.layer(ok_service());
    let star = Key::new("*");

    let first = ask(&service).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(first.body().holds_slot());
    assert_eq!(
        all(&first, "ratelimit"),
        ["\"api\";r=1;t=60, \"api\";r=0"],
        "the quota's member and the cap's, on one line"
    );
    assert_eq!(
        all(&first, "ratelimit-policy"),
        ["\"api\";q=2;w=60, \"api\";q=1;qu=\"concurrent-requests\""]
    );
    assert_eq!(store.calls(), ["take_all"], "one store step for both");

    // The cap is full: refused, and nothing counted.
    let busy = ask(&service).await;
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&busy, "retry-after"), "30");
    assert_eq!(all(&busy, "ratelimit"), ["\"api\";r=0;t=30"]);
    assert_eq!(
        store.inner.peek("api", &star).await.unwrap().unwrap().count,
        1
    );
    let grpc = Request::builder()
        .header("content-type", "application/grpc")
        .body(String::new())
        .unwrap();
    let grpc_busy = service.clone().oneshot(grpc).await.unwrap();
    assert_eq!(header(&grpc_busy, "grpc-status"), "8", "RESOURCE_EXHAUSTED");
    assert_eq!(
        store.inner.peek("api", &star).await.unwrap().unwrap().count,
        1
    );

    // Its body read, the first gives the slot back.
    first.into_body().collect().await.unwrap();
    assert_eq!(store.inner.in_use("api", &star).await.unwrap(), 0);
    let second = ask(&service).await;
    assert_eq!(second.status(), StatusCode::OK);
    drop(second);

    // Over the quota: denied as ever, and no slot taken.
    let over = ask(&service).await;
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!over.body().holds_slot());
    assert_eq!(store.inner.in_use("api", &star).await.unwrap(), 0);
    assert_eq!(all(&over, "ratelimit"), ["\"api\";r=0;t=60"]);
    let calls = store.calls();
    assert!(
        calls.iter().all(|c| ["take_all", "give_back"].contains(c)),
        "no step but take_all and the give-backs: {calls:?}"
    );
    assert_eq!(calls.iter().filter(|c| **c == "take_all").count(), 5);
}

#[tokio::test]
async fn a_capped_layer_gives_its_slot_back_however_the_request_ends() {
    let store = MemoryBackend::new();
    let star = Key::new("*");
    let panicked = Arc::new(AtomicBool::new(false));
    let inner = {
        let panicked = Arc::clone(&panicked);
        service_fn(move |_request: Request<String>| {
            let panicked = Arc::clone(&panicked);
            async move {
                if !panicked.swap(true, Ordering::SeqCst) {
                    panic!("the handler fails");
                }
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        })
    };
    let service = tower_pinned_window::RateLimitLayer::new("api", quota(10))
        .backend(store.clone())
        .in_flight(cap(1, Duration::from_secs(30)))
        .layer(inner);
    let crashed = tokio::spawn(service.clone().oneshot(Request::new(String::new()))).await;
    assert!(crashed.unwrap_err().is_panic());
    assert_eq!(
        store.in_use("api", &star).await.unwrap(),
        0,
        "a panic gives it back"
    );
    let call = service.clone().oneshot(Request::new(String::new()));
    let cancelled = tokio::time::timeout(Duration::from_millis(50), call).await;
    assert!(cancelled.is_err(), "the handler never answers");
    assert_eq!(
        store.in_use("api", &star).await.unwrap(),
        0,
        "a cancelled call too"
    );
    assert_eq!(store.peek("api", &star).await.unwrap().unwrap().count, 2);
}

#[tokio::test]
async fn a_capped_layer_that_charges_holds_its_slot_until_the_charge() {
    let store = MemoryBackend::new();
    let star = Key::new("*");
    let inner = service_fn(|_request: Request<String>| async {
        let mut response = Response::new(String::from("done"));
        response
            .headers_mut()
            .insert("x-used", http::HeaderValue::from_static("5"));
        Ok::<_, Infallible>(response)
    });
    let service = tower_pinned_window::RateLimitLayer::new("tokens", quota(100))
        .backend(store.clone())
        .in_flight(cap(2, Duration::from_secs(30)))
        .charge(|end: &tower_pinned_window::outcome::ResponseHead<'_>| {
            end.headers()
                .get("x-used")?
                .to_str()
                .ok()?
                .parse::<u64>()
                .ok()
        })
        .layer(inner);
    let answer = ask(&service).await;
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(store.in_use("tokens", &star).await.unwrap(), 1);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "done");
    assert_eq!(
        store.in_use("tokens", &star).await.unwrap(),
        0,
        "given back at the end"
    );
    assert_eq!(
        store.peek("tokens", &star).await.unwrap().unwrap().count,
        5,
        "charged at the end"
    );
}

#[tokio::test]
async fn a_capped_layer_follows_the_failure_policy() {
    let c = cap(4, Duration::from_secs(30));
    let layer = |mode| {
        let store = Failing {
            inner: MemoryBackend::new(),
            mode,
        };
        tower_pinned_window::RateLimitLayer::new("api", quota(100))
            .backend(store)
            .in_flight(c)
    };
    let closed = ask(&layer(Mode::Down).layer(ok_service())).await;
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let open = layer(Mode::Down).on_failure(FailurePolicy::FailOpen);
    let passed = ask(&open.layer(ok_service())).await;
    assert_eq!(passed.status(), StatusCode::OK);
    assert!(!passed.body().holds_slot(), "uncounted, without a slot");

    // Insured: this instance's share of the cap, 2 of 4, in memory.
    let insured = layer(Mode::Down)
        .on_failure(FailurePolicy::Insurance(Share::one_in(2).unwrap()))
        .layer(ok_service());
    let one = ask(&insured).await;
    let two = ask(&insured).await;
    assert_eq!(
        (one.status(), two.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    assert!(two.body().holds_slot());
    assert!(
        all(&two, "ratelimit")[0].ends_with(", \"api\";r=0"),
        "{:?}",
        all(&two, "ratelimit")
    );
    let three = ask(&insured).await;
    assert_eq!(
        three.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the share, never the cap"
    );
    drop(one);
    assert_eq!(
        ask(&insured).await.status(),
        StatusCode::OK,
        "given back locally"
    );

    let corrupt = layer(Mode::Corrupt).on_failure(FailurePolicy::FailOpen);
    let stopped = ask(&corrupt.layer(ok_service())).await;
    assert_eq!(stopped.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn a_capped_layer_refuses_a_lease_within_its_timeout() {
    let layer = tower_pinned_window::RateLimitLayer::new("api", quota(10))
        .in_flight(cap(1, Duration::from_millis(100)));
    assert_eq!(
        layer.check(),
        Err(ConfigError::LeaseNotAboveTimeout {
            lease_ms: 100,
            timeout_ms: 100
        })
    );
    let fine = layer.timeout(Window::new(Duration::from_millis(50)).unwrap());
    assert_eq!(fine.check(), Ok(()));
}
