//! The connection concerns of the Redis backend, together: the connections
//! this crate makes (`connect`, in the background, to a Cluster), Sentinel,
//! the nodes the audit scans, Cluster hash slots, and the circuit breaker
//! every command goes through (with its per-master slot map on a Cluster).

pub(super) mod breaker;
pub(super) mod connect;
pub(super) mod nodes;
#[cfg(feature = "redis-sentinel")]
pub(super) mod sentinel;
pub(super) mod slot;
pub(super) mod slot_map;
