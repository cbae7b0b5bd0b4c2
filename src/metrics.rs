//! Metrics through the [`metrics`](https://docs.rs/metrics) crate's facade
//! (feature `metrics`): whatever recorder the application installs
//! (Prometheus, StatsD, OpenTelemetry) receives them.
//!
//! | name | type | labels | recorded |
//! |---|---|---|---|
//! | [`DECISIONS`] `tower_pinned_window_decisions_total` | counter | `limiter`, `policy`, `outcome` | once per request the backend answered: `outcome` is `allowed`, `denied` or `shadowed` |
//! | [`BACKEND_ERRORS`] `tower_pinned_window_backend_errors_total` | counter | `limiter`, `kind` | once per failed backend call: `kind` is `unavailable`, `timed_out`, `circuit_open`, `cluster_down`, `at_capacity` or `corrupt` |
//! | [`BACKEND_LATENCY`] `tower_pinned_window_backend_latency_seconds` | histogram | `limiter` | once per backend call that had to wait (a round trip to Redis), never for an answer given at once |
//! | [`DENY_CACHE_ANSWERS`] `tower_pinned_window_deny_cache_answers_total` | counter | `limiter` | once per request a local deny cache denied without asking the store |
//! | [`STORED_LIMITS_CORRUPT`] `tower_pinned_window_stored_limits_corrupt` | gauge | `limiter` | under [`limits`](crate::RateLimitLayer::limits), once per read of a layer's stored limits (at most once per staleness bound): how many stored values are not limits, and so are left out (the layer's own quotas apply to them); alert on anything above 0 |
//! | [`TOP_DENIED`] `tower_pinned_window_top_denied` | gauge | `limiter`, `rank` | under [`top_denied`](crate::RateLimitLayer::top_denied), on a denial at most once a second: the denials of the key at `rank` (`1` to `10`, at most the table's capacity) among [the keys denied most](crate::denied) |
//!
//! # Labels, and why never the key or the route
//!
//! - `limiter` is a layer's name, and `policy` a quota's policy name as the
//!   `RateLimit` headers show it ([`Decision::policy`](crate::Decision::policy)):
//!   the layer's name, a [`NamedQuota`](crate::NamedQuota)'s name, or the
//!   readable default of an unnamed route, extra or tier quota. Both are
//!   chosen by the server's configuration, so there are as many series as
//!   configured quotas (times three outcomes): a layer with two extra
//!   quotas and ten route quotas has at most 13 × 3 decision series. A
//!   [`quota_by`](crate::RateLimitLayer::quota_by) closure that names
//!   quotas after request data would make that unbounded: name tiers from a
//!   fixed set.
//! - The **key is never a label**: keys are client identities (addresses,
//!   API keys) that a metrics store should not hold, and one series per
//!   client would grow without bound.
//! - The keys denied most are told apart by **rank**, not by key or
//!   digest: at most 10 series per layer, whoever the keys are. A gauge
//!   says how hard the worst keys hit the limit (alert on rank 1); which
//!   keys they are is read through the layer's
//!   [`DeniedKeys`](crate::denied::DeniedKeys) handle, as digests.
//! - The **route is not a label** either: for a gRPC request it is the
//!   request's path, which the client chooses (any path, valid method or
//!   not, reaches the limiter first). Read [`Decision::route`](crate::Decision::route)
//!   in an [`on_decision`](crate::RateLimitLayer::on_decision) callback if
//!   you need it, and bound it there. A route with a quota of its own is
//!   already told apart by its policy name.
//!
//! # Cost
//!
//! Without the feature, nothing: the hooks are empty functions and
//! zero-sized fields. With it, each series' handle is registered with the
//! recorder on its first use (per quota and per layer) and kept, so a
//! request then costs one atomic increment on the recorder's counter. The
//! clock is read only when a backend call has to wait (so never on the
//! in-memory backend's path, nor for a deny-cache answer), with the
//! time-stamp counter ([`quanta`](https://docs.rs/quanta)). Install the
//! recorder before the first request: a handle registered before that is
//! the facade's no-op one, and stays so.
//!
//! # How a deny-cache answer is told
//!
//! By the [`Backend`](crate::backend::Backend) contract, a [`Hit`](crate::backend::Hit)
//! with no [`deadline`](crate::backend::Hit::deadline) was not counted in
//! the store. A backend call that answers at once (without waiting) with a
//! hit that has a count but no deadline was answered from a local cache:
//! the Redis or PostgreSQL backend's deny cache. (A backend of your own that answers at
//! once without deadlines is counted here too.)
//!
//! # Example
//!
//! `integration/examples/metrics.rs` serves the quickstart's routes with `GET /metrics`
//! in Prometheus' text format:
//!
//! ```text
//! tower_pinned_window_decisions_total{limiter="quickstart",policy="quickstart",outcome="allowed"} 5
//! tower_pinned_window_decisions_total{limiter="quickstart",policy="quickstart",outcome="denied"} 1
//! ```

