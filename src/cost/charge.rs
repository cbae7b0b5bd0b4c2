//! The last step of the way out, for a layer with a
//! [`charge`](crate::RateLimitLayer::charge): the answer's body is wrapped
//! in [`Metered`], which reads the response's cost when the body ends (its
//! trailers, its last chunk) and hands it to the request's tab
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

/// What a [`charge`](crate::RateLimitLayer::charge) reads once the answer's
/// body has ended: the head's status and headers (as the service answered,
/// before this layer added its own), the trailers, and the last data frame.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_pinned_window::cost::ResponseEnd;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-usage-tokens", "42".parse().unwrap());
/// let end = ResponseEnd::new(StatusCode::OK, &headers);
/// let tokens = |end: &ResponseEnd| -> u64 {
///     let header = end.trailers().and_then(|t| t.get("x-usage-tokens"));
///     let header = header.or_else(|| end.headers().get("x-usage-tokens"));
///     header.and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0)
/// };
/// assert_eq!(tokens(&end), 42);
/// assert!(end.complete() && end.last_chunk().is_none());
///
/// let mut trailers = HeaderMap::new();
/// trailers.insert("x-usage-tokens", "7".parse().unwrap());
/// let streamed = ResponseEnd::new(StatusCode::OK, &headers)
///     .with_trailers(&trailers)
///     .with_last_chunk(b"data: {\"usage\": 7}\n\n");
/// assert_eq!(tokens(&streamed), 7);
/// assert_eq!(streamed.last_chunk(), Some(&b"data: {\"usage\": 7}\n\n"[..]));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ResponseEnd<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    trailers: Option<&'a HeaderMap>,
    last_chunk: Option<&'a [u8]>,
    complete: bool,
}

impl<'a> ResponseEnd<'a> {
    /// The end of a response with `status` and `headers` whose body had
    /// nothing more (no trailers, no data frame): how a test builds one.
    ///
    /// See the [example](ResponseEnd#example).
    pub fn new(status: StatusCode, headers: &'a HeaderMap) -> Self {
        Self {
            status,
            headers,
            trailers: None,
            last_chunk: None,
            complete: true,
        }
    }

    /// With `trailers`. See the [example](ResponseEnd#example).
    pub fn with_trailers(mut self, trailers: &'a HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// With `chunk` as the last data frame. See the
    /// [example](ResponseEnd#example).
    pub fn with_last_chunk(mut self, chunk: &'a [u8]) -> Self {
        self.last_chunk = Some(chunk);
        self
    }

    /// Marked as a body that did not reach its end (see
    /// [`complete`](Self::complete)).
    ///
    /// ```
    /// # use http::{HeaderMap, StatusCode};
    /// # use tower_pinned_window::cost::ResponseEnd;
    /// let headers = HeaderMap::new();
    /// assert!(!ResponseEnd::new(StatusCode::OK, &headers).cut_short().complete());
    /// ```
    pub fn cut_short(mut self) -> Self {
        self.complete = false;
        self
    }

    /// The response's status. See the [example](ResponseEnd#example).
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The response's headers, as the service answered. See the
    /// [example](ResponseEnd#example).
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The body's trailers, if it sent any (a gRPC answer's `grpc-status`,
    /// a usage count sent after the stream). See the
    /// [example](ResponseEnd#example).
    pub fn trailers(&self) -> Option<&'a HeaderMap> {
        self.trailers
    }

    /// The body's last data frame, if it had any: for a body whose frames
    /// are `Bytes` (axum's, hyper's, tonic's), the whole frame; for other
    /// buffers, the frame's first contiguous part. See the
    /// [example](ResponseEnd#example).
    pub fn last_chunk(&self) -> Option<&'a [u8]> {
        self.last_chunk
    }

    /// Whether the body reached its end. `false` when it was dropped before
    /// (the client went away mid-stream) or failed: the charge is still
    /// taken (or a reservation settled) with what was sent by then, since
    /// the service did the work; a charge that should not count then can
    /// answer 0.
    pub fn complete(&self) -> bool {
        self.complete
    }
}

/// What the request's tab does with the response's end: read its charge
/// and add it to the counters the request was counted in. Implemented by
/// the tab in `server/tab.rs`.
pub trait Meter: Send + Sync {
    /// The body ended with `end`.
    fn end(self: Box<Self>, end: &ResponseEnd<'_>);
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
                let mut end = ResponseEnd::new(*this.status, this.headers).cut_short();
                end.last_chunk = last;
                meter.end(&end);
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
                meter.end(&ResponseEnd::new(parts.status, &parts.headers));
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
                let mut end = ResponseEnd::new(*this.status, this.headers);
                end.trailers = frame.trailers_ref();
                end.last_chunk = match frame.data_ref() {
                    Some(data) => Some(data.chunk()),
                    None => this.last.as_ref().map(Buf::chunk),
                };
                meter.end(&end);
            }
            Some(Err(_)) => {
                let mut end = ResponseEnd::new(*this.status, this.headers).cut_short();
                end.last_chunk = this.last.as_ref().map(Buf::chunk);
                meter.end(&end);
            }
            None => {
                let mut end = ResponseEnd::new(*this.status, this.headers);
                end.last_chunk = this.last.as_ref().map(Buf::chunk);
                meter.end(&end);
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
        fn end(self: Box<Self>, end: &ResponseEnd<'_>) {
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
