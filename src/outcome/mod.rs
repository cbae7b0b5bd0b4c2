//! Counting by outcome: a request's hits wait for the service's answer,
//! which decides what they become.
//!
//! - [`count_if`](crate::RateLimitLayer::count_if) (or
//!   [`count_only`](crate::RateLimitLayer::count_only) with a [`CountOnly`])
//!   keeps a hit only when its answer, read through a [`ResponseHead`],
//!   counts: the hits of any other answer, and of a denial, are refunded,
//!   each in the window it was counted in;
//! - [`reset_if`](crate::RateLimitLayer::reset_if) clears the key's counters
//!   when the answer says so (a successful login);
//! - a [`charge`](crate::RateLimitLayer::charge) adds the answer's cost when
//!   its body ends, or settles the request's
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
//! [`Decision`] in its response.

pub use crate::count::{CountOnly, ResponseHead};
pub use crate::decision::WantDecision;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Response;
use smallvec::SmallVec;

use crate::backend::{Amend, Backend, BackendError, Hit, Hits};
use crate::core::{Core, LogGate};
use crate::cost::charge::{Meter, ResponseEnd};
use crate::cost::settle;
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::Policy;
use crate::response;

/// Refunds still under way, for the response to wait on when no tokio
/// runtime is there to finish them.
pub(crate) type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a request's refund needs once its fate is known: the core (for the
/// backend and the `count_if` predicate), the key, the policy whose counters
/// were hit, the hits with their windows, and, once it passed counted, its
/// decision for the answer.
pub(crate) struct RefundTab<Bk: Backend, D> {
    core: Arc<Core<Bk, D>>,
    pub(crate) key: Key,
    policy: Option<Arc<Policy>>,
    hits: Hits,
    passed: Option<Passed>,
    /// How the layer's mode amends a spend in the backend.
    amend_in: AmendFn<Bk>,
    /// What the request spent, under a layer that spends (`spend_all`);
    /// `None` for a request counted with `hit_all`, whose hits are refunded
    /// with `refund`.
    cost: Option<u64>,
    /// The insurance limiter counted the hits, in its own store: they are
    /// amended there.
    insured: bool,
}

/// [`Spending::amend`](crate::backend::Spending::amend), as the layer's mode
/// reaches it.
pub(crate) type AmendFn<Bk> = fn(&Bk, &str, &Key, &Hit, Amend) -> <Bk as Backend>::Refund;

/// A request passed on counted: its decision, for its answer.
pub(crate) struct Passed {
    /// The decision: its label holds the quota's header fields, so the
    /// answer needs nothing else of the policy.
    pub(crate) decision: Decision,
    /// Which of the policy's quotas decided (an index into the backend's
    /// hits), for a refund to tell whether that counter counted the hit.
    pub(crate) quota: usize,
}

impl<Bk: Backend, D> std::fmt::Debug for RefundTab<Bk, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefundTab")
            .field("hits", &self.hits)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

/// What follows a passed request's answer once its tab is settled.
pub(crate) enum Settled<Bk: Backend, D> {
    /// Nothing more.
    Done,
    /// Refunds or clears under way, for the response to wait on.
    Wait(Wait),
    /// A charge to take when the body ends: the tab meters the body.
    Meter(Box<RefundTab<Bk, D>>),
}

impl<Bk: Backend, D> RefundTab<Bk, D> {
    /// The tab of a request charged to `key`, under a layer that counts by
    /// outcome.
    /// `cost` is what the request spends (`spend_all`), what a refund takes
    /// back, amended with `amend_in`; `None` for a request counted with
    /// `hit_all`.
    pub(crate) fn open(
        core: &Arc<Core<Bk, D>>,
        key: &Key,
        cost: Option<u64>,
        amend_in: AmendFn<Bk>,
    ) -> Box<Self> {
        Box::new(Self {
            core: Arc::clone(core),
            key: key.clone(),
            policy: None,
            hits: Hits::new(),
            passed: None,
            amend_in,
            cost,
            insured: false,
        })
    }

