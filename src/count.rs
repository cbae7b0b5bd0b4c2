//! Which answers count: the view of a response that
//! [`count_if`](crate::RateLimitLayer::count_if) and
//! [`reset_if`](crate::RateLimitLayer::reset_if) read once the service has
//! answered, and a [`charge`](crate::RateLimitLayer::charge) once the
//! answer's body has ended ([`ResponseHead`]); and the usual choices
//! ([`ResponseHead::is_failure`] and its siblings).

use std::sync::{Arc, OnceLock};

use http::{Extensions, HeaderMap, Response, StatusCode};

use crate::request::is_grpc;

/// Decides, from the service's answer, whether a passed request's hit counts.
pub(crate) type CountIf = Arc<dyn Fn(&ResponseHead<'_>) -> bool + Send + Sync>;

/// The service's answer, as this layer's closures read it: its status,
/// headers and extensions, as the service answered (before this layer adds
/// its own headers), and, once its body has ended, what the end showed.
///
/// - [`count_if`](crate::RateLimitLayer::count_if) and
///   [`reset_if`](crate::RateLimitLayer::reset_if) read it at the head,
///   before the body: it has no [trailers](Self::trailers) nor
///   [last chunk](Self::last_chunk) then.
/// - A [`charge`](crate::RateLimitLayer::charge) (and
///   [`BudgetLayer::charge`](crate::outbound::BudgetLayer::charge)) reads it
///   once the body has ended: with the trailers, the last data frame, and
///   whether the body was [complete](Self::complete). The body keeps only
///   the status and headers for it, so its
///   [extensions](Self::extensions) are empty then.
///
/// # Example
///
/// ```
/// use http::{Response, StatusCode};
/// use tower_pinned_window::outcome::ResponseHead;
///
/// let response = Response::builder().status(401).body(()).unwrap();
/// let head = ResponseHead::new(&response);
/// assert_eq!(head.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(head.grpc_status(), None);
///
/// // A gRPC call that failed before its first message (a "trailers-only"
/// // answer, which is how tonic answers a unary call's `Err(Status)`).
/// let failed = Response::builder()
///     .header("content-type", "application/grpc")
///     .header("grpc-status", "16")
///     .body(())
///     .unwrap();
/// assert_eq!(ResponseHead::new(&failed).grpc_status(), Some(16));
/// ```
///
/// What a charge reads, once the body has ended (how a test builds it):
///
/// ```
/// use http::{HeaderMap, Response};
/// use tower_pinned_window::outcome::ResponseHead;
///
/// let response = Response::builder().header("x-usage-tokens", "42").body(()).unwrap();
/// let end = ResponseHead::new(&response);
/// let tokens = |end: &ResponseHead| -> u64 {
///     let header = end.trailers().and_then(|t| t.get("x-usage-tokens"));
///     let header = header.or_else(|| end.headers().get("x-usage-tokens"));
///     header.and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0)
/// };
/// assert_eq!(tokens(&end), 42);
/// assert!(end.complete() && end.last_chunk().is_none());
///
/// let mut trailers = HeaderMap::new();
/// trailers.insert("x-usage-tokens", "7".parse().unwrap());
/// let streamed = ResponseHead::new(&response)
///     .with_trailers(&trailers)
///     .with_last_chunk(b"data: {\"usage\": 7}\n\n");
/// assert_eq!(tokens(&streamed), 7);
/// assert_eq!(streamed.last_chunk(), Some(&b"data: {\"usage\": 7}\n\n"[..]));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    /// `None` at the body's end: the metered body does not keep them.
    extensions: Option<&'a Extensions>,
    trailers: Option<&'a HeaderMap>,
    last_chunk: Option<&'a [u8]>,
    complete: bool,
}

impl<'a> ResponseHead<'a> {
    /// The view of `response`.
    ///
    /// See the [example](ResponseHead#example).
    pub fn new<B>(response: &'a Response<B>) -> Self {
        Self {
            status: response.status(),
            headers: response.headers(),
            extensions: Some(response.extensions()),
            trailers: None,
            last_chunk: None,
            complete: true,
        }
    }

