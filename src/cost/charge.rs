//! The last step of the way out, for a layer with a
//! [`charge`](crate::RateLimitLayer::charge): the answer's body is wrapped
//! in [`Metered`], which hands the answer's end (a
//! [`ResponseHead`](crate::outcome::ResponseHead) with its trailers and its
//! last chunk) to the request's tab
//! ([`Meter`], implemented in `server/tab.rs` and `outbound/settle.rs`), which adds it to the counters
//! the request was counted in.
//!
//! A layer without a charge is not [`Charged`](crate::cost::Charged): its answers
//! are handed back as the service made them, with their own body type, and
//! nothing here runs.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::count::ResponseHead;

/// What the request's tab does with the response's end: read its charge
/// and add it to the counters the request was counted in. Implemented by
/// the tab in `server/tab.rs`.
pub trait Meter: Send + Sync {
    /// The body ended: `end` is the answer as its charge reads it.
    fn end(self: Box<Self>, end: &ResponseHead<'_>);
}

pin_project! {
    /// The body of an answer from a layer with a
    /// [`charge`](crate::RateLimitLayer::charge): the service's body, as it
    /// is, which applies the response's charge when it ends (its last frame,
    /// its trailers, an error, or when it is dropped). An answer the layer
    /// made itself (a denial) or that is not charged carries no meter.
    ///
    /// It implements [`http_body::Body`] with the inner body's data and
    /// error types, so axum and tonic take it as they take the body inside
    /// it, and [`Default`] when the inner body does, so another limiter
    /// outside can build its denials with it.
    ///
    /// See [`charge`](crate::RateLimitLayer::charge) for an example.
    pub struct Metered<B: Body> {
        #[pin]
        inner: B,
        meter: Option<Box<dyn Meter>>,
        // Kept only while a meter waits for the end.
        status: StatusCode,
        headers: HeaderMap,
        last: Option<B::Data>,
    }

    impl<B: Body> PinnedDrop for Metered<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(meter) = this.meter.take() {
                let last = this.last.as_ref().map(Buf::chunk);
                meter.end(&ResponseHead::ended(*this.status, this.headers, None, last, false));
            }
        }
    }
}

impl<B: Body> Metered<B> {
    /// `response`'s body, metered by `meter`, when there is one. A body
    /// already at its end is charged here, from the head.
    pub(crate) fn wrap(response: Response<B>, meter: Option<Box<dyn Meter>>) -> Response<Self> {
        let (parts, inner) = response.into_parts();
        let meter = match meter {
            Some(meter) if inner.is_end_stream() => {
                meter.end(&ResponseHead::ended(
                    parts.status,
                    &parts.headers,
                    None,
                    None,
                    true,
                ));
                None
            }
            meter => meter,
        };
        let headers = match meter {
            Some(_) => parts.headers.clone(),
            None => HeaderMap::new(),
        };
        let body = Self {
            inner,
            meter,
            status: parts.status,
            headers,
            last: None,
        };
        Response::from_parts(parts, body)
    }

    /// The body inside.
    ///
    /// ```
    /// use http_body_util::Full;
    /// use tower_pinned_window::cost::Metered;
    ///
    /// let body: Metered<Full<bytes::Bytes>> = Metered::default();
    /// let _inner: &Full<bytes::Bytes> = body.get_ref();
    /// ```
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: Body + Default> Default for Metered<B> {
    fn default() -> Self {
        Self {
            inner: B::default(),
            meter: None,
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            last: None,
        }
    }
}

impl<B: Body> fmt::Debug for Metered<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("metering", &self.meter.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Body for Metered<B>
where
    B: Body,
    B::Data: Clone,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let Some(meter) = this.meter.take() else {
            return Poll::Ready(frame);
        };
        let ended = this.inner.is_end_stream();
        match &frame {
            Some(Ok(frame)) if frame.is_data() && !ended => {
                *this.last = frame.data_ref().cloned();
                *this.meter = Some(meter);
            }
            Some(Ok(frame)) if !ended && frame.trailers_ref().is_none() => {
                // A frame of another kind: not the end yet.
                *this.meter = Some(meter);
            }
            Some(Ok(frame)) => {
                // The last frame: trailers, or the data after which the body
                // says it has ended.
                let last = match frame.data_ref() {
                    Some(data) => Some(data.chunk()),
                    None => this.last.as_ref().map(Buf::chunk),
                };
                let trailers = frame.trailers_ref();
                meter.end(&ResponseHead::ended(
                    *this.status,
                    this.headers,
                    trailers,
                    last,
                    true,
                ));
            }
            Some(Err(_)) => {
                let last = this.last.as_ref().map(Buf::chunk);
                meter.end(&ResponseHead::ended(
                    *this.status,
                    this.headers,
                    None,
                    last,
                    false,
                ));
            }
            None => {
                let last = this.last.as_ref().map(Buf::chunk);
                meter.end(&ResponseHead::ended(
                    *this.status,
                    this.headers,
                    None,
                    last,
                    true,
                ));
            }
        }
        if this.meter.is_none() {
            // Nothing more to read: drop what was kept for the end.
            *this.last = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use std::sync::{Arc, Mutex};

    /// A meter that records what it was given.
    /// What a charge saw: a header, the last chunk, whether the body was complete.
    type Sight = (Option<String>, Option<Vec<u8>>, bool);

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<Sight>>>);

    impl Meter for Seen {
        fn end(self: Box<Self>, end: &ResponseHead<'_>) {
            let trailer = end
                .trailers()
                .and_then(|t| t.get("x-usage"))
                .map(|v| v.to_str().unwrap().to_owned());
            let last = end.last_chunk().map(<[u8]>::to_vec);
            self.0.lock().unwrap().push((trailer, last, end.complete()));
        }
    }

    #[tokio::test]
    async fn the_meter_reads_the_end_of_a_stream_once() {
        let seen = Seen::default();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage", "9".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
            Ok(Frame::data(Bytes::from_static(b"one"))),
            Ok(Frame::data(Bytes::from_static(b"two"))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = Frames(frames.into_iter());
        let response = Metered::wrap(Response::new(body), Some(Box::new(seen.clone())));
        let collected = response.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-usage"], "9");
        assert_eq!(
            *seen.0.lock().unwrap(),
            [(Some("9".into()), Some(b"two".to_vec()), true)]
        );
    }

    #[tokio::test]
    async fn a_body_at_its_end_is_charged_from_the_head_and_a_dropped_one_when_dropped() {
        let seen = Seen::default();
        let empty = Metered::wrap(
            Response::new(Full::new(Bytes::new())),
            Some(Box::new(seen.clone())),
        );
        assert_eq!(seen.0.lock().unwrap().len(), 1, "charged at once");
        drop(empty);
        let full = Metered::wrap(
            Response::new(Full::new(Bytes::from_static(b"all"))),
            Some(Box::new(seen.clone())),
        );
        drop(full);
        assert_eq!(
            seen.0.lock().unwrap()[1],
            (None, None, false),
            "dropped before its end"
        );
        let full = Metered::wrap(
            Response::new(Full::new(Bytes::from_static(b"all"))),
            Some(Box::new(seen.clone())),
        );
        full.into_body().collect().await.unwrap();
        assert_eq!(
            seen.0.lock().unwrap()[2],
            (None, Some(b"all".to_vec()), true)
        );
        assert_eq!(seen.0.lock().unwrap().len(), 3, "each once");
    }

    /// A body that yields the frames it was given, then ends.
    struct Frames(std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.next())
        }
    }
}
