//! Reservations read from the request's body: [`BodyEstimate`] says how
//! ([`reserve_from_body`](crate::RateLimitLayer::reserve_from_body)), a
//! reader takes a bounded prefix of the body before the limiter runs, and
//! [`Replay`] hands the whole body on to the service: the bytes read, then
//! the rest of the stream, trailers included.
//!
//! Only a layer that reserves from the body reads it: its
//! [`RateLimit`](crate::RateLimit) is a `RateLimit<.., BodyEstimate>`, whose
//! [`ResponseFuture`](crate::ResponseFuture) starts by reading. Any other
//! layer's service never awaits the body.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode, request::Parts};
use http_body::{Body, Frame, SizeHint};

use crate::error::ConfigError;
use crate::request::{RequestHead, is_grpc};

/// The most bytes of a body [`BodyEstimate`] reads unless told otherwise
/// ([`BodyEstimate::body_limit`]): 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// A reading of the estimate, from the bytes of a whole body.
type ReadFn = Arc<dyn Fn(&[u8]) -> Option<u64> + Send + Sync>;

/// How a layer reads a request's reservation from its body: the reading
/// (a top-level JSON field with [`json_field`](Self::json_field), any
/// function of the bytes with [`new`](Self::new)), the estimate when it cannot read
/// one (the fallback), and how much of the body it reads at most. Given to
/// [`reserve_from_body`](crate::RateLimitLayer::reserve_from_body); the
/// guide: [`docs/costs.md#reserve-from-the-body`](crate::guide::costs#reserve-from-the-body).
///
/// - The body is read up to its end, frame by frame (a chunked body too),
///   before the limiter runs, at most [`body_limit`](Self::body_limit)
///   bytes; a `content-length` above it is known at once, unread.
/// - The fallback is reserved for a body that is empty, not of the
///   format, without the field, with a value that is not a non-negative
///   integer, that fails while it is read, or that is longer than the
///   limit (or it gets 413: [`reject_over_limit`](Self::reject_over_limit)). Reading
///   never panics.
/// - gRPC requests (`content-type: application/grpc*`) are left alone:
///   their bodies are not read, and they reserve the fallback.
/// - The service gets the body whole, as a [`Replay`]: the frames read,
///   then the rest of the stream, trailers kept.
///
/// ```
/// # #[cfg(feature = "json")] {
/// use tower_pinned_window::cost::BodyEstimate;
///
/// let estimate = BodyEstimate::json_field("max_tokens", 4096)
///     .body_limit(256 * 1024)
///     .reject_over_limit(true);
/// assert_eq!(estimate.read(br#"{"model": "m", "max_tokens": 300}"#), 300);
/// assert_eq!(estimate.read(br#"{"max_tokens": -1}"#), 4096, "not a non-negative integer");
/// assert_eq!(estimate.read(b"{not json"), 4096);
/// # }
/// ```
#[derive(Clone)]
#[must_use]
pub struct BodyEstimate {
    read: ReadFn,
    fallback: u64,
    limit: usize,
    /// A body longer than the limit is answered 413 (not given the
    /// fallback).
    reject_over_limit: bool,
}

impl BodyEstimate {
    /// The estimate `read` finds in the bytes of a whole body (`None`: it
    /// finds none, and `fallback` is reserved), read from bodies of at
    /// most [`DEFAULT_BODY_LIMIT`] bytes; a longer one reserves
    /// `fallback`.
    pub fn new<F>(fallback: u64, read: F) -> Self
    where
        F: Fn(&[u8]) -> Option<u64> + Send + Sync + 'static,
    {
        Self {
            read: Arc::new(read),
            fallback,
            limit: DEFAULT_BODY_LIMIT,
            reject_over_limit: false,
        }
    }

    /// The estimate in the top-level field `field` of a JSON object body
    /// (`max_tokens`, `max_completion_tokens`), when it is a non-negative
    /// integer; `fallback` otherwise.
    #[cfg(feature = "json")]
    pub fn json_field(field: impl Into<String>, fallback: u64) -> Self {
        let field: String = field.into();
        Self::new(fallback, move |bytes| {
            serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()?
                .get(&field)?
                .as_u64()
        })
    }