#[cfg(feature = "metrics")]
pub use enabled::{
    BACKEND_ERRORS, BACKEND_LATENCY, DECISIONS, DENY_CACHE_ANSWERS, STORED_LIMITS_CORRUPT,
    TOP_DENIED,
};
#[cfg(feature = "metrics")]
pub(crate) use enabled::{
    LayerMetrics, QuotaMetrics, Stopwatch, StoredLimitsMetrics, TopDeniedMetrics,
};

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::{
    LayerMetrics, QuotaMetrics, Stopwatch, StoredLimitsMetrics, TopDeniedMetrics,
};

/// The ranks of the keys denied most that get a gauge.
#[cfg(feature = "metrics")]
const TOP_DENIED_RANKS: usize = 10;

#[cfg(any(feature = "metrics", test))]
use crate::decision::Outcome;

/// The `outcome` label's values, in the order of [`outcome_index`].
#[cfg(any(feature = "metrics", test))]
const OUTCOMES: [&str; 3] = ["allowed", "denied", "shadowed"];

/// The place of `outcome` in [`OUTCOMES`]: this module reads decisions,
/// a decision knows nothing of metrics.
#[cfg(any(feature = "metrics", test))]
fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Allowed => 0,
        Outcome::Denied => 1,
        Outcome::Shadowed => 2,
    }
}

#[cfg(feature = "metrics")]
mod enabled {
    use std::fmt;
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use ::metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

    use super::{OUTCOMES, TOP_DENIED_RANKS, outcome_index};
    use crate::backend::{BackendError, Hits};
    use crate::decision::Decision;

    /// Decisions, by `limiter`, `policy` and `outcome` (counter).
    ///
    /// See the [module's example](crate::metrics#example).
    pub const DECISIONS: &str = "tower_pinned_window_decisions_total";
    /// Failed backend calls, by `limiter` and `kind` (counter).
    ///
    /// See the [module's example](crate::metrics#example).
    pub const BACKEND_ERRORS: &str = "tower_pinned_window_backend_errors_total";
    /// Backend calls that had to wait, in seconds, by `limiter` (histogram).
    ///
    /// See the [module's example](crate::metrics#example).
    pub const BACKEND_LATENCY: &str = "tower_pinned_window_backend_latency_seconds";
    /// Requests denied by a local deny cache without asking the store, by
    /// `limiter` (counter).
    ///
    /// See the [module's example](crate::metrics#example).
    pub const DENY_CACHE_ANSWERS: &str = "tower_pinned_window_deny_cache_answers_total";
    /// The denials of the key at each `rank` among a layer's keys denied
    /// most, by `limiter` and `rank` (gauge), under
    /// [`top_denied`](crate::RateLimitLayer::top_denied).
    ///
    /// See the [module's table](crate::metrics).
    pub const TOP_DENIED: &str = "tower_pinned_window_top_denied";
    /// The stored values of a layer that are not limits, as of its last
    /// read, by `limiter` (gauge), under
    /// [`limits`](crate::RateLimitLayer::limits).
    ///
    /// See the [module's table](crate::metrics).
    pub const STORED_LIMITS_CORRUPT: &str = "tower_pinned_window_stored_limits_corrupt";

