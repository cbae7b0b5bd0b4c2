//! Tower middleware that rate-limits requests per key in a window **pinned to
//! the key's first hit**.
//!
//! A key's counter is created by its first hit, and its lifetime is attached
//! then, in the same atomic step, and never refreshed. Hits in between never
//! move the window, so a client that keeps knocking slowly cannot hold a
//! window open forever, and a client that stops is let back in on time.
//!
//! The data path, one module a step: a request, seen through its
//! [`RequestHead`](key::RequestHead) → its [`key`] → the [`backend`] counts the hit → a
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
//!
//! # A server
//!
//! Keyed by [`ClientIp`](key::ClientIp), the layer reads the peer address
//! from axum's `ConnectInfo`, so the app is served with
//! `into_make_service_with_connect_info::<SocketAddr>()` (without it, every
//! request is answered 500: the server is not set up for the extractor).
//! Behind a proxy, [trust](key::ClientIp::trust) the proxy, and the client
//! it forwarded is the key.
//!
//! ```
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{Router, routing::get};
//! use tower_pinned_window::{Quota, RateLimitLayer, key::ClientIp};
//! # use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limit = RateLimitLayer::new("api", Quota::new(1, Duration::from_secs(60))?)
//!     .key(ClientIp::new());
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(limit);
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(async move {
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! });
//!
//! // A real client over TCP: the first request passes, the second is denied.
//! let client = Client::builder(TokioExecutor::new()).build_http::<axum::body::Body>();
//! let uri: http::Uri = format!("http://{addr}/").parse()?;
//! let passed = client.get(uri.clone()).await?;
//! assert_eq!(passed.status(), 200);
//! assert_eq!(passed.headers()["ratelimit"], "\"api\";r=0;t=60");
//! let denied = client.get(uri).await?;
//! assert_eq!(denied.status(), 429);
//! assert_eq!(denied.headers()["retry-after"], "60");
//! # Ok(())
//! # }
//! ```
//!
//! # What a client gets back
//!
//! A gRPC request (content-type `application/grpc*`) is answered with
//! HTTP 200 and its status in `grpc-status` (a trailers-only answer).
//!
//! | case | policy | HTTP | gRPC |
//! |---|---|---|---|
//! | under the limit | | the service's response, with the rate-limit headers ([`HeaderStyle`](response::HeaderStyle)) | the service's answer, the same fields as metadata |
//! | over the limit | | `429` (or [`deny_with`](RateLimitLayer::deny_with)), `Retry-After` in whole seconds (rounded up, at least 1), the rate-limit headers | `8 RESOURCE_EXHAUSTED`; with the `tonic` feature a `google.rpc.RetryInfo` in `grpc-status-details-bin`; `Retry-After` and the rate-limit fields as metadata |
//! | over the limit | [`shadow(true)`](RateLimitLayer::shadow) | the service's response, counted (its [`Decision`] [passed](Decision::passed) and is [over the limit](Decision::over_limit)) | the service's answer |
//! | backend down, timed out, circuit open, or full | [`FailurePolicy::FailClosed`] (default) | `503` with `Retry-After: 1` | `14 UNAVAILABLE` |
//! | the same | [`FailurePolicy::FailOpen`] | the service's response, uncounted, no rate-limit headers | the service's answer |
//! | the same | [`FailurePolicy::Insurance`] | decided by a limiter in this process's memory at the instance's [`Share`] of the limit: the service's response or `429`, as above ([`Decision::insured`]) | the same |
//! | corrupt counter | any | `500`, the value left untouched | `13 INTERNAL` |
//! | key missing or malformed | [`allow_missing_key(false)`](RateLimitLayer::allow_missing_key) (default) | `400` | `3 INVALID_ARGUMENT` |
//! | server not set up for the extractor (no peer address) | [`allow_missing_key(false)`](RateLimitLayer::allow_missing_key) | `500` | `13 INTERNAL` |
//! | either key error | [`allow_missing_key(true)`](RateLimitLayer::allow_missing_key) | the service's response, uncounted | the service's answer |
//! | skipped ([`skip_if`](RateLimitLayer::skip_if), [`allowlist`](RateLimitLayer::allowlist)) | | the service's response, uncounted, no headers | the service's answer |
//!
//! A denial always carries its [`Decision`] in its response's extensions. A
//! passed request's goes only where asked for, so a server that never reads
//! it pays nothing for it: to the handler under
//! [`decision_in(DecisionIn::Request)`](RateLimitLayer::decision_in) (the
//! handler takes `Decision` as an extractor), into every response under
//! [`DecisionIn::Response`], and into the response of a request that asks
//! ([`WantDecision`](outcome::WantDecision), what an outer layer sends). A
//! response answered for a backend failure carries its
//! [`BackendError`](backend::BackendError) instead (as an `Arc`).
//!
//! # Topics
//!
//! | topic | where |
//! |---|---|
//! | the layer and every option (guide: [`docs/usage.md`](crate::guide::usage)) | [`RateLimitLayer`] |
//! | quotas, rate strings (`"100/min"`), policy names (guide: [`docs/quotas.md`](crate::guide::quotas)) | [`Quota`], [`NamedQuota`], [`Window`] |
//! | whom to count: peer address, client behind proxies, header, route, allowlists (guide: [`docs/client-identity.md`](crate::guide::client_identity)) | [`key`] |
//! | counting by the answer (failed logins; guide: [`docs/outcomes.md`](crate::guide::outcomes)) | [`count_if`](RateLimitLayer::count_if), [`ResponseHead`](outcome::ResponseHead) |
//! | request costs, response charges (token budgets), reserve then settle, lockouts, reset on success (guide: [`docs/costs.md`](crate::guide::costs)) | [`cost`](RateLimitLayer::cost), [`cost_fn`](RateLimitLayer::cost_fn), [`charge`](RateLimitLayer::charge), [`reserve`](RateLimitLayer::reserve), [`ResponseHead`](outcome::ResponseHead), [`block_for`](RateLimitLayer::block_for), [`reset_if`](RateLimitLayer::reset_if) |
//! | the answer's headers and denials (guide: [`docs/headers.md`](crate::guide::headers)) | [`HeaderStyle`](response::HeaderStyle), [`Deny`](response::Deny), [`Decision`] |
//! | a budget for outbound calls, shared by every instance, that waits for its window (guide: [`docs/outbound.md`](crate::guide::outbound)) | [`outbound::BudgetLayer`] |
//! | the provider's word: its 429s and rate-limit headers, honoured by every instance; requests and tokens in one step | [`BudgetLayer::heed`](outbound::BudgetLayer::heed), [`outbound::Reader`], [`BudgetLayer::tokens`](outbound::BudgetLayer::tokens), [`backend::Heeding`] |
//! | at most N requests in flight per key across instances, slots on leases no crash can leak (guide: [`docs/in-flight.md`](crate::guide::in_flight)) | [`InFlightLayer`], [`InFlight`], [`RateLimitLayer::in_flight`] (beside the quotas, one store step), [`BudgetLayer::in_flight`](outbound::BudgetLayer::in_flight) |
//! | failures, the insurance limiter for outages | [`FailurePolicy`], [`Share`], [`allow_missing_key`](RateLimitLayer::allow_missing_key), [`ConfigError`] |
//! | where counters and slots live, and the contract a backend keeps | [`backend`], [`MemoryBackend`](backend::MemoryBackend), [`PrivateKeys`](backend::PrivateKeys), [`Leasing`](backend::Leasing), [`Heeding`](backend::Heeding) (the provider's word) |
//! | a store of your own: storage keys, a deny cache, a batched future | [`backend::toolkit`] |
//! | Redis, Cluster, Sentinel | the [`tower-pinned-window-redis`][crate-redis] crate |
//! | PostgreSQL | the [`tower-pinned-window-postgres`][crate-postgres] crate |
//! | limits from TOML, YAML, JSON (feature `serde`) | [`config`][mod-config] |
//! | metrics (feature `metrics`) | [`metrics`][mod-metrics] |
//! | an admin route: read, reset, block, unblock a key (feature `operator`; guide: [`docs/operations.md`](crate::guide::operations)) | [`operator`][mod-operator] |
//!
//! The guides (proxies and forwarded headers, Redis outages and the
//! circuit breaker, the audit, the PostgreSQL table, gRPC, outbound
//! budgets) are rendered here, in the [`guide`] module, from the
//! repository's `docs/*.md`; the benchmarks and their figures are in the
//! repository's `bench/README.md`.
//!
// The backend crates' links, on docs.rs.
#![doc = "[crate-redis]: https://docs.rs/tower-pinned-window-redis"]
#![doc = "[crate-postgres]: https://docs.rs/tower-pinned-window-postgres"]
// The feature-gated modules' links: intra-doc where the module is built
// (docs.rs and CI build with every feature), docs.rs otherwise, so a docs
// build with any features has no broken link.
#![cfg_attr(feature = "serde", doc = "[mod-config]: config")]
#![cfg_attr(
    not(feature = "serde"),
    doc = "[mod-config]: https://docs.rs/tower-pinned-window/latest/tower_pinned_window/config/index.html"
)]
#![cfg_attr(feature = "metrics", doc = "[mod-metrics]: metrics")]
#![cfg_attr(
    not(feature = "metrics"),
    doc = "[mod-metrics]: https://docs.rs/tower-pinned-window/latest/tower_pinned_window/metrics/index.html"
)]
#![cfg_attr(feature = "operator", doc = "[mod-operator]: operator")]
#![cfg_attr(
    not(feature = "operator"),
    doc = "[mod-operator]: https://docs.rs/tower-pinned-window/latest/tower_pinned_window/operator/index.html"
)]
#![forbid(unsafe_code)]
// docs.rs (and CI's doc build) pass `--cfg docsrs`: with `doc_cfg`, rustdoc
// marks each item with the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The features, rendered from the `##` comments of Cargo.toml's [features].
#![cfg_attr(
    feature = "document-features",
    doc = concat!("# Features\n\n", document_features::document_features!())
)]

