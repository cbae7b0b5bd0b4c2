//! The judge: once the backend has answered, a request is passed on,
//! denied (429 / RESOURCE_EXHAUSTED), or answered for a failure (503 /
//! UNAVAILABLE under fail-closed, 500 / INTERNAL for corrupt state, 400 or
//! 500 for a request without a usable key). Also the runtime core the
//! service and its futures share, and the gates that keep the log bounded.
//!
//! The judge picks the answer; [`response`](crate::response) builds it and
//! writes every header, and the quota's metrics count the decision.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::Response;

use crate::backend::{BackendError, Hits, MemoryBackend};
use crate::charge::ChargeFn;
use crate::cost::SpendPlan;
use crate::count::CountIf;
use crate::decision::{Carry, Decision, DecisionIn};
use crate::key::{Key, KeyError};
use crate::metrics::LayerMetrics;
use crate::policy::{Policies, Policy};
use crate::quota::Share;
use crate::request::RequestHead;
use crate::response::{self, Deny};

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
    /// Answer with the status the [`KeyError`] names: 400 for a request that
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
    /// The insurance limiter's counters, under [`FailurePolicy::Insurance`].
    pub(crate) insurance: Option<MemoryBackend>,
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

/// What the limiter does with a request once the backend has answered.
pub(crate) enum Verdict<B> {
    /// Call the service; write the decision onto its answer
    /// ([`response::passed`]), if there is one: `None` for a request passed
    /// uncounted, or counted with nothing to show (see [`Core::judge`]).
    Pass(Option<Passed>),
    /// Answer without calling the service.
    Respond(Response<B>),
}

/// What the insurance limiter needs to count a request the backend failed:
/// its key and, under a layer that spends, its cost.
#[derive(Clone, Copy)]
pub(crate) struct Fallback<'a> {
    pub(crate) key: &'a Key,
    pub(crate) cost: Option<u64>,
}

/// What the insurance limiter counted for a request: its hits in the local
/// store, and the policy (at the share) they were counted under.
pub(crate) struct Insured {
    pub(crate) hits: Hits,
    pub(crate) policy: Policy,
}