    /// The view of a response's `parts`.
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use tower_pinned_window::outcome::ResponseHead;
    ///
    /// let mut response = Response::builder().status(403).body(()).unwrap();
    /// response.extensions_mut().insert("marked");
    /// let (parts, ()) = response.into_parts();
    /// let head = ResponseHead::from_parts(&parts);
    /// assert_eq!(head.status(), StatusCode::FORBIDDEN);
    /// assert_eq!(head.extensions().get::<&str>(), Some(&"marked"));
    /// ```
    pub fn from_parts(parts: &'a http::response::Parts) -> Self {
        Self {
            status: parts.status,
            headers: &parts.headers,
            extensions: Some(&parts.extensions),
            trailers: None,
            last_chunk: None,
            complete: true,
        }
    }

    /// The view of a response with `status` and `headers` whose body has
    /// ended with `trailers` and `last_chunk`, `complete` or cut short:
    /// what a metered body hands its charge.
    #[inline]
    pub(crate) fn ended(
        status: StatusCode,
        headers: &'a HeaderMap,
        trailers: Option<&'a HeaderMap>,
        last_chunk: Option<&'a [u8]>,
        complete: bool,
    ) -> Self {
        Self {
            status,
            headers,
            extensions: None,
            trailers,
            last_chunk,
            complete,
        }
    }

    /// With `trailers`, as the end of a body that sent them. See the
    /// [example](ResponseHead#example).
    pub fn with_trailers(mut self, trailers: &'a HeaderMap) -> Self {
        self.trailers = Some(trailers);
        self
    }

    /// With `chunk` as the body's last data frame. See the
    /// [example](ResponseHead#example).
    pub fn with_last_chunk(mut self, chunk: &'a [u8]) -> Self {
        self.last_chunk = Some(chunk);
        self
    }

    /// Marked as a body that did not reach its end (see
    /// [`complete`](Self::complete)).
    ///
    /// ```
    /// # use http::Response;
    /// # use tower_pinned_window::outcome::ResponseHead;
    /// let response = Response::new(());
    /// assert!(!ResponseHead::new(&response).cut_short().complete());
    /// ```
    pub fn cut_short(mut self) -> Self {
        self.complete = false;
        self
    }