// The data paths, outside in, one module a step.
// A request: server/ (layer.rs: configuration → service.rs: its key, its
// quota, the backend's count → future.rs: the count at once or after the
// wait, then the service → verdict.rs: the one verdict, pass, deny or
// fail → tab.rs, only under count_if, reset_if or charge: what the answer
// does to the hits, as outcome/'s rules say) → response.rs (the answer's
// headers and denials). Under reserve_from_body, the future first reads a
// bounded prefix of the body (cost/body.rs), then takes service.rs's
// limiter step.
// An outbound call: outbound/ (layer → service → future → admit, line.rs:
// the waiters, stored.rs: the quotas a call spends from, limits held in
// the store among them → heed: the answer's word, read by word.rs, kept in heard.rs
// and the store → settle: the answer's charge).
// Both stand on the floor, budget/ (the failure policy, the spend plan and
// its checks, settling, the log rules), which reaches the backend/.
//
// The modules, top to bottom (tools/imports.py, run by CI, fails on an
// import that points up this list, or on files that import each other in
// a loop); the faces and the middlewares first, the floor under them:
//   operator/   the operator's service (feature operator): read, reset,
//               block, unblock a layer's key; reads the layers
//   config      limits from TOML, YAML, JSON (feature serde): builds layers
//   outbound/   the client layer, BudgetLayer
//   server/     the server layer, RateLimitLayer
//   in_flight/  the in-flight cap, InFlightLayer: slots on leases
//   core        the settings a server layer's services share
//   denied      the keys denied most: a bounded top-N of digests
//   outcome/    counting by the answer: what it does to the hits (kept,
//               refunded, cleared), count_if and reset_if as one value
//   budget/     the floor: failure policy, spend plan, settling, log rules
//   policy      the quotas a request is charged to
//   limits      limits held in the store, read with a bounded staleness
//   insurance   the limiter that decides during outages, over counters
//   metrics     the layer's metric handles (feature metrics)
//   response    the way out: headers, denials
//   cost/       what a request spends: modes, metered bodies, body estimates
//   backend/    counts: the contract, the memory store, and toolkit/ for
//               the stores across the network (the redis/ and postgres/ crates)
//   key/        whom a request is charged to
//   decision    the verdict's value, Decision
//   label       what a decision shows of its quota
//   count       reads the service's answer (ResponseHead)
//   request     the way in: a request's head
//   quota       quotas, windows, shares
//   error       configuration errors
//   name        the rules for names
//   timeout     the backend timeout's default
//   guide       the guides, for rustdoc
pub mod backend;
mod budget;
#[cfg(feature = "serde")]
pub mod config;
mod core;
pub mod cost;
mod count;
mod decision;
pub mod denied;
mod error;
pub mod in_flight;
// The guides (docs/*.md) for rustdoc only; their examples run as doctests
// of integration/, with every feature on.
#[cfg(all(doc, not(doctest)))]
pub mod guide;
mod insurance;
pub mod key;
mod label;
mod limits;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod name;
#[cfg(feature = "operator")]
pub mod operator;
pub mod outbound;
pub mod outcome;
mod policy;
mod quota;
mod request;
pub mod response;
mod server;
mod timeout;

pub use backend::InFlight;
pub use budget::failure::FailurePolicy;
pub use decision::{Decision, DecisionIn};
pub use error::ConfigError;
pub use in_flight::layer::InFlightLayer;
pub use limits::LimitBook;
pub use name::MAX_NAME_LEN;
pub use policy::NamedQuota;
pub use quota::{Quota, Share, Window};
pub use server::future::ResponseFuture;
pub use server::layer::RateLimitLayer;
pub use server::service::RateLimit;
pub use timeout::DEFAULT_TIMEOUT;