    /// Read at most `bytes` of a body (default [`DEFAULT_BODY_LIMIT`]); a
    /// longer one gets what [`reject_over_limit`](Self::reject_over_limit) says.
    ///
    /// # Panics
    /// When `bytes` is 0: no body could be read. Use
    /// [`try_body_limit`](Self::try_body_limit) for a limit known only at
    /// run time.
    #[track_caller]
    pub fn body_limit(self, bytes: usize) -> Self {
        match self.try_body_limit(bytes) {
            Ok(estimate) => estimate,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`body_limit`](Self::body_limit), for a limit known only at
    /// run time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroBodyLimit`] when `bytes` is 0.
    pub fn try_body_limit(mut self, bytes: usize) -> Result<Self, ConfigError> {
        if bytes == 0 {
            return Err(ConfigError::ZeroBodyLimit);
        }
        self.limit = bytes;
        Ok(self)
    }

    /// What a body longer than the limit gets: with `false` (the
    /// default), the [fallback](Self::new) estimate is reserved and the
    /// request goes on, its body whole; with `true`, `413 Payload Too
    /// Large` with an empty body, uncounted, and the service is not
    /// called.
    pub fn reject_over_limit(mut self, reject: bool) -> Self {
        self.reject_over_limit = reject;
        self
    }

    /// The estimate of a request whose body cannot be read.
    pub fn fallback(&self) -> u64 {
        self.fallback
    }

    /// The estimate read from `body`, the bytes of a whole body: what
    /// the reading finds, or the fallback. A body longer than the limit
    /// is not read here either.
    pub fn read(&self, body: &[u8]) -> u64 {
        if body.len() > self.limit {
            return self.fallback;
        }
        (self.read)(body).unwrap_or(self.fallback)
    }
}

impl fmt::Debug for BodyEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyEstimate")
            .field("fallback", &self.fallback)
            .field("limit", &self.limit)
            .field("reject_over_limit", &self.reject_over_limit)
            .finish_non_exhaustive()
    }
}

/// The estimate a [`BodyReader`] read, in the request's extensions for the
/// limiter's reservation.
#[derive(Debug, Clone, Copy)]
struct Estimated(u64);

/// The reservation of a request: what a [`BodyReader`] read from its body,
/// or `fallback` (a request that came another way).
pub(crate) fn estimated(head: &RequestHead<'_>, fallback: u64) -> u64 {
    head.extensions()
        .get::<Estimated>()
        .map_or(fallback, |estimated| estimated.0)
}

/// A request body handed on whole after the layer read a prefix of it (a
/// layer that [reserves from the body](crate::RateLimitLayer::reserve_from_body)):
/// the frames read, then the rest of the stream (its trailers, and an error
/// it failed with, included). The service of such a layer takes
/// `Request<Replay<B>>`.
pub struct Replay<B: Body> {
    read: std::vec::IntoIter<Bytes>,
    /// An error the body failed with while it was read, handed on after
    /// the frames read.
    error: Option<B::Error>,
    /// Trailers met while the body was read.
    trailers: Option<HeaderMap>,
    /// The rest of the stream; `None` once it ended while it was read.
    rest: Option<B>,
}

impl<B: Body> Replay<B> {
    /// `body`, none of it read.
    fn unread(body: B) -> Self {
        Self {
            read: Vec::new().into_iter(),
            error: None,
            trailers: None,
            rest: Some(body),
        }
    }

    /// The bytes read and not yet handed on.
    fn read_len(&self) -> u64 {
        self.read.as_slice().iter().map(|b| b.len() as u64).sum()
    }
}

// Nothing in a `Replay` is pinned: the rest is polled through `Pin::new`,
// as an `Unpin` body, and the error is only moved.
impl<B: Body + Unpin> Unpin for Replay<B> {}

impl<B> Body for Replay<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.read.next() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(err) = this.error.take() {
            return Poll::Ready(Some(Err(err)));
        }
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        let Some(rest) = &mut this.rest else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(rest).poll_frame(cx));
        Poll::Ready(frame.map(|frame| frame.map(|frame| frame.map_data(into_bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.read.len() == 0
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.read_len();
        let mut hint = match &self.rest {
            Some(rest) => rest.size_hint(),
            None => SizeHint::with_exact(0),
        };
        let lower = hint.lower().saturating_add(read);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint.set_lower(lower);
        hint
    }
}

impl<B: Body> fmt::Debug for Replay<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("read_bytes", &self.read_len())
            .field("trailers", &self.trailers.is_some())
            .field("rest", &self.rest.is_some())
            .finish_non_exhaustive()
    }
}

/// A frame's data as [`Bytes`]; no copy when it is `Bytes` already.
fn into_bytes<D: Buf>(mut data: D) -> Bytes {
    data.copy_to_bytes(data.remaining())
}

/// A body past the limit under
/// [`reject_over_limit`](BodyEstimate::reject_over_limit): it is answered
/// 413 ([`too_large`]), uncounted, the service not called.
#[derive(Debug)]
pub(crate) struct TooLarge;

/// What the layer does with a request once its body is read, or known
/// without reading it: on to the limiter, the body whole and the estimate
/// read, if any, in the request's extensions (without one, the fallback is
/// reserved); or 413.
pub(crate) type Read<B> = Result<Request<Replay<B>>, TooLarge>;

/// Where a request stands when it comes in: known at once, or its body to
/// read first.
pub(crate) enum Start<B: Body> {
    Now(Read<B>),
    Reading(BodyReader<B>),
}

/// The answer to a body past the limit under
/// [`reject_over_limit`](BodyEstimate::reject_over_limit): `413 Payload
/// Too Large`, with an empty body.
pub(crate) fn too_large<B: Default>() -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    response
}

/// Reads a bounded prefix of a request's body for its reservation
/// ([`BodyEstimate`]), before the limiter runs. The body must be
/// [`Unpin`] (hyper's and axum's are; box another with
/// `http_body_util::BodyExt::boxed`).
pub(crate) struct BodyReader<B> {
    /// `None` once read.
    prefix: Option<Prefix<B>>,
}