    /// The gauge of a layer's corrupt stored limits, registered on first
    /// use: kept in the layer's copy of its limits.
    pub(crate) struct StoredLimitsMetrics(OnceLock<Gauge>);

    impl StoredLimitsMetrics {
        pub(crate) fn new() -> Self {
            Self(OnceLock::new())
        }

        /// Sets the gauge of `limiter` to `corrupt`, after a read.
        pub(crate) fn read(&self, limiter: &str, corrupt: usize) {
            self.0
                .get_or_init(|| gauge!(STORED_LIMITS_CORRUPT, "limiter" => limiter.to_owned()))
                .set(corrupt as f64);
        }
    }

    /// The gauges of a table of the keys denied most, registered on first
    /// use, and when they were last set. Kept in the table, under its lock.
    #[derive(Default)]
    pub(crate) struct TopDeniedMetrics {
        gauges: Vec<Gauge>,
        last: Option<quanta::Instant>,
    }

    impl TopDeniedMetrics {
        /// Whether [`publish`](Self::publish) publishes anything.
        pub(crate) const RECORDS: bool = true;

        /// Whether the gauges are due to be set: never set, or last set a
        /// second ago or more.
        pub(crate) fn due(&mut self) -> bool {
            let now = quanta::Instant::now();
            let due = self
                .last
                .is_none_or(|last| now.duration_since(last) >= Duration::from_secs(1));
            if due {
                self.last = Some(now);
            }
            due
        }

        /// Sets rank `i + 1`'s gauge to `ranked[i]` (0 past its end), for
        /// the first ranks of a table of `capacity` counters.
        pub(crate) fn publish(&mut self, limiter: &str, capacity: usize, ranked: &[u64]) {
            if self.gauges.is_empty() {
                let ranks = capacity.min(TOP_DENIED_RANKS);
                self.gauges = (1..=ranks)
                    .map(|rank| {
                        gauge!(TOP_DENIED, "limiter" => limiter.to_owned(), "rank" => rank.to_string())
                    })
                    .collect();
            }
            for (i, gauge) in self.gauges.iter().enumerate() {
                gauge.set(ranked.get(i).copied().unwrap_or(0) as f64);
            }
        }
    }

    /// A quota's decision counters, one per outcome, registered on first
    /// use. Kept beside the quota (in its policy), never in a decision.
    #[derive(Default, Clone)]
    pub(crate) struct QuotaMetrics(OnceLock<[Counter; 3]>);

    impl QuotaMetrics {
        /// Whether [`record`](Self::record) records anything.
        pub(crate) const RECORDS: bool = true;

        /// Count `decision`, one of this quota's.
        pub(crate) fn record(&self, decision: &Decision) {
            let counters = self.0.get_or_init(|| {
                OUTCOMES.map(|outcome| {
                    counter!(
                        DECISIONS,
                        "limiter" => decision.name().to_owned(),
                        "policy" => decision.policy().to_owned(),
                        "outcome" => outcome,
                    )
                })
            });
            counters[outcome_index(decision.outcome())].increment(1);
        }
    }

    /// A layer's handles, registered on first use: shared by the layer's
    /// clones and services.
    #[derive(Clone, Default)]
    pub(crate) struct LayerMetrics(Arc<Handles>);

    #[derive(Default)]
    struct Handles {
        errors: OnceLock<[Counter; 6]>,
        latency: OnceLock<Histogram>,
        deny_cache: OnceLock<Counter>,
    }

