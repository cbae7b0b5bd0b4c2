//! Reservations read from the request's body (`reserve_from_body`), on the
//! memory backend: the estimate a JSON field gives, the fallback for a body
//! that gives none (missing field, malformed, failing, over the limit), 413
//! when asked for, gRPC bodies left alone, and the body the service gets:
//! whole, trailers kept.

use std::collections::VecDeque;
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
use tower::{Layer, ServiceExt, service_fn};
use tower_pinned_window::backend::{Backend, MemoryBackend};
use tower_pinned_window::cost::{BodyEstimate, Replay};
use tower_pinned_window::key::Key;
use tower_pinned_window::outcome::ResponseHead;
use tower_pinned_window::{ConfigError, Quota, RateLimitLayer};

/// The estimate of a body that gives none.
const FALLBACK: u64 = 256;
/// The budget: 1000 a minute.
const LIMIT: u64 = 1000;

/// A request body in frames, handed out one a poll; with `pause`, each
/// frame comes after a `Pending` (a body that streams in). Counts its
/// polls.
struct Chunks {
    frames: VecDeque<Result<Frame<Bytes>, std::io::Error>>,
    pause: bool,
    paused: bool,
    polls: Arc<AtomicUsize>,
}

impl Chunks {
    fn new(data: &[&str]) -> Self {
        Self {
            frames: data
                .iter()
                .map(|d| Ok(Frame::data(Bytes::copy_from_slice(d.as_bytes()))))
                .collect(),
            pause: false,
            paused: false,
            polls: Arc::default(),
        }
    }

    /// Each frame after a `Pending`.
    fn streamed(mut self) -> Self {
        self.pause = true;
        self
    }

    fn trailers(mut self, name: &'static str, value: &'static str) -> Self {
        let mut trailers = HeaderMap::new();
        trailers.insert(name, value.parse().unwrap());
        self.frames.push_back(Ok(Frame::trailers(trailers)));
        self
    }

    fn failing(mut self) -> Self {
        self.frames
            .push_back(Err(std::io::Error::other("connection reset")));
        self
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if self.pause && !self.paused {
            self.paused = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.paused = false;
        Poll::Ready(self.frames.pop_front())
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }
}

/// What the service saw of its request's body, and what the client got.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: u16,
    /// The budget left after the reservation (`RateLimit`'s `r`).
    left: Option<u64>,
    /// The body the service read: its bytes, its trailer `x-trailer`, or
    /// the error it failed with. `None`: the service was not called.
    body: Option<String>,
}

/// The service: answers with what it read of its request's body.
async fn echo(request: Request<Replay<Chunks>>) -> Result<Response<String>, Infallible> {
    let seen = match request.into_body().collect().await {
        Ok(collected) => {
            let trailer = collected
                .trailers()
                .and_then(|t| t.get("x-trailer"))
                .map(|v| v.to_str().unwrap().to_owned());
            let bytes = collected.to_bytes();
            format!("{}|{trailer:?}", String::from_utf8_lossy(&bytes))
        }
        Err(err) => format!("error: {err}"),
    };
    Ok(Response::new(seen))
}

