//! A reservation read from the request's body (`reserve_from_body` with
//! `BodyEstimate::json_field`), through the layer on the memory backend:
//! the body's bytes and the frames they come in, the read limit and what a
//! body over it gets, all from the input.
//!
//! Checked: no panic; the service gets the body's bytes whole and in order,
//! however they were cut into frames; the reservation is the field's value
//! when the body is JSON within the limit and has it as a non-negative
//! integer, the fallback otherwise; 413 only when asked for and the body is
//! over the limit, and then the service is not called and nothing is spent;
//! an estimate above the whole budget is denied without calling it.
#![no_main]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use tower::{Layer, ServiceExt, service_fn};
use tower_pinned_window::backend::{Backend, MemoryBackend};
use tower_pinned_window::cost::{BodyEstimate, Replay};
use tower_pinned_window::key::Key;
use tower_pinned_window::outcome::ResponseHead;
use tower_pinned_window::{Quota, RateLimitLayer};

/// The estimate of a body that gives none.
const FALLBACK: u64 = 7;
/// The budget: far above the fallback, so that an estimate is denied only
/// when it is above the whole budget.
const LIMIT: u64 = 1 << 62;

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// The read limit, 1 to 512 bytes.
    limit: u16,
    /// A body over the limit gets 413 (else the fallback).
    reject: bool,
    /// Where the body is cut into frames.
    cuts: Vec<u16>,
    body: Vec<u8>,
}

/// A body in frames, one a poll.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|data| Ok(Frame::data(data))))
    }
}

fuzz_target!(|input: Input| {
    let limit = usize::from(input.limit % 512) + 1;
    let mut cuts: Vec<usize> = input
        .cuts
        .iter()
        .map(|&cut| usize::from(cut) % (input.body.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut frames = VecDeque::new();
    let mut from = 0;
    for cut in cuts.into_iter().chain([input.body.len()]) {
        frames.push_back(Bytes::copy_from_slice(&input.body[from..cut]));
        from = cut;
    }

    let over = input.body.len() > limit;
    let read = (!over)
        .then(|| serde_json::from_slice::<serde_json::Value>(&input.body).ok())
        .flatten()
        .and_then(|value| value.get("max_tokens")?.as_u64());
    let want = read.unwrap_or(FALLBACK);

    let estimate = BodyEstimate::json_field("max_tokens", FALLBACK)
        .body_limit(limit)
        .reject_over_limit(input.reject);
    let called = Arc::new(AtomicBool::new(false));
    let backend = MemoryBackend::new();
    let layer = RateLimitLayer::new("fuzz", Quota::new(LIMIT, Duration::from_secs(60)).unwrap())
        .backend(backend.clone())
        .reserve_from_body(estimate)
        .charge(|_: &ResponseHead<'_>| None::<u64>);
    let service = {
        let called = Arc::clone(&called);
        layer.layer(service_fn(move |request: Request<Replay<Frames>>| {
            called.store(true, Ordering::SeqCst);
            async move {
                let seen = request.into_body().collect().await.expect("infallible");
                Ok::<_, Infallible>(Response::new(Full::new(seen.to_bytes())))
            }
        }))
    };

    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let request = Request::post("/complete")
                .header("content-type", "application/json")
                .body(Frames(frames))
                .expect("a request");
            let response = service.oneshot(request).await.expect("infallible");
            let status = response.status();
            let stored = backend.peek("fuzz", &Key::new("*")).await.expect("memory");
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                assert!(input.reject && over, "413 for a body of {} bytes, limit {limit}", input.body.len());
                assert!(!called.load(Ordering::SeqCst), "413, yet the service was called");
                assert_eq!(stored.map(|hit| hit.count), None, "413, yet something was spent");
                return;
            }
            assert!(!(input.reject && over), "over the limit and asked for 413: {status}");
            if want > LIMIT {
                // An estimate above the whole budget can never fit.
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "an estimate of {want}");
                assert!(!called.load(Ordering::SeqCst), "denied, yet the service was called");
                return;
            }
            assert_eq!(status, StatusCode::OK, "a body of {} bytes", input.body.len());
            let echoed = response.into_body().collect().await.expect("the answer's body");
            assert_eq!(echoed.to_bytes(), input.body, "the service got the body whole");
            if want > 0 {
                assert_eq!(stored.map(|hit| hit.count), Some(want), "the reservation");
            }
        })
    });
});
