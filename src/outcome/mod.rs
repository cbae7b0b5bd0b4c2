//! Counting by outcome: a request's hits wait for the service's answer,
//! which decides what they become.
//!
//! - [`count_if`](crate::RateLimitLayer::count_if) (the usual choices are
//!   [`ResponseHead::is_failure`] and its siblings)
//!   keeps a hit only when its answer, read through a [`ResponseHead`],
//!   counts: the hits of any other answer, and of a denial, are refunded,
//!   each in the window it was counted in;
//! - [`reset_if`](crate::RateLimitLayer::reset_if) clears the key's counters
//!   when the answer says so (a successful login);
//! - a [`charge`](crate::RateLimitLayer::charge) adds the answer's cost,
//!   read from the same [`ResponseHead`] once its body ends (its trailers,
//!   its last chunk), or settles the request's
//!   [`reserve`](crate::RateLimitLayer::reserve) to it ([`cost`](crate::cost)).
//!
//! A layer without any of them keeps nothing for the answer and allocates
//! nothing for it. What keeps a hit counted, on purpose: a service error or
//! a response future dropped before the answer (there is no answer, and the
//! service may have done the work), a refund the backend failed, and a
//! process that stops between the hit and the refund. Each hit is refunded
//! at most once. The guide: [`docs/outcomes.md`](crate::guide::outcomes).
//!
//! [`WantDecision`] is how an outer layer asks for a passed request's
//! [`Decision`](crate::Decision) in its response.

pub use crate::count::ResponseHead;
pub use crate::decision::WantDecision;

pub(crate) mod rules;