    /// The HTTP status (`200` for every gRPC answer: see
    /// [`grpc_status`](Self::grpc_status)).
    ///
    /// See the [example](ResponseHead#example).
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers, as the service answered.
    ///
    /// See the [example](ResponseHead#example).
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions the service attached, at the head. Empty at the
    /// body's end (what a [`charge`](crate::RateLimitLayer::charge) reads):
    /// the body keeps only the status and headers. See the
    /// [example](Self::from_parts).
    pub fn extensions(&self) -> &'a Extensions {
        static NONE: OnceLock<Extensions> = OnceLock::new();
        match self.extensions {
            Some(extensions) => extensions,
            None => NONE.get_or_init(Extensions::new),
        }
    }

    /// The body's trailers, once it has ended and if it sent any (a gRPC
    /// answer's `grpc-status`, a usage count sent after the stream); `None`
    /// at the head. See the [example](ResponseHead#example).
    pub fn trailers(&self) -> Option<&'a HeaderMap> {
        self.trailers
    }

    /// The body's last data frame, once it has ended and if it had any:
    /// for a body whose frames are `Bytes` (axum's, hyper's, tonic's), the
    /// whole frame; for other buffers, the frame's first contiguous part.
    /// `None` at the head. See the [example](ResponseHead#example).
    pub fn last_chunk(&self) -> Option<&'a [u8]> {
        self.last_chunk
    }

    /// Whether the body reached its end: `false` when it was dropped
    /// before (the client went away mid-stream) or failed. A charge is
    /// still taken (or a reservation settled) with what was sent by then,
    /// since the service did the work; a charge that should not count then
    /// can answer 0. `true` at the head, whose body is not read.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The gRPC status code (`grpc-status`: 0 for OK, 16 for
    /// UNAUTHENTICATED, ...), when the answer is gRPC and carries one: in
    /// the trailers once the body has ended, or in the head.
    ///
    /// A gRPC call that fails before its first message is answered
    /// "trailers-only", with its status in the head; tonic answers a unary
    /// handler's `Err(Status)` that way. A call that sends messages puts its
    /// status in the trailers, after the body: at the head
    /// ([`count_if`](crate::RateLimitLayer::count_if),
    /// [`reset_if`](crate::RateLimitLayer::reset_if), which do not wait for
    /// the body) it has none, and this is `None`; at the body's end (a
    /// [`charge`](crate::RateLimitLayer::charge)) it is read from the
    /// trailers.
    ///
    /// See the [example](ResponseHead#example).
    pub fn grpc_status(&self) -> Option<i32> {
        if !is_grpc(self.headers) {
            return None;
        }
        let value = match self
            .trailers
            .and_then(|trailers| trailers.get("grpc-status"))
        {
            Some(value) => value,
            None => self.headers.get("grpc-status")?,
        };
        let value = value.to_str().ok()?;
        if value.is_empty() || value.len() > 2 || !value.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        value.parse().ok()
    }

    /// Whether the answer is a failure: an HTTP status of 400 or more, or a
    /// gRPC error (any `grpc-status` but 0). "Five failed logins a minute";
    /// what express-rate-limit calls `skipSuccessfulRequests`:
    /// `count_if(|res| res.is_failure())`.
    ///
    /// Like each of the usual choices below, it reads the HTTP status and,
    /// for a gRPC answer, its [`grpc_status`](Self::grpc_status): at the
    /// head, a status the call sends in its trailers is not seen.
    ///
    /// ```
    /// use http::Response;
    /// use tower_pinned_window::outcome::ResponseHead;
    ///
    /// let status = |code: u16| Response::builder().status(code).body(()).unwrap();
    /// let head = |code| ResponseHead::new(&status(code)).is_failure();
    /// assert!(head(401) && !head(302));
    /// assert!(ResponseHead::new(&status(403)).is_auth_failure());
    /// assert!(!ResponseHead::new(&status(404)).is_auth_failure());
    /// assert!(ResponseHead::new(&status(503)).is_server_error());
    /// assert!(ResponseHead::new(&status(201)).is_success());
    /// assert!(!ResponseHead::new(&status(302)).is_success());
    /// ```
    pub fn is_failure(&self) -> bool {
        self.status.as_u16() >= 400 || self.grpc_error().is_some()
    }

    /// Whether the answer is a failed authentication: `401 Unauthorized` or
    /// `403 Forbidden`, or gRPC UNAUTHENTICATED (16) or PERMISSION_DENIED
    /// (7). A wrong password counts; a malformed request (400) or a server
    /// error does not. See the [example](Self::is_failure).
    pub fn is_auth_failure(&self) -> bool {
        matches!(
            self.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) || matches!(self.grpc_error(), Some(7 | 16))
    }

    /// Whether the answer is a server error: an HTTP status of 500 or more,
    /// or the gRPC codes that map to them: UNKNOWN (2), DEADLINE_EXCEEDED
    /// (4), UNIMPLEMENTED (12), INTERNAL (13), UNAVAILABLE (14) and DATA_LOSS
    /// (15). A circuit-breaker style budget for a client whose requests keep
    /// failing the server. See the [example](Self::is_failure).
    pub fn is_server_error(&self) -> bool {
        self.status.is_server_error()
            || matches!(self.grpc_error(), Some(2 | 4 | 12 | 13 | 14 | 15))
    }

    /// Whether the answer is a success: an HTTP status from 200 to 299 and
    /// no gRPC error. "Ten accounts created an hour";
    /// express-rate-limit's `skipFailedRequests`. Redirects (3xx) are not
    /// successes. See the [example](Self::is_failure).
    pub fn is_success(&self) -> bool {
        self.status.is_success() && self.grpc_error().is_none()
    }

    /// A gRPC error: a status other than OK.
    fn grpc_error(&self) -> Option<i32> {
        self.grpc_status().filter(|&code| code != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> Response<()> {
        Response::builder().status(status).body(()).unwrap()
    }

    fn grpc(code: Option<&str>) -> Response<()> {
        let mut builder = Response::builder().header("content-type", "application/grpc+proto");
        if let Some(code) = code {
            builder = builder.header("grpc-status", code);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn grpc_status_is_read_from_grpc_heads_only() {
        let cases = [
            ("ok", grpc(Some("0")), Some(0)),
            ("unauthenticated", grpc(Some("16")), Some(16)),
            ("in the trailers", grpc(None), None),
            ("not a number", grpc(Some("x")), None),
            ("signed", grpc(Some("-1")), None),
            ("too long", grpc(Some("100")), None),
            ("empty", grpc(Some("")), None),
        ];
        for (name, response, want) in cases {
            assert_eq!(ResponseHead::new(&response).grpc_status(), want, "{name}");
        }
        let plain = Response::builder()
            .header("grpc-status", "16")
            .body(())
            .unwrap();
        assert_eq!(
            ResponseHead::new(&plain).grpc_status(),
            None,
            "not a gRPC answer"
        );
    }

    #[test]
    fn at_the_bodys_end_the_grpc_status_is_read_from_the_trailers() {
        let streamed = grpc(None);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "16".parse().unwrap());
        let head = ResponseHead::new(&streamed);
        assert_eq!(head.grpc_status(), None, "at the head: not sent yet");
        let end = head.with_trailers(&trailers);
        assert_eq!(end.grpc_status(), Some(16), "at the end");
        assert!(end.is_auth_failure() && end.is_failure() && !end.is_success());
        let failed = grpc(Some("7"));
        assert_eq!(
            ResponseHead::new(&failed)
                .with_trailers(&HeaderMap::new())
                .grpc_status(),
            Some(7),
            "trailers-only: the head's"
        );
        let plain = http(200);
        assert_eq!(
            ResponseHead::new(&plain)
                .with_trailers(&trailers)
                .grpc_status(),
            None,
            "not a gRPC answer"
        );
    }

    #[test]
    fn a_metered_bodys_end_has_no_extensions() {
        let headers = HeaderMap::new();
        let end = ResponseHead::ended(StatusCode::OK, &headers, None, Some(b"last"), false);
        assert!(end.extensions().is_empty());
        assert_eq!(end.last_chunk(), Some(&b"last"[..]));
        assert!(!end.complete() && end.trailers().is_none());
        let mut response = http(200);
        response.extensions_mut().insert(7u8);
        let head = ResponseHead::new(&response);
        assert_eq!(head.extensions().get::<u8>(), Some(&7));
        assert!(head.complete() && head.last_chunk().is_none() && head.trailers().is_none());
    }

    #[test]
    fn the_choices_read_http_and_grpc_statuses() {
        type Choice = fn(&ResponseHead<'_>) -> bool;
        type Named = (&'static str, Choice);
        #[allow(non_upper_case_globals)]
        const Failures: Named = ("Failures", |r| r.is_failure());
        #[allow(non_upper_case_globals)]
        const AuthFailures: Named = ("AuthFailures", |r| r.is_auth_failure());
        #[allow(non_upper_case_globals)]
        const ServerErrors: Named = ("ServerErrors", |r| r.is_server_error());
        #[allow(non_upper_case_globals)]
        const Successes: Named = ("Successes", |r| r.is_success());
        let cases: Vec<(&str, Named, Response<()>, bool)> = vec![
            ("200 is no failure", Failures, http(200), false),
            ("302 is no failure", Failures, http(302), false),
            ("400 is a failure", Failures, http(400), true),
            ("401 is a failure", Failures, http(401), true),
            ("500 is a failure", Failures, http(500), true),
            ("gRPC ok is no failure", Failures, grpc(Some("0")), false),
            ("gRPC trailers unseen", Failures, grpc(None), false),
            ("gRPC not found", Failures, grpc(Some("5")), true),
            ("401", AuthFailures, http(401), true),
            ("403", AuthFailures, http(403), true),
            ("400 is not auth", AuthFailures, http(400), false),
            ("404 is not auth", AuthFailures, http(404), false),
            ("500 is not auth", AuthFailures, http(500), false),
            ("gRPC unauthenticated", AuthFailures, grpc(Some("16")), true),
            (
                "gRPC permission denied",
                AuthFailures,
                grpc(Some("7")),
                true,
            ),
            (
                "gRPC invalid argument",
                AuthFailures,
                grpc(Some("3")),
                false,
            ),
            ("500", ServerErrors, http(500), true),
            ("503", ServerErrors, http(503), true),
            ("499 is not", ServerErrors, http(499), false),
            ("gRPC internal", ServerErrors, grpc(Some("13")), true),
            ("gRPC unavailable", ServerErrors, grpc(Some("14")), true),
            ("gRPC unknown", ServerErrors, grpc(Some("2")), true),
            (
                "gRPC resource exhausted",
                ServerErrors,
                grpc(Some("8")),
                false,
            ),
            ("200", Successes, http(200), true),
            ("204", Successes, http(204), true),
            ("302 is not", Successes, http(302), false),
            ("404 is not", Successes, http(404), false),
            ("gRPC in trailers", Successes, grpc(None), true),
            ("gRPC ok", Successes, grpc(Some("0")), true),
            ("gRPC error", Successes, grpc(Some("16")), false),
        ];
        for (name, (which, counts), response, want) in cases {
            assert_eq!(
                counts(&ResponseHead::new(&response)),
                want,
                "{which}: {name}"
            );
        }
    }
}
