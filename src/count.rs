//! Which answers count: the body-free view of a response that
//! [`count_if`](crate::RateLimitLayer::count_if) reads once the service has
//! answered, and the usual choices
//! ([`ResponseHead::is_failure`] and its siblings).

use std::sync::Arc;

use http::{Extensions, HeaderMap, Response, StatusCode};

use crate::request::is_grpc;

/// Decides, from the service's answer, whether a passed request's hit counts.
pub(crate) type CountIf = Arc<dyn Fn(&ResponseHead<'_>) -> bool + Send + Sync>;

/// The parts of a response that [`count_if`](crate::RateLimitLayer::count_if)
/// reads: everything but the body, as the service answered (before this
/// layer adds its own headers).
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
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> ResponseHead<'a> {
    /// The view of `response`.
    ///
    /// See the [example](ResponseHead#example).
    pub fn new<B>(response: &'a Response<B>) -> Self {
        Self {
            status: response.status(),
            headers: response.headers(),
            extensions: response.extensions(),
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
            extensions: &parts.extensions,
        }
    }

    /// The HTTP status (`200` for every gRPC answer: see
    /// [`grpc_status`](Self::grpc_status)).
    ///
    /// See the [example](ResponseHead#example).
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    ///
    /// See the [example](ResponseHead#example).
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions the service attached. See the
    /// [example](Self::from_parts).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The gRPC status code in the response's head (`grpc-status`: 0 for
    /// OK, 16 for UNAUTHENTICATED, ...), when the answer is gRPC and carries
    /// one there.
    ///
    /// A gRPC call that fails before its first message is answered
    /// "trailers-only", with its status in the head; tonic answers a unary
    /// handler's `Err(Status)` that way. A call that sends messages puts its
    /// status in the trailers, after the body, which this layer does not
    /// wait for: its head has none, and this is `None`.
    ///
    /// See the [example](ResponseHead#example).
    pub fn grpc_status(&self) -> Option<i32> {
        if !is_grpc(self.headers) {
            return None;
        }
        let value = self.headers.get("grpc-status")?.to_str().ok()?;
        if value.is_empty() || value.len() > 2 || !value.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        value.parse().ok()
    }

    /// Whether the answer is a failure: an HTTP status of 400 or more, or a
    /// gRPC error in the head (any `grpc-status` but 0). "Five failed logins
    /// a minute"; what express-rate-limit calls `skipSuccessfulRequests`:
    /// `count_if(|res| res.is_failure())`.
    ///
    /// Like each of the usual choices below, it reads the HTTP status and,
    /// for a gRPC answer, the `grpc-status` in its head (see
    /// [`grpc_status`](Self::grpc_status): a status sent in the trailers is
    /// not seen).
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
    /// no gRPC error in the head. "Ten accounts created an hour";
    /// express-rate-limit's `skipFailedRequests`. Redirects (3xx) are not
    /// successes. See the [example](Self::is_failure).
    pub fn is_success(&self) -> bool {
        self.status.is_success() && self.grpc_error().is_none()
    }

    /// A gRPC error in the head: a status other than OK.
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