    /// The request's cost, when it spends.
    pub(crate) fn cost(&self) -> Option<u64> {
        self.cost
    }

    /// The store counted `hits` on `policy`'s counters: they may be
    /// refunded. `insured`: the insurance limiter's store counted them, and
    /// they are amended there.
    pub(crate) fn counted(&mut self, hits: &Hits, policy: Arc<Policy>, insured: bool) {
        self.hits = hits.clone();
        self.policy = Some(policy);
        self.insured = insured;
    }

    /// The request passed counted: its answer settles the tab.
    pub(crate) fn pass(&mut self, passed: Passed) {
        self.passed = Some(passed);
    }

    /// The passed request's decision, before any refund.
    pub(crate) fn decision(&self) -> Option<&Decision> {
        self.passed.as_ref().map(|passed| &passed.decision)
    }

    /// Once the service answered with `response`: clear the counters if
    /// `reset_if` picks the answer; refund the request's cost if `count_if`
    /// rejects it; otherwise keep it and, under a charge, meter the body.
    /// The decision, marked accordingly, is written onto the answer. See
    /// [`amend`](Self::amend) for the returned wait.
    pub(crate) fn settle<B>(mut self: Box<Self>, response: &mut Response<B>) -> Settled<Bk, D> {
        let Passed {
            mut decision,
            quota,
        } = self.passed.take().expect("a tab settles a passed request");
        let settings = &self.core.settings;
        let (reset, counts) = {
            let head = ResponseHead::new(response);
            let reset = settings.reset_if.as_ref().is_some_and(|reset| reset(&head));
            let counts = reset
                || settings
                    .count_if
                    .as_ref()
                    .is_none_or(|counts| counts(&head));
            (reset, counts)
        };
        // Whether the deciding counter counted the request at all.
        let counted = self
            .hits
            .get(quota)
            .is_some_and(|hit| hit.deadline.is_some());
        if reset {
            if counted {
                decision.clear();
            }
            response::passed(response, decision, true);
            return self
                .amend(Some(Amend::Clear))
                .map_or(Settled::Done, Settled::Wait);
        }
        if !counts {
            let refund = match self.cost {
                None => None,
                Some(0) => {
                    response::passed(response, decision, true);
                    return Settled::Done;
                }
                Some(cost) => Some(Amend::Refund(cost)),
            };
            if counted {
                decision.refund(self.cost.unwrap_or(1));
            }
            response::passed(response, decision, true);
            return self.amend(refund).map_or(Settled::Done, Settled::Wait);
        }
        response::passed(response, decision, true);
        if settings.charge.is_some() && self.hits.iter().any(|hit| hit.deadline.is_some()) {
            return Settled::Meter(self);
        }
        Settled::Done
    }

    /// A denied request was never served: its hits are refunded at once,
    /// and the decision in the `denial` marked refunded when they were
    /// counted (a store counts all of a request's hits or, answering from a
    /// cache, none).
    pub(crate) fn deny<B>(self: Box<Self>, denial: &mut Response<B>) -> Option<Wait> {
        if self.hits.iter().any(|hit| hit.deadline.is_some())
            && let Some(decision) = denial.extensions_mut().get_mut::<Decision>()
        {
            decision.refund(self.cost.unwrap_or(1));
        }
        // A denial under `spend_all` spent nothing: no hit has a deadline.
        let refund = self.cost.map(Amend::Refund);
        self.amend(refund)
    }

