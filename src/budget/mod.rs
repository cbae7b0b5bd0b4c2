//! The floor every middleware stands on: what a layer does with a budget,
//! written once. The server layer ([`RateLimitLayer`](crate::RateLimitLayer))
//! and the client layer ([`BudgetLayer`](crate::outbound::BudgetLayer))
//! stand side by side on it and import nothing from each other; a third
//! middleware gets the same rules by calling the same functions.
//!
//! - [`failure`]: what a request gets when the store fails (fail closed,
//!   fail open, insurance at a share), with its one warning, which names a
//!   Cluster's refusal, and the one error line for a corrupt counter;
//! - [`spend`]: the spend plan (a cost, a reservation, a charge, a
//!   lockout), its checks that span setters, and what an answer's usage
//!   settles;
//! - [`settle`]: amending what a request spent once its answer is known,
//!   at once, on a tokio task, or (with no runtime) handed back or dropped
//!   with a warning;
//! - [`log`]: the gate that bounds every warning, and the report of an
//!   amend's result;
//! - [`check`]: a layer's name, and a layer that cannot work is not built;
//! - the backend timeout ([`failure::timed`]); its default,
//!   [`DEFAULT_TIMEOUT`](crate::DEFAULT_TIMEOUT), sits in `timeout.rs`,
//!   below the backends, which read it too.

pub(crate) mod check;
pub(crate) mod failure;
pub(crate) mod log;
pub(crate) mod settle;
pub(crate) mod spend;