/// A request whose body is being read.
struct Prefix<B> {
    parts: Parts,
    body: B,
    read: Vec<Bytes>,
    /// The bytes in `read`.
    len: usize,
    estimate: BodyEstimate,
}

impl<B: Body> BodyReader<B> {
    /// Starts on `request`, whose body `estimate` reads: a gRPC request,
    /// or one whose `content-length` is above the limit, is known at once,
    /// unread; any other's body is read first.
    pub(crate) fn start(estimate: &BodyEstimate, request: Request<B>) -> Start<B> {
        let (parts, body) = request.into_parts();
        // gRPC bodies are left alone: the fallback is reserved.
        if is_grpc(&parts.headers) {
            return Start::Now(Ok(Request::from_parts(parts, Replay::unread(body))));
        }
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|len| len > estimate.limit as u64) {
            return Start::Now(Self::over_limit(estimate, parts, body));
        }
        Start::Reading(Self {
            prefix: Some(Prefix {
                parts,
                body,
                read: Vec::new(),
                len: 0,
                estimate: estimate.clone(),
            }),
        })
    }

    /// A body declared longer than the limit: 413, or on with the
    /// fallback.
    fn over_limit(estimate: &BodyEstimate, parts: Parts, body: B) -> Read<B> {
        match estimate.reject_over_limit {
            false => {
                tracing::debug!(
                    limit = estimate.limit,
                    "request body over the limit: reserving the fallback estimate"
                );
                Ok(Request::from_parts(parts, Replay::unread(body)))
            }
            true => {
                tracing::debug!(limit = estimate.limit, "request body over the limit: 413");
                Err(TooLarge)
            }
        }
    }
}

impl<B: Body + Unpin> BodyReader<B> {
    /// Reads the body up to its end or past the limit, then hands back
    /// what to do with the request. Polled again after it is ready, it
    /// panics.
    pub(crate) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Read<B>> {
        let r = self.prefix.as_mut().expect("the body is read once");
        // Some(error) when the body failed; frames up to its end or past
        // the limit.
        let mut error = None;
        let mut trailers = None;
        let mut ended = r.body.is_end_stream();
        let mut over = false;
        while !ended && !over {
            match ready!(Pin::new(&mut r.body).poll_frame(cx)) {
                None => ended = true,
                Some(Err(err)) => {
                    error = Some(err);
                    ended = true;
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let data = into_bytes(data);
                        r.len = r.len.saturating_add(data.len());
                        if !data.is_empty() {
                            r.read.push(data);
                        }
                        over = r.len > r.estimate.limit;
                    }
                    Err(frame) => {
                        // Trailers end the body.
                        trailers = frame.into_trailers().ok();
                        ended = true;
                    }
                },
            }
        }
        let Prefix {
            mut parts,
            body,
            read,
            len: _,
            estimate,
        } = self.prefix.take().expect("the body is read once");
        if over && estimate.reject_over_limit {
            return Poll::Ready(Err(TooLarge));
        }
        let value = if over || error.is_some() {
            estimate.fallback
        } else {
            match &read[..] {
                [] => estimate.read(&[]),
                [one] => estimate.read(one),
                many => {
                    let len = many.iter().map(Bytes::len).sum();
                    let mut whole = BytesMut::with_capacity(len);
                    for data in many {
                        whole.extend_from_slice(data);
                    }
                    estimate.read(&whole)
                }
            }
        };
        parts.extensions.insert(Estimated(value));
        let replay = Replay {
            read: read.into_iter(),
            error,
            trailers,
            rest: (!ended).then_some(body),
        };
        Poll::Ready(Ok(Request::from_parts(parts, replay)))
    }
}

impl<B> fmt::Debug for BodyReader<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let read = self.prefix.as_ref().map(|prefix| prefix.len);
        f.debug_struct("BodyReader")
            .field("read_bytes", &read)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn a_replay_hands_on_the_bytes_read_then_the_rest_with_its_length() {
        let replay = |read: &[&'static str], rest: Option<&'static str>| Replay {
            read: read
                .iter()
                .map(|s| Bytes::from_static(s.as_bytes()))
                .collect::<Vec<_>>()
                .into_iter(),
            error: None,
            trailers: None,
            rest: rest.map(|s| Full::new(Bytes::from_static(s.as_bytes()))),
        };
        let cases = [
            (
                "read, then the rest",
                replay(&["ab", "c"], Some("def")),
                "abcdef",
                6,
            ),
            ("all read", replay(&["ab", "c"], None), "abc", 3),
            (
                "none read",
                Replay::unread(Full::new(Bytes::from_static(b"xyz"))),
                "xyz",
                3,
            ),
            ("empty", replay(&[], None), "", 0),
        ];
        for (case, body, whole, len) in cases {
            assert_eq!(body.size_hint().exact(), Some(len), "{case}");
            assert_eq!(body.is_end_stream(), len == 0, "{case}");
            let bytes = body.collect().await.unwrap().to_bytes();
            assert_eq!(bytes, whole, "{case}");
        }
    }
}
