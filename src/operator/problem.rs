//! The operator's service's errors as RFC 9457 problem details
//! (`application/problem+json`: `type`, `title`, `status`, `detail`).

use http::{HeaderValue, Response, StatusCode, header};

use crate::backend::BackendError;

use super::handle::OperatorError;

/// Where each problem type is described: the operations guide.
const TYPES: &str = "https://github.com/tower-pinned-window/tower-pinned-window/blob/main/docs/operations.md#problem-";

/// One problem document. Its `detail` never holds a key: the operator named
/// it, and a log that stores the answer should not hold it either.
#[derive(Debug)]
pub(crate) struct Problem {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    detail: String,
    /// `Allow`, for a 405.
    allow: Option<&'static str>,
}

impl Problem {
    pub(crate) fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            title,
            detail: detail.into(),
            allow: None,
        }
    }

    pub(crate) fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "Not found",
            "no such operation: GET / lists the layers, GET /denied the keys they denied most, GET /budgets the outbound budgets; POST /read, /reset, /block, /unblock act on a key; POST /limits, /limits/set, /limits/clear read and set limits held in the store",
        )
    }

    pub(crate) fn method(allow: &'static str) -> Self {
        let mut problem = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            format!("this operation answers {allow} only"),
        );
        problem.allow = Some(allow);
        problem
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "Malformed request",
            detail,
        )
    }

    pub(crate) fn invalid_key(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-key",
            "Invalid key",
            detail,
        )
    }

    /// The response: the document as JSON, `application/problem+json`.
    pub(crate) fn into_response(self) -> Response<String> {
        let body = serde_json::json!({
            "type": format!("{TYPES}{}", self.slug),
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        })
        .to_string();
        let mut response = Response::new(body);
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(allow) = self.allow {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

impl From<OperatorError> for Problem {
    fn from(err: OperatorError) -> Self {
        match err {
            OperatorError::UnknownLayer(_) => Self::new(
                StatusCode::NOT_FOUND,
                "unknown-layer",
                "Unknown layer",
                err.to_string(),
            ),
            OperatorError::NoLimitBook => Self::new(
                StatusCode::CONFLICT,
                "no-limit-book",
                "Limits are not held in the store",
                err.to_string(),
            ),
            OperatorError::NotBlockable(_) => Self::new(
                StatusCode::CONFLICT,
                "not-blockable",
                "The layer does not read lockouts",
                err.to_string(),
            ),
            // A corrupt counter names its storage key, which holds the key:
            // the detail says only what happened.
            OperatorError::Backend(BackendError::Corrupt { .. }) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "corrupt-counter",
                "Corrupt counter",
                "a counter of this key is not an integer; it was left as it is (the store's audit names it)",
            ),
            OperatorError::Backend(other) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                format!("the store failed: {}", kind(&other)),
            ),
        }
    }
}

/// What failed, without the store's own words (which may name a key).
fn kind(err: &BackendError) -> &'static str {
    match err {
        BackendError::TimedOut => "timed out",
        BackendError::AtCapacity => "full",
        BackendError::CircuitOpen => "circuit open",
        BackendError::ClusterDown(_) => "cluster down",
        _ => "unavailable",
    }
}