/// A request passed on counted: its decision, for its answer.
pub(crate) struct Passed {
    /// The decision: its label holds the quota's header fields, so the
    /// answer needs nothing else of the policy.
    pub(crate) decision: Decision,
    /// Which of the policy's quotas decided (an index into the backend's
    /// hits), for a refund to tell whether that counter counted the hit.
    pub(crate) quota: usize,
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
    /// refund step (`refund.rs`).
    #[inline]
    pub(crate) fn counts_by_outcome(&self) -> bool {
        let s = &self.settings;
        s.count_if.is_some() || s.reset_if.is_some() || s.charge.is_some()
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

    /// The verdict on `request`, given the backend's `result` for `policy`.
    ///
    /// Unless `read` (the decision on a passed request is carried to the
    /// request or the response, or settled under `count_if`), a request
    /// that passes with nothing to show for it (no headers, no metrics, no
    /// [`on_decision`](crate::RateLimitLayer::on_decision) callback, no
    /// debug log, hits to spare) gets no [`Decision`] at all: nobody would
    /// read it.
    pub(crate) fn judge<B>(
        &self,
        result: Result<Hits, BackendError>,
        policy: &Policy,
        request: &RequestHead<'_>,
        read: bool,
    ) -> Verdict<B>
    where
        D: Deny<B>,
        B: Default,
    {
        let s = &self.settings;
        if let Err(err) = &result {
            s.metrics.backend_error(&s.name, err);
        }
        let hits = match result {
            Ok(hits) => hits,
            Err(err) if err.is_corrupt() => {
                tracing::error!(limiter = %s.name, error = %err, "corrupt rate-limit counter: request stopped, value left untouched");
                let mut response = response::corrupt(request.is_grpc());
                response.extensions_mut().insert(err.kind());
                return Verdict::Respond(response);
            }
            Err(err) => return self.outage(err, request),
        };
        let Some((index, hit)) = policy.decisive(&hits) else {
            let err = BackendError::Unavailable("the backend answered no hit".into());
            s.metrics.backend_error(&s.name, &err);
            return self.outage(err, request);
        };
        if !read
            && s.observer.is_none()
            && policy.passes_unseen(index, hit)
            && !tracing::enabled!(tracing::Level::DEBUG)
        {
            return Verdict::Pass(None);
        }
        let decision = policy.decision(index, hit, s.shadow, request.route_owned());
        tracing::debug!(limiter = %s.name, policy = decision.policy(), count = decision.count(), limit = decision.limit(), outcome = ?decision.outcome(), "rate-limit decision");
        policy.quota_metrics(index).record(&decision);
        if let Some(observer) = &s.observer {
            observer(&decision);
        }
        if decision.passed() {
            return Verdict::Pass(Some(Passed {
                decision,
                quota: index,
            }));
        }
        Verdict::Respond(response::denial(&self.deny, decision, request.is_grpc()))
    }

    /// The verdict on `request`, whose `cost` is above the limit of the
    /// quota at `index` of `policy`: denied (passed in shadow mode), with
    /// nothing counted, since it could never be admitted.
    #[cold]
    pub(crate) fn never_fits<B>(
        &self,
        policy: &Policy,
        index: usize,
        cost: u64,
        request: &RequestHead<'_>,
    ) -> Verdict<B>
    where
        D: Deny<B>,
        B: Default,
    {
        let s = &self.settings;
        let decision = policy.never_fitting(index, cost, s.shadow, request.route_owned());
        tracing::debug!(limiter = %s.name, policy = decision.policy(), cost, limit = decision.limit(), "rate-limit cost above the limit: the request can never be admitted");
        policy.quota_metrics(index).record(&decision);
        if let Some(observer) = &s.observer {
            observer(&decision);
        }
        if decision.passed() {
            return Verdict::Pass(Some(Passed {
                decision,
                quota: index,
            }));
        }
        Verdict::Respond(response::denial(&self.deny, decision, request.is_grpc()))
    }

    /// Whether the insurance limiter decides on a request the backend
    /// answered `err`: under [`FailurePolicy::Insurance`], for an outage
    /// (corrupt state is never insured).
    #[inline]
    pub(crate) fn insures(&self, err: &BackendError) -> bool {
        self.settings.insurance.is_some() && !err.is_corrupt()
    }

    /// The verdict on `request` when the backend failed with `err` under
    /// [`FailurePolicy::Insurance`] (see [`insures`](Self::insures)): the
    /// insurance limiter's, with the request's `fallback`, or 503 when it
    /// cannot decide either.
    /// With the verdict, what the insurance counted (`None` when it could
    /// not decide), for a refund, a charge or a clear in the local store.
    #[cold]
    pub(crate) fn insure<B>(
        &self,
        err: BackendError,
        policy: &Policy,
        request: &RequestHead<'_>,
        fallback: Fallback<'_>,
    ) -> (Verdict<B>, Option<Insured>)
    where
        D: Deny<B>,
        B: Default,
    {
        let s = &self.settings;
        s.metrics.backend_error(&s.name, &err);
        let (FailurePolicy::Insurance(share), Some(local)) = (s.failure, &s.insurance) else {
            return (self.outage(err, request), None);
        };
        let Some((verdict, insured)) = self.insured(share, local, fallback, policy, request) else {
            return (self.outage(err, request), None);
        };
        if let Some(suppressed) = s.warn_gate.admit() {
            tracing::warn!(limiter = %s.name, error = %err, suppressed, "rate-limit backend failed: deciding with the insurance limiter");
        }
        (verdict, Some(insured))
    }

    /// The verdict on `request` when the backend failed with `err`: a pass
    /// uncounted under fail-open, otherwise 503 (under insurance, when the
    /// insurance limiter could not decide either).
    #[cold]
    fn outage<B: Default>(&self, err: BackendError, request: &RequestHead<'_>) -> Verdict<B> {
        let s = &self.settings;
        let fail_open = s.failure == FailurePolicy::FailOpen;
        if let Some(suppressed) = s.warn_gate.admit() {
            let action = if fail_open {
                "passing requests uncounted"
            } else {
                "answering 503"
            };
            tracing::warn!(limiter = %s.name, error = %err, suppressed, "rate-limit backend failed: {action}");
        }
        if fail_open {
            return Verdict::Pass(None);
        }
        let mut response = response::unavailable(request.is_grpc());
        // Where a decision would be: what kind of failure answered.
        response.extensions_mut().insert(err.kind());
        Verdict::Respond(response)
    }

    /// The insurance limiter's verdict on `request`: `policy` with each
    /// limit cut to `share`, counted in `local`. `None` when the local store
    /// fails too (full, or a corrupt counter): the request is answered as
    /// under fail-closed.
    #[cold]
    fn insured<B>(
        &self,
        share: Share,
        local: &MemoryBackend,
        fallback: Fallback<'_>,
        policy: &Policy,
        request: &RequestHead<'_>,
    ) -> Option<(Verdict<B>, Insured)>
    where
        D: Deny<B>,
        B: Default,
    {
        let s = &self.settings;
        let policy = policy.insured(share);
        let mut hit = match (fallback.cost, &s.spend) {
            (Some(cost), Some(plan)) => policy.spend(local, fallback.key, plan.spend(cost)),
            _ => policy.hit(local, fallback.key),
        };
        // The memory backend answers on its first poll.
        let Poll::Ready(result) = Pin::new(&mut hit).poll(&mut Context::from_waker(Waker::noop()))
        else {
            return None;
        };
        let hits = match result {
            Ok(hits) => hits,
            Err(err) => {
                s.metrics.backend_error(&s.name, &err);
                tracing::debug!(limiter = %s.name, error = %err, "the insurance limiter failed too: answering as fail-closed");
                return None;
            }
        };
        let (index, hit) = policy.decisive(&hits)?;
        let mut decision = policy.decision(index, hit, s.shadow, request.route_owned());
        decision.insure();
        tracing::debug!(limiter = %s.name, policy = decision.policy(), count = decision.count(), limit = decision.limit(), outcome = ?decision.outcome(), "rate-limit decision by the insurance limiter");
        policy.quota_metrics(index).record(&decision);
        if let Some(observer) = &s.observer {
            observer(&decision);
        }
        let verdict = if decision.passed() {
            Verdict::Pass(Some(Passed {
                decision,
                quota: index,
            }))
        } else {
            Verdict::Respond(response::denial(&self.deny, decision, request.is_grpc()))
        };
        Some((verdict, Insured { hits, policy }))
    }

    /// The answer to a request without a usable key, under
    /// [`OnMissingKey::Reject`].
    pub(crate) fn key_error_response<B: Default>(
        &self,
        err: &KeyError,
        request: &RequestHead<'_>,
    ) -> Response<B> {
        let s = &self.settings;
        match err {
            KeyError::Misconfigured(_) => {
                if let Some(suppressed) = s.key_gate.admit() {
                    tracing::error!(limiter = %s.name, error = %err, suppressed, "rate-limit key extractor misconfigured: answering 500");
                }
            }
            _ => {
                if let Some(suppressed) = s.key_gate.admit() {
                    tracing::warn!(limiter = %s.name, error = %err, suppressed, "request without a usable rate-limit key: answering 400");
                }
            }
        }
        response::key_rejected(request.is_grpc(), err.status())
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
