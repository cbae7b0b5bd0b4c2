//! Tower middleware that rate-limits requests per key in a window **pinned to
//! the key's first hit**.
//!
//! A key's counter is created by its first hit, and its lifetime is attached
//! then, in the same atomic step, and never refreshed. Hits in between never
//! move the window, so a client that keeps knocking slowly cannot hold a
//! window open forever, and a client that stops is let back in on time.
//!
//! The data path, one module a step: a request, seen through its
//! [`RequestHead`] → its [`key`] → the [`backend`] counts the hit → a
//! [`Decision`] → the response (passed on, or denied with `429` and
//! `Retry-After`). Requests can bypass the limiter
//! ([`skip_if`](RateLimitLayer::skip_if),
//! [`allowlist`](RateLimitLayer::allowlist)), and a hit can be handed back
//! once the service's answer shows it should not count
//! ([`count_if`](RateLimitLayer::count_if)).
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, body::Body, http::{Request, StatusCode}, routing::get};
//! use tower::ServiceExt;
//! use tower_pinned_window::{Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let quota = Quota::new(2, Duration::from_secs(10)).unwrap();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new("api", quota));
//!
//! for expected in [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
//!     let response = app.clone().oneshot(Request::new(Body::empty())).await.unwrap();
//!     assert_eq!(response.status(), expected);
//! }
//! let denied = app.oneshot(Request::new(Body::empty())).await.unwrap();
//! assert_eq!(denied.headers()["retry-after"], "10");
//! assert_eq!(denied.headers()["ratelimit"], "\"api\";r=0;t=10");
//! assert_eq!(denied.headers()["ratelimit-policy"], "\"api\";q=2;w=10");
//! # }
//! ```

#![forbid(unsafe_code)]
// docs.rs (and CI's doc build) pass `--cfg docsrs`: with `doc_cfg`, rustdoc
// marks each item with the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The features, rendered from the `##` comments of Cargo.toml's [features].
#![cfg_attr(
    feature = "document-features",
    doc = concat!("# Features\n\n", document_features::document_features!())
)]

// The data path, outside in: layer.rs (configuration) → service.rs →
// future.rs → refund.rs (the hits an answer does not count, handed back) →
// judge.rs (the verdict, and the core they share); request.rs is the way
// in, key/ and policy.rs read it, backend/ counts, decision.rs and
// response.rs are the way out, and count.rs reads the service's answer.
// Imports only point down this list.
pub mod backend;
#[cfg(feature = "serde")]
pub mod config;
mod count;
mod decision;
mod error;
mod future;
mod judge;
pub mod key;
mod layer;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod name;
mod policy;
mod quota;
mod refund;
mod request;
mod response;
mod service;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use count::{CountOnly, ResponseHead};
pub use decision::{Decision, Outcome};
pub use error::{ConfigError, ParseRateError, RateErrorKind};
pub use future::ResponseFuture;
pub use judge::{FailurePolicy, OnMissingKey};
pub use layer::{DEFAULT_TIMEOUT, RateLimitLayer};
pub use name::MAX_NAME_LEN;
pub use policy::NamedQuota;
pub use quota::{Quota, Window};
pub use request::RequestHead;
pub use response::{DefaultDeny, Deny, HeaderStyle};
pub use service::RateLimit;

/// The `redis` crate this crate is built with (feature `redis`), so that
/// connections and configuration types you pass to
/// [`RedisBackend`](backend::redis::RedisBackend) come from the same version:
/// `use tower_pinned_window::redis;` instead of a `redis` dependency of your
/// own (or one pinned to the same version).
#[cfg(feature = "redis")]
pub use redis;
