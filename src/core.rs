//! The core a layer's services and their futures share: the settings, the
//! failure policies, and the gates that keep the log bounded. Each
//! capability's state sits here as a value its own module defines (the
//! insurance limiter's store, the spend plan, the outcome predicates, the
//! charge); the steps that use them live in those modules.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{BackendError, Hits};
use crate::cost::SpendPlan;
use crate::cost::charge::ChargeFn;
use crate::count::CountIf;
use crate::decision::{Carry, Decision, DecisionIn};
use crate::insurance::Insurance;
use crate::metrics::LayerMetrics;
use crate::policy::Policies;
use crate::quota::Share;
use crate::request::RequestHead;

/// What a request gets when the backend is down, slow, or full.
///
/// Corrupt state is not an outage: whatever the policy, a request whose
/// counter is corrupt is answered with 500 (gRPC: INTERNAL).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::{FailurePolicy, Quota, RateLimitLayer};
///
/// assert_eq!(FailurePolicy::default(), FailurePolicy::FailClosed);
/// // A limit that is a courtesy, not a defence: keep serving while the
/// // store is down.
/// let layer = RateLimitLayer::new("search", Quota::new(100, Duration::from_secs(60)).unwrap())
///     .on_failure(FailurePolicy::FailOpen);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Answer `503 Service Unavailable` with `Retry-After: 1` (gRPC:
    /// UNAVAILABLE). Nothing gets through uncounted.
    #[default]
    FailClosed,
    /// Let the request through uncounted, with a warning in the log at most
    /// once every few seconds.
    FailOpen,
    /// Decide with a limiter in this process's memory, each quota's limit
    /// cut to this instance's [`Share`](crate::Share) of it, with a warning in the log at
    /// most once every few seconds. Its counters are pinned to their first
    /// hit like the backend's, and live in a bounded
    /// [`MemoryBackend`](crate::backend::MemoryBackend) the layer makes (and its clones share). Every
    /// request still goes to the backend first: once it answers again, it
    /// decides, from its own counts, and the local counters are left to
    /// expire.
    ///
    /// What the insurance counted is refunded (`count_if`), charged
    /// (`charge`) or cleared (`reset_if`) in its own store, under the same
    /// rules as the backend's, and never in the backend. A full local store
    /// answers as under [`FailClosed`](Self::FailClosed). Its decisions say
    /// so: [`Decision::insured`], and their
    /// [`limit`](Decision::limit) is the share. See [`Share`](crate::Share) for an
    /// example, and for how far past a quota's limit a fleet can go while
    /// its store is out.
    Insurance(Share),
}

/// What a request gets when its key cannot be extracted.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, body::Body, http::{HeaderName, Request, StatusCode}, routing::get};
/// use tower::ServiceExt;
/// use tower_pinned_window::{OnMissingKey, Quota, RateLimitLayer, key::HeaderKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let quota = Quota::new(10, Duration::from_secs(60)).unwrap();
/// let by_api_key = RateLimitLayer::new("api", quota)
///     .key(HeaderKey::new(HeaderName::from_static("x-api-key")));
/// let status = |layer: RateLimitLayer<HeaderKey>| async move {
///     let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
///     app.oneshot(Request::new(Body::empty())).await.unwrap().status()
/// };
/// // No `x-api-key` header:
/// assert_eq!(status(by_api_key.clone()).await, StatusCode::BAD_REQUEST);
/// let lenient = by_api_key.on_missing_key(OnMissingKey::Allow);
/// assert_eq!(status(lenient).await, StatusCode::OK);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnMissingKey {
    /// Answer with the status the [`KeyError`](crate::key::KeyError) names: 400 for a request that
    /// lacks its key, 500 for a server that is not set up for the extractor
    /// (gRPC: INVALID_ARGUMENT or INTERNAL).
    #[default]
    Reject,
    /// Let the request through without counting it.
    Allow,
}

/// A callback run on every decision, for metrics.
pub(crate) type Observer = Arc<dyn Fn(&Decision) + Send + Sync>;

/// Picks the requests that bypass the limiter.
pub(crate) type SkipIf = Arc<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;

/// The configuration shared by a service and its futures.
#[derive(Clone)]
pub(crate) struct Core<Bk, D> {
    pub(crate) backend: Bk,
    pub(crate) deny: D,
    pub(crate) settings: Settings,
}

/// Everything in [`Core`] that does not change the layer's type.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) name: Arc<str>,
    pub(crate) policies: Policies,
    pub(crate) failure: FailurePolicy,
    /// The insurance limiter, under [`FailurePolicy::Insurance`].
    pub(crate) insurance: Option<Insurance>,
    pub(crate) missing_key: OnMissingKey,
    pub(crate) timeout: Duration,
    pub(crate) shadow: bool,
    pub(crate) observer: Option<Observer>,
    /// Requests it picks pass uncounted, before their key is read.
    pub(crate) skip: Option<SkipIf>,
    /// When set, a passed request's hit is kept only if its answer counts;
    /// otherwise it is refunded.
    pub(crate) count_if: Option<CountIf>,
    /// Bounds the warnings about backend failures.
    pub(crate) warn_gate: Arc<LogGate>,
    /// Bounds the log lines about requests without a usable key.
    pub(crate) key_gate: Arc<LogGate>,
    /// The layer's metric handles (feature `metrics`; zero-sized without).
    pub(crate) metrics: LayerMetrics,
    /// Where a passed request's decision goes.
    pub(crate) decision_in: DecisionIn,
    /// When set (a cost, a charge, a lockout or a reset on success), requests
    /// are counted with `spend_all`; otherwise with `hit_all`.
    pub(crate) spend: Option<SpendPlan>,
    /// A passed request whose answer it picks clears its counters.
    pub(crate) reset_if: Option<CountIf>,
    /// What a passed request's answer costs, once its body has ended.
    pub(crate) charge: Option<ChargeFn>,
}

