//! The backend timeout's default, below every module that reads it: the
//! middlewares' `timeout` setters and a store's own retry budget (the Redis
//! Cluster client's retries fit in half of it).

use std::time::Duration;

/// How long a backend call may take before the request is handled as if the
/// backend were down; see [`RateLimitLayer::timeout`](crate::RateLimitLayer::timeout)
/// and [`BudgetLayer::timeout`](crate::outbound::BudgetLayer::timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
