//! The server layer, [`RateLimitLayer`](crate::RateLimitLayer): its
//! configuration (`layer.rs`), the service that reads a request's key and
//! asks the backend (`service.rs`), the response future that waits for the
//! answer (`future.rs`; under `reserve_from_body`, it reads the request's
//! body first), the one verdict on it (`verdict.rs`), and, under a layer
//! that counts by outcome, the request's tab, which its answer settles
//! (`tab.rs`).

pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod service;
pub(crate) mod tab;
pub(crate) mod verdict;