impl<Bk, D> Core<Bk, D> {
    /// The core of a layer named `name` with `policies`, counting in
    /// `backend` and denying with `deny`; every other setting at its default
    /// (`timeout` aside), and fresh log gates and metric handles, which the
    /// layer's clones and services share.
    pub(crate) fn new(
        backend: Bk,
        deny: D,
        name: Arc<str>,
        policies: Policies,
        timeout: Duration,
    ) -> Self {
        Self {
            backend,
            deny,
            settings: Settings {
                name,
                policies,
                failure: FailurePolicy::default(),
                insurance: None,
                missing_key: OnMissingKey::default(),
                timeout,
                shadow: false,
                observer: None,
                skip: None,
                count_if: None,
                warn_gate: Arc::default(),
                key_gate: Arc::default(),
                metrics: Default::default(),
                decision_in: DecisionIn::default(),
                spend: None,
                reset_if: None,
                charge: None,
            },
        }
    }

    /// Whether passed requests' hits wait for their answers
    /// ([`count_if`](crate::RateLimitLayer::count_if)), and so take the
    /// outcome step (`outcome.rs`).
    #[inline]
    pub(crate) fn counts_by_outcome(&self) -> bool {
        let s = &self.settings;
        s.count_if.is_some() || s.reset_if.is_some() || s.charge.is_some()
    }

    /// Whether an answer may lower a counter: a settle of a
    /// [`reserve`](crate::RateLimitLayer::reserve), a refund under
    /// [`count_if`](crate::RateLimitLayer::count_if), a clear under
    /// [`reset_if`](crate::RateLimitLayer::reset_if). The backend is told
    /// per counter ([`Counter::lowers`](crate::backend::Counter::lowers)).
    pub(crate) fn lowers_counts(&self) -> bool {
        let s = &self.settings;
        let reserves = s.spend.as_ref().is_some_and(|plan| plan.reserve.is_some());
        s.count_if.is_some() || s.reset_if.is_some() || reserves
    }

    /// Where the decision on `request`, if it is passed on, goes.
    #[inline]
    pub(crate) fn carry(&self, request: &RequestHead<'_>) -> Carry {
        self.settings.decision_in.carry(request.extensions())
    }

    /// `result`, a backend answer given at once, counted in the metrics
    /// when a local cache gave it (feature `metrics`; nothing without).
    #[inline]
    pub(crate) fn answered_at_once(
        &self,
        result: Result<Hits, BackendError>,
    ) -> Result<Hits, BackendError> {
        let s = &self.settings;
        s.metrics.answered_at_once(&s.name, &result);
        result
    }

    /// Whether the insurance limiter decides on a request the backend
    /// answered `err`: under [`FailurePolicy::Insurance`], for an outage
    /// (corrupt state is never insured).
    #[inline]
    pub(crate) fn insures(&self, err: &BackendError) -> bool {
        self.settings.insurance.is_some() && !err.is_corrupt()
    }
}

impl<Bk: fmt::Debug, D> fmt::Debug for Core<Bk, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("Core")
            .field("name", &s.name)
            .field("policies", &s.policies)
            .field("backend", &self.backend)
            .field("headers", &s.policies.style())
            .field("failure", &s.failure)
            .field("insurance", &s.insurance.is_some())
            .field("missing_key", &s.missing_key)
            .field("timeout", &s.timeout)
            .field("shadow", &s.shadow)
            .field("skip", &s.skip.is_some())
            .field("count_if", &s.count_if.is_some())
            .field("decision_in", &s.decision_in)
            .field("spend", &s.spend)
            .field("reset_if", &s.reset_if.is_some())
            .field("charge", &s.charge.is_some())
            .finish_non_exhaustive()
    }
}

/// Lets a log line through at most once per [`LogGate::PERIOD_MS`],
/// counting the ones held back. It reads a monotonic clock, so a wall clock
/// stepped back (NTP, a VM resumed) can neither silence it nor open it.
#[derive(Debug)]
pub(crate) struct LogGate {
    origin: Instant,
    /// Milliseconds since `origin` from which the next line may pass.
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl Default for LogGate {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl LogGate {
    const PERIOD_MS: u64 = 5_000;

    /// `Some(held back since the last one)` when a line may be logged now.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.admit_at(now)
    }

    /// [`admit`](Self::admit) at `now` milliseconds since the gate's origin.
    fn admit_at(&self, now: u64) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(Self::PERIOD_MS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_gate_admits_one_per_period() {
        let gate = LogGate::default();
        assert_eq!(gate.admit_at(0), Some(0), "the first line passes");
        assert_eq!(gate.admit_at(1), None);
        assert_eq!(gate.admit_at(LogGate::PERIOD_MS - 1), None);
        assert_eq!(
            gate.admit_at(LogGate::PERIOD_MS),
            Some(2),
            "a period later, with the count held back"
        );
        assert_eq!(gate.admit_at(LogGate::PERIOD_MS + 1), None);
        assert_eq!(gate.admit_at(3 * LogGate::PERIOD_MS), Some(1));
    }
}