    impl LayerMetrics {
        pub(crate) fn backend_error(&self, limiter: &str, err: &BackendError) {
            let errors = self.0.errors.get_or_init(|| {
                BackendError::KIND_NAMES.map(|kind| {
                    counter!(BACKEND_ERRORS, "limiter" => limiter.to_owned(), "kind" => kind)
                })
            });
            errors[err.kind_index()].increment(1);
        }

        pub(crate) fn backend_latency(&self, limiter: &str, elapsed: Duration) {
            self.0
                .latency
                .get_or_init(|| histogram!(BACKEND_LATENCY, "limiter" => limiter.to_owned()))
                .record(elapsed.as_secs_f64());
        }

        /// A backend answer given at once: counted when it is a local
        /// cache's (see the [module docs](self#how-a-deny-cache-answer-is-told)).
        pub(crate) fn answered_at_once<E>(&self, limiter: &str, result: &Result<Hits, E>) {
            let Ok(hits) = result else { return };
            if hits
                .iter()
                .any(|hit| hit.deadline.is_none() && hit.count > 0)
            {
                self.0
                    .deny_cache
                    .get_or_init(|| counter!(DENY_CACHE_ANSWERS, "limiter" => limiter.to_owned()))
                    .increment(1);
            }
        }
    }

    /// When a backend call was found waiting.
    pub(crate) struct Stopwatch(quanta::Instant);

    impl Stopwatch {
        pub(crate) fn start() -> Self {
            Self(quanta::Instant::now())
        }

        pub(crate) fn elapsed(&self) -> Duration {
            self.0.elapsed()
        }
    }

    impl fmt::Debug for QuotaMetrics {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("QuotaMetrics")
        }
    }

    impl fmt::Debug for LayerMetrics {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("LayerMetrics")
        }
    }
}

/// The same hooks, empty: zero-sized types and functions that compile to
/// nothing.
#[cfg(not(feature = "metrics"))]
mod disabled {
    use std::time::Duration;

    use crate::backend::{BackendError, Hits};
    use crate::decision::Decision;

    #[derive(Debug, Default, Clone)]
    pub(crate) struct QuotaMetrics;

    impl QuotaMetrics {
        pub(crate) const RECORDS: bool = false;

        #[inline(always)]
        pub(crate) fn record(&self, _decision: &Decision) {}
    }

    #[derive(Debug, Clone, Default)]
    pub(crate) struct LayerMetrics;

    impl LayerMetrics {
        #[inline(always)]
        pub(crate) fn backend_error(&self, _limiter: &str, _err: &BackendError) {}

        #[inline(always)]
        pub(crate) fn backend_latency(&self, _limiter: &str, _elapsed: Duration) {}

        #[inline(always)]
        pub(crate) fn answered_at_once<E>(&self, _limiter: &str, _result: &Result<Hits, E>) {}
    }

    pub(crate) struct StoredLimitsMetrics;

    impl StoredLimitsMetrics {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn read(&self, _limiter: &str, _corrupt: usize) {}
    }

    #[derive(Default)]
    pub(crate) struct TopDeniedMetrics;

    impl TopDeniedMetrics {
        pub(crate) const RECORDS: bool = false;

        #[inline(always)]
        pub(crate) fn due(&mut self) -> bool {
            false
        }

        #[inline(always)]
        pub(crate) fn publish(&mut self, _limiter: &str, _capacity: usize, _ranked: &[u64]) {}
    }

    pub(crate) struct Stopwatch;

    impl Stopwatch {
        #[inline(always)]
        pub(crate) fn start() -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn elapsed(&self) -> Duration {
            Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_has_its_own_metric_label() {
        let labels = [
            (Outcome::Allowed, "allowed"),
            (Outcome::Denied, "denied"),
            (Outcome::Shadowed, "shadowed"),
        ];
        for (outcome, label) in labels {
            assert_eq!(OUTCOMES[outcome_index(outcome)], label);
        }
    }
}