    /// Amends each hit the store counted (a hit with a deadline) with
    /// `amend`, or refunds it (`None`: a hit of `hit_all`). One that
    /// completes at once (the memory backend's) is done here. One that has
    /// to go out is finished on a tokio task, so the client never waits for
    /// it; only outside a tokio runtime is it handed back, for the response
    /// to wait on.
    fn amend(self: Box<Self>, amend: Option<Amend>) -> Option<Wait> {
        let Self {
            core,
            key,
            policy,
            hits,
            passed: _,
            amend_in,
            cost: _,
            insured,
        } = *self;
        let settings = &core.settings;
        let policy = policy?;
        let mut pending: SmallVec<[Bk::Refund; 2]> = SmallVec::new();
        for (hit, counter) in hits.iter().zip(policy.counters().iter()) {
            if hit.deadline.is_none() {
                // Not counted in the store (a deny-cache answer): nothing to
                // take back.
                continue;
            }
            if insured {
                if let Some(insurance) = &settings.insurance {
                    let result = insurance.amend(counter.namespace, &key, hit, amend);
                    report(&settings.name, &settings.warn_gate, amend, result);
                }
                continue;
            }
            let mut refund = match amend {
                None => core.backend.refund(counter.namespace, &key, hit),
                Some(amend) => amend_in(&core.backend, counter.namespace, &key, hit, amend),
            };
            match Pin::new(&mut refund).poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(result) => report(&settings.name, &settings.warn_gate, amend, result),
                Poll::Pending => pending.push(refund),
            }
        }
        if pending.is_empty() {
            return None;
        }
        let (name, gate) = (settings.name.clone(), settings.warn_gate.clone());
        let finish = async move {
            for refund in pending {
                report(&name, &gate, amend, refund.await);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(runtime.spawn(finish));
                None
            }
            Err(_) => Some(Box::pin(finish)),
        }
    }
}

/// Logs one refund's or amend's result; failures at most once per period
/// of `gate`.
pub(crate) fn report(
    limiter: &str,
    gate: &LogGate,
    amend: Option<Amend>,
    result: Result<bool, BackendError>,
) {
    let what = match amend {
        None | Some(Amend::Refund(_)) => "refund",
        Some(Amend::Charge(_)) => "charge",
        Some(Amend::Clear) => "clear",
    };
    match result {
        Ok(true) => tracing::trace!(limiter, what, "rate-limit counter amended"),
        Ok(false) => tracing::debug!(
            limiter,
            what,
            "rate-limit {what} found nothing to change: the hit's window closed or was reset"
        ),
        Err(err) => {
            if let Some(suppressed) = gate.admit() {
                if err.is_corrupt() {
                    tracing::error!(limiter, error = %err, suppressed, "rate-limit {what} found a corrupt counter: the count stays as it is, the value untouched");
                } else {
                    tracing::warn!(limiter, error = %err, suppressed, "rate-limit {what} failed: the count stays as it is");
                }
            }
        }
    }
}

impl<Bk, D> Meter for RefundTab<Bk, D>
where
    Bk: Backend,
    D: Send + Sync + 'static,
{
    fn end(self: Box<Self>, end: &ResponseEnd<'_>) {
        let settings = &self.core.settings;
        let Some(charge) = settings.charge.clone() else {
            return;
        };
        let used = charge(end);
        // What the request spent for the charge to settle: its reservation
        // under `reserve`; 0 otherwise (a `cost` set beside a charge is
        // kept, and the charge added to it).
        let reserved = match &settings.spend {
            Some(plan) if plan.reserve.is_some() => self.cost.unwrap_or(0),
            _ => 0,
        };
        let (name, gate) = (settings.name.clone(), settings.warn_gate.clone());
        if used.is_none()
            && let Some(suppressed) = gate.admit()
        {
            tracing::warn!(limiter = %name, reserved, suppressed, "rate-limit charge could not read the answer's usage (absent or malformed): nothing charged or settled (a reservation stays spent)");
        }
        let Some(amend) = settle(reserved, used) else {
            return;
        };
        if self.amend(Some(amend)).is_some() && gate.admit().is_some() {
            // No tokio runtime to finish it on, and a body cannot wait.
            tracing::warn!(limiter = %name, ?amend, "rate-limit charge dropped: the backend could not take it at once, and there is no tokio runtime to finish it on");
        }
    }
}