/// Sends `request` through a fresh layer of 1000 a minute reserving what
/// `estimate` reads, to the service [`echo`].
async fn send(estimate: BodyEstimate, request: Request<Chunks>) -> (Seen, MemoryBackend) {
    let backend = MemoryBackend::new();
    let response = RateLimitLayer::new(
        "tokens",
        Quota::new(LIMIT, Duration::from_secs(60)).unwrap(),
    )
    .backend(backend.clone())
    .reserve_from_body(estimate)
    .charge(|_: &ResponseHead<'_>| None::<u64>)
    .layer(service_fn(echo))
    .oneshot(request)
    .await
    .unwrap();
    let status = response.status().as_u16();
    let left = response.headers().get("ratelimit").map(|value| {
        let value = value.to_str().unwrap();
        let r = value.split(";r=").nth(1).unwrap();
        r.split(';').next().unwrap().parse().unwrap()
    });
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = (status != 413).then(|| String::from_utf8(body.to_vec()).unwrap());
    (Seen { status, left, body }, backend)
}

fn post(body: Chunks) -> Request<Chunks> {
    Request::post("/v1/messages")
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

fn max_tokens() -> BodyEstimate {
    BodyEstimate::json_field("max_tokens", FALLBACK)
}

async fn spent(backend: &MemoryBackend) -> Option<u64> {
    let hit = backend.peek("tokens", &Key::new("*")).await.unwrap();
    hit.map(|hit| hit.count)
}

#[tokio::test]
async fn a_field_in_the_body_is_reserved_and_the_body_handed_on_whole() {
    let body = r#"{"model": "m", "max_tokens": 300, "messages": []}"#;
    let (seen, backend) = send(max_tokens(), post(Chunks::new(&[body]))).await;
    assert_eq!(
        seen,
        Seen {
            status: 200,
            left: Some(LIMIT - 300),
            body: Some(format!("{body}|None")),
        }
    );
    assert_eq!(spent(&backend).await, Some(300), "the reservation stays");
}

#[tokio::test]
async fn a_body_without_the_field_or_not_json_reserves_the_fallback() {
    let cases = [
        ("missing field", r#"{"model": "m", "messages": []}"#),
        ("malformed", r#"{"max_tokens": 300"#),
        ("not json", "max_tokens=300"),
        ("empty", ""),
        ("not an object", "[300]"),
        (
            "nested, not top-level",
            r#"{"params": {"max_tokens": 300}}"#,
        ),
        ("negative", r#"{"max_tokens": -300}"#),
        ("a fraction", r#"{"max_tokens": 2.5}"#),
        ("a string", r#"{"max_tokens": "300"}"#),
        ("null", r#"{"max_tokens": null}"#),
        ("past u64", r#"{"max_tokens": 18446744073709551616}"#),
        (
            "a stray NUL byte after the object",
            "{\"max_tokens\": 300}\u{0}",
        ),
    ];
    for (case, body) in cases {
        let (seen, _) = send(max_tokens(), post(Chunks::new(&[body]))).await;
        assert_eq!(
            seen,
            Seen {
                status: 200,
                left: Some(LIMIT - FALLBACK),
                body: Some(format!("{body}|None")),
            },
            "{case}"
        );
    }
    // No body at all.
    let (seen, _) = send(max_tokens(), post(Chunks::new(&[]))).await;
    assert_eq!(seen.left, Some(LIMIT - FALLBACK), "no body");
    // Another field, named by the user, and a reading of the body's JSON by
    // the user's own closure.
    let body = r#"{"max_completion_tokens": 40, "n": 3}"#;
    let by_field = BodyEstimate::json_field("max_completion_tokens", FALLBACK);
    let (seen, _) = send(by_field, post(Chunks::new(&[body]))).await;
    assert_eq!(seen.left, Some(LIMIT - 40));
    let times_n = BodyEstimate::new(FALLBACK, |bytes| {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        v["max_completion_tokens"]
            .as_u64()?
            .checked_mul(v["n"].as_u64()?)
    });
    let (seen, _) = send(times_n, post(Chunks::new(&[body]))).await;
    assert_eq!(seen.left, Some(LIMIT - 120));
}

#[tokio::test]
async fn a_streamed_body_is_read_across_its_frames_and_keeps_its_trailers() {
    let frames = [
        r#"{"max_"#,
        r#"tokens": 3"#,
        r#"00, "#,
        r#""stream": true}"#,
    ];
    let body = Chunks::new(&frames).streamed().trailers("x-trailer", "t1");
    let polls = body.polls.clone();
    let (seen, _) = send(max_tokens(), post(body)).await;
    assert_eq!(
        seen,
        Seen {
            status: 200,
            left: Some(LIMIT - 300),
            body: Some(format!("{}|Some(\"t1\")", frames.concat())),
        }
    );
    assert!(
        polls.load(Ordering::SeqCst) > frames.len(),
        "the body came in over several polls"
    );
}

#[tokio::test]
async fn a_body_over_the_limit_reserves_the_fallback_and_goes_on_whole() {
    // 16 bytes at most: the field is past the limit.
    let frames = [
        r#"{"messages": ["#,
        r#""a long prompt"], "#,
        r#""max_tokens": 300}"#,
    ];
    let limited = || max_tokens().body_limit(16);
    let body = Chunks::new(&frames).streamed().trailers("x-trailer", "t2");
    let (seen, _) = send(limited(), post(body)).await;
    assert_eq!(
        seen,
        Seen {
            status: 200,
            left: Some(LIMIT - FALLBACK),
            body: Some(format!("{}|Some(\"t2\")", frames.concat())),
        },
        "chunked, no content-length: read up to the limit, then handed on"
    );
    // A content-length above the limit: not read at all.
    let whole = r#"{"max_tokens": 300, "messages": []}"#;
    let body = Chunks::new(&[whole]);
    let polls = body.polls.clone();
    let mut request = post(body);
    request
        .headers_mut()
        .insert("content-length", whole.len().into());
    let (seen, _) = send(limited(), request).await;
    assert_eq!(seen.left, Some(LIMIT - FALLBACK));
    assert_eq!(seen.body.as_deref(), Some(&*format!("{whole}|None")));
    assert_eq!(
        polls.load(Ordering::SeqCst),
        2,
        "polled by the service only: its frame, then its end"
    );
    // Exactly at the limit: read.
    let (seen, _) = send(
        max_tokens().body_limit(whole.len()),
        post(Chunks::new(&[whole])),
    )
    .await;
    assert_eq!(seen.left, Some(LIMIT - 300), "a body of the limit's length");
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_when_asked_and_spends_nothing() {
    let reject = || max_tokens().body_limit(16).reject_over_limit(true);
    let frames = [
        r#"{"messages": ["#,
        r#""a long prompt"], "#,
        r#""max_tokens": 300}"#,
    ];
    let (seen, backend) = send(reject(), post(Chunks::new(&frames).streamed())).await;
    assert_eq!(
        seen,
        Seen {
            status: 413,
            left: None,
            body: None,
        },
        "chunked"
    );
    assert_eq!(spent(&backend).await, None, "nothing counted");
    // Declared too long: refused before a byte is read.
    let body = Chunks::new(&frames);
    let polls = body.polls.clone();
    let mut request = post(body);
    request.headers_mut().insert("content-length", 64.into());
    let (seen, backend) = send(reject(), request).await;
    assert_eq!(seen.status, 413, "content-length");
    assert_eq!(polls.load(Ordering::SeqCst), 0, "not read");
    assert_eq!(spent(&backend).await, None);
    // Under the limit, a request that asks for 413 is served as any other.
    let (seen, _) = send(reject(), post(Chunks::new(&[r#"{"max_tokens":9}"#]))).await;
    assert_eq!((seen.status, seen.left), (200, Some(LIMIT - 9)));
}

#[tokio::test]
async fn a_body_that_fails_while_read_reserves_the_fallback_and_hands_on_the_error() {
    let body = Chunks::new(&[r#"{"max_tokens": 300"#]).streamed().failing();
    let (seen, _) = send(max_tokens(), post(body)).await;
    assert_eq!(
        seen,
        Seen {
            status: 200,
            left: Some(LIMIT - FALLBACK),
            body: Some("error: connection reset".into()),
        }
    );
}

#[tokio::test]
async fn grpc_bodies_are_left_alone() {
    let body = Chunks::new(&[r#"{"max_tokens": 3}"#]);
    let polls = body.polls.clone();
    let request = Request::post("/pkg.Service/Method")
        .header("content-type", "application/grpc+proto")
        .body(body)
        .unwrap();
    // A service that never reads its body.
    let backend = MemoryBackend::new();
    let service = RateLimitLayer::new(
        "tokens",
        Quota::new(LIMIT, Duration::from_secs(60)).unwrap(),
    )
    .backend(backend.clone())
    .reserve_from_body(max_tokens())
    .charge(|_: &ResponseHead<'_>| None::<u64>)
    .layer(service_fn(|_: Request<Replay<Chunks>>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(polls.load(Ordering::SeqCst), 0, "the body was not read");
    assert_eq!(spent(&backend).await, Some(FALLBACK));
}

#[test]
fn reserving_from_the_body_follows_the_rules_of_reserve() {
    let layer = || RateLimitLayer::new("t", Quota::new(10, Duration::from_secs(1)).unwrap());
    let used = |_: &ResponseHead<'_>| Some(2);
    assert_eq!(
        layer().reserve_from_body(max_tokens()).check(),
        Err(ConfigError::ReserveWithoutCharge)
    );
    assert_eq!(
        layer().charge(used).reserve_from_body(max_tokens()).check(),
        Ok(())
    );
    assert_eq!(
        layer()
            .reserve_from_body(max_tokens())
            .charge(used)
            .cost(1)
            .check(),
        Err(ConfigError::ReserveWithCost)
    );
    // A later `reserve` replaces it: the layer reads the head again, and
    // builds a plain `RateLimit`.
    let from_head: RateLimitLayer<(), _, _, _> = layer()
        .reserve_from_body(max_tokens())
        .reserve(|_| 1)
        .charge(used);
    assert_eq!(from_head.check(), Ok(()));
    // A zero body limit is refused.
    assert_eq!(
        max_tokens().try_body_limit(0).unwrap_err(),
        ConfigError::ZeroBodyLimit
    );
    assert!(max_tokens().try_body_limit(1).is_ok());
}

#[test]
#[should_panic(expected = "a body limit must be at least 1 byte")]
fn a_zero_literal_body_limit_panics() {
    let _ = max_tokens().body_limit(0);
}

#[tokio::test]
async fn reading_stops_at_the_limit_and_the_service_reads_the_rest() {
    // 15 + 18 bytes are past the limit of 16: the third frame is left to
    // the service.
    let frames = [
        r#"{"messages": ["#,
        r#""a long prompt"], "#,
        r#""max_tokens": 300}"#,
    ];
    let body = Chunks::new(&frames);
    let polls = body.polls.clone();
    let seen_polls = Arc::new(AtomicUsize::new(usize::MAX));
    let (at_call, backend) = (seen_polls.clone(), MemoryBackend::new());
    let service = RateLimitLayer::new(
        "tokens",
        Quota::new(LIMIT, Duration::from_secs(60)).unwrap(),
    )
    .backend(backend.clone())
    .reserve_from_body(max_tokens().body_limit(16))
    .charge(|_: &ResponseHead<'_>| None::<u64>)
    .layer(service_fn(move |request: Request<Replay<Chunks>>| {
        at_call.store(polls.load(Ordering::SeqCst), Ordering::SeqCst);
        echo(request)
    }));
    let response = service.oneshot(post(body)).await.unwrap();
    assert_eq!(
        seen_polls.load(Ordering::SeqCst),
        2,
        "two frames read before the limiter ran"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, format!("{}|None", frames.concat()));
    assert_eq!(spent(&backend).await, Some(FALLBACK));
}
