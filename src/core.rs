//! The core a server layer's services and their futures share: the
//! settings every request reads, and the gates that keep the log bounded.
//! Each capability's switch and state is a value its own module defines
//! (the failure policy with its insurance limiter, [`Failure`]; the spend
//! plan with its charge, [`SpendPlan`]; what an answer does to the hits,
//! [`OutcomeRules`]); the steps that use them live in those modules.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{BackendError, Hits, InFlight};
use crate::budget::failure::Failure;
use crate::budget::log::LogGate;
use crate::budget::spend::SpendPlan;
use crate::decision::{Carry, Decision, DecisionIn};
use crate::denied::DeniedKeys;
use crate::metrics::LayerMetrics;
use crate::outcome::rules::OutcomeRules;
use crate::policy::Policies;
use crate::request::RequestHead;
use crate::response::InFlightFields;

/// What a request gets when its key cannot be extracted: the layer's
/// [`allow_missing_key`](crate::RateLimitLayer::allow_missing_key), and the
/// configuration's `on-missing-key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OnMissingKey {
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
    /// The in-flight cap's state, made when the layer is built; `None`
    /// without a cap.
    pub(crate) cap: Option<CapCore>,
}

/// A built layer's in-flight cap: the cap, its slots (the in-flight
/// layer's shared state, `in_flight/slot.rs`, whose type names the
/// backend: the layer's mode, [`Capped`](crate::cost::Capped), makes the
/// guards from it) and the header fields it writes (`None` unless the
/// layer writes the IETF fields).
#[derive(Clone)]
pub(crate) struct CapCore {
    pub(crate) in_flight: InFlight,
    pub(crate) slots: Arc<dyn Any + Send + Sync>,
    pub(crate) fields: Option<Arc<InFlightFields>>,
}

/// Everything in [`Core`] that does not change the layer's type.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) name: Arc<str>,
    pub(crate) policies: Policies,
    /// The failure policy, and the insurance limiter under
    /// [`FailurePolicy::Insurance`](crate::FailurePolicy::Insurance).
    pub(crate) failure: Failure,
    pub(crate) missing_key: OnMissingKey,
    pub(crate) timeout: Duration,
    pub(crate) shadow: bool,
    pub(crate) observer: Option<Observer>,
    /// Requests it picks pass uncounted, before their key is read.
    pub(crate) skip: Option<SkipIf>,
    /// Bounds the warnings about backend failures.
    pub(crate) warn_gate: Arc<LogGate>,
    /// Bounds the log lines about requests without a usable key.
    pub(crate) key_gate: Arc<LogGate>,
    /// The layer's metric handles (feature `metrics`; zero-sized without).
    pub(crate) metrics: LayerMetrics,
    /// Where a passed request's decision goes.
    pub(crate) decision_in: DecisionIn,
    /// When set (a cost, a charge, a lockout or a reset on success), requests
    /// are counted with `spend_all`; otherwise with `hit_all`. It holds
    /// the charge: what a passed request's answer costs, once its body has
    /// ended.
    pub(crate) spend: Option<SpendPlan>,
    /// When set (`count_if`, `reset_if`), a passed request's answer decides
    /// what its hits become: kept, refunded, or cleared.
    pub(crate) outcome: Option<OutcomeRules>,
    /// The in-flight cap, when set: each request's slot is taken in the
    /// same store step as its counters.
    pub(crate) in_flight: Option<InFlight>,
    /// The keys denied most, when counted
    /// ([`top_denied`](crate::RateLimitLayer::top_denied)).
    pub(crate) denied: Option<DeniedKeys>,
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
                failure: Failure::default(),
                missing_key: OnMissingKey::default(),
                timeout,
                shadow: false,
                observer: None,
                skip: None,
                warn_gate: Arc::default(),
                key_gate: Arc::default(),
                metrics: Default::default(),
                decision_in: DecisionIn::default(),
                spend: None,
                outcome: None,
                in_flight: None,
                denied: None,
            },
            cap: None,
        }
    }

    /// Whether passed requests' hits wait for their answers (the
    /// [`OutcomeRules`], or a charge), and so each request opens a tab
    /// (`server/tab.rs`) that its answer settles.
    #[inline]
    pub(crate) fn counts_by_outcome(&self) -> bool {
        self.settings.outcome.is_some() || self.charges()
    }

    /// Whether a passed request's answer is charged once its body ends.
    #[inline]
    pub(crate) fn charges(&self) -> bool {
        let spend = self.settings.spend.as_ref();
        spend.is_some_and(|plan| plan.charge.is_some())
    }

    /// Whether an answer may lower a counter: a settle of a
    /// [`reserve`](crate::RateLimitLayer::reserve), a refund under
    /// [`count_if`](crate::RateLimitLayer::count_if), a clear under
    /// [`reset_if`](crate::RateLimitLayer::reset_if). The backend is told
    /// per counter ([`Counter::lowers`](crate::backend::Counter::lowers)).
    pub(crate) fn lowers_counts(&self) -> bool {
        let s = &self.settings;
        let reserves = s.spend.as_ref().is_some_and(SpendPlan::reserves);
        s.outcome.is_some() || reserves
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
}

impl<Bk: fmt::Debug, D> fmt::Debug for Core<Bk, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        let outcome = s.outcome.as_ref();
        f.debug_struct("Core")
            .field("name", &s.name)
            .field("policies", &s.policies)
            .field("backend", &self.backend)
            .field("headers", &s.policies.style())
            .field("failure", &s.failure.policy())
            .field("insurance", &s.failure.insurance().is_some())
            .field("missing_key", &s.missing_key)
            .field("timeout", &s.timeout)
            .field("shadow", &s.shadow)
            .field("skip", &s.skip.is_some())
            .field("count_if", &outcome.is_some_and(|o| o.count_if.is_some()))
            .field("decision_in", &s.decision_in)
            .field("spend", &s.spend)
            .field("reset_if", &outcome.is_some_and(|o| o.reset_if.is_some()))
            .field("charge", &self.charges())
            .field("in_flight", &s.in_flight)
            .field("denied", &s.denied)
            .finish_non_exhaustive()
    }
}
