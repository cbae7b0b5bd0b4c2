//! The operator's service: read, reset, block and unblock a key of a layer,
//! from your application's own admin route (feature `operator`).
//!
//! **Never mount it without authentication.** It is never mounted by
//! default: you put its [`OperatorService`] on your own router, behind your
//! own authentication (a bearer token, mTLS, an internal listener). Anyone
//! who reaches it can reset any key's budget or lock any client out.
//!
//! An [`Operator`] holds the layers you register with it (their names,
//! backends and counters); its methods are the library calls, and
//! [`Operator::service`] is the same calls as a tower `Service` answering
//! JSON, with errors as RFC 9457 problem details
//! (`application/problem+json`). The guide, with the example app:
//! [`docs/operations.md`](crate::guide::operations).
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
//! use tower::ServiceExt;
//! use tower_pinned_window::backend::MemoryBackend;
//! use tower_pinned_window::operator::Operator;
//! use tower_pinned_window::{Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let api = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60)).unwrap())
//!     .backend(MemoryBackend::new())
//!     .cost(1);
//! let operator = Operator::new().layer(&api);
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(api);
//! // Your authentication goes around this router: see docs/operations.md.
//! let admin = Router::new().nest_service("/admin/limits", operator.service());
//!
//! let hello = || Request::new(Body::empty());
//! assert_eq!(app.clone().oneshot(hello()).await.unwrap().status(), StatusCode::OK);
//! assert_eq!(app.clone().oneshot(hello()).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
//!
//! // The layer has no `key(...)`: every request shares the key "*".
//! let post = |path: &str, json: &str| {
//!     Request::post(format!("/admin/limits{path}"))
//!         .header("content-type", "application/json")
//!         .body(Body::from(json.to_owned()))
//!         .unwrap()
//! };
//! let read = admin.clone().oneshot(post("/read", r#"{"layer":"api","key":"*"}"#)).await.unwrap();
//! assert_eq!(read.status(), StatusCode::OK);
//! let reset = admin.clone().oneshot(post("/reset", r#"{"layer":"api","key":"*"}"#)).await.unwrap();
//! assert_eq!(reset.status(), StatusCode::OK);
//! assert_eq!(app.clone().oneshot(hello()).await.unwrap().status(), StatusCode::OK, "a fresh window");
//!
//! let typo = admin.oneshot(post("/read", r#"{"layer":"api","kee":"*"}"#)).await.unwrap();
//! assert_eq!(typo.status(), StatusCode::BAD_REQUEST);
//! assert_eq!(typo.headers()["content-type"], "application/problem+json");
//! # }
//! ```

mod handle;
mod problem;
mod service;

pub use handle::{
    BudgetKey, CounterInfo, CounterState, KeyState, MAX_LISTED, Operator, OperatorError,
};
pub use service::{MAX_BODY, MAX_KEY_BYTES, OperatorFuture, OperatorService};
