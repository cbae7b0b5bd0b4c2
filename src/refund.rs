//! The way back: when the layer counts by outcome (see
//! [`count_if`](crate::RateLimitLayer::count_if)), the hits of a request
//! whose answer does not count, or that was denied, are refunded, each in
//! the window it was counted in.
//!
//! This step is on a request's path only when `count_if` is set: the
//! service and its future check [`Core::counts_by_outcome`] and, without
//! it, go from the backend's answer straight to the judge; nothing here
//! runs, and nothing is kept or allocated.
//!
//! A denied request is refunded at once: it was never served. What keeps a
//! hit counted, on purpose: a service error or a response future dropped
//! before the answer (no answer, and the service may have done the work),
//! a refund the backend failed, and a process that stops between the hit
//! and the refund. Each hit is refunded at most once: the tab is consumed
//! by its one [`settle`](RefundTab::settle) or [`deny`](RefundTab::deny).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Response;
use smallvec::SmallVec;

use crate::backend::{Amend, Backend, BackendError, Hit, Hits, MemoryBackend};
use crate::charge::{Charged, Meter, Metered, NoCharge, ResponseEnd};
use crate::count::ResponseHead;
use crate::decision::Decision;
use crate::judge::{Core, Fallback, Insured, LogGate, Passed, Settings, Verdict};
use crate::key::Key;
use crate::policy::{Policy, Selected};
use crate::request::RequestHead;
use crate::response::{self, Deny};

/// Refunds still under way, for the response to wait on when no tokio
/// runtime is there to finish them.
pub(crate) type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a request's refund needs once its fate is known: the core (for the
/// backend and the `count_if` predicate), the key, the policy whose counters
/// were hit, the hits with their windows, and, once it passed counted, its
/// decision for the answer.
pub struct RefundTab<Bk, D> {
    core: Arc<Core<Bk, D>>,
    key: Key,
    policy: Option<Arc<Policy>>,
    hits: Hits,
    passed: Option<Passed>,
    /// What the request spent, under a layer that spends (`spend_all`);
    /// `None` for a request counted with `hit_all`, whose hits are refunded
    /// with `refund`.
    cost: Option<u64>,
    /// The insurance limiter counted the hits, in its own store: they are
    /// amended there.
    insured: bool,
}

impl<Bk, D> std::fmt::Debug for RefundTab<Bk, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefundTab")
            .field("hits", &self.hits)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

/// What follows a passed request's answer once its tab is settled.
pub(crate) enum Settled<Bk, D> {
    /// Nothing more.
    Done,
    /// Refunds or clears under way, for the response to wait on.
    Wait(Wait),
    /// A charge to take when the body ends: the tab meters the body.
    Meter(Box<RefundTab<Bk, D>>),
}

/// [`judge`]'s verdict on a request whose hits may be refunded.
pub(crate) enum CountedVerdict<B, Bk, D> {
    /// Call the service; its answer [settles](RefundTab::settle) the tab.
    Pass(Box<RefundTab<Bk, D>>),
    /// Call the service, uncounted (fail-open): nothing to refund, nothing
    /// to write onto the answer.
    PassUncounted,
    /// Answer without calling the service, after the wait when its refunds
    /// must finish first.
    Respond(Response<B>, Option<Wait>),
}

impl<Bk: Backend, D> RefundTab<Bk, D> {
    /// The tab of a request charged to `key`, under a layer that counts by
    /// outcome.
    pub(crate) fn open(core: &Arc<Core<Bk, D>>, key: &Key) -> Box<Self> {
        Box::new(Self {
            core: Arc::clone(core),
            key: key.clone(),
            policy: None,
            hits: Hits::new(),
            passed: None,
            cost: None,
            insured: false,
        })
    }

    /// The request spends `cost` (`spend_all`): that is what a refund takes
    /// back.
    pub(crate) fn spending(&mut self, cost: u64) {
        self.cost = Some(cost);
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
    fn deny<B>(self: Box<Self>, denial: &mut Response<B>) -> Option<Wait> {
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
                if let Some(local) = &settings.insurance {
                    amend_insured(local, counter.namespace, &key, hit, amend, settings);
                }
                continue;
            }
            let mut refund = match amend {
                None => core.backend.refund(counter.namespace, &key, hit),
                Some(amend) => core.backend.amend(counter.namespace, &key, hit, amend),
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

/// [`Core::judge`], for a layer that counts by outcome: the backend's hits
/// and the policy are kept on `tab` when they may be refunded, for a
/// request passed counted (after its answer) or denied (at once). Any other
/// verdict drops the tab: a failure or a request passed uncounted has
/// nothing to refund.
pub(crate) fn judge<Bk, D, B>(
    core: &Core<Bk, D>,
    mut tab: Box<RefundTab<Bk, D>>,
    result: Result<Hits, BackendError>,
    policy: &Selected<'_>,
    request: &RequestHead<'_>,
) -> CountedVerdict<B, Bk, D>
where
    Bk: Backend,
    D: Deny<B>,
    B: Default,
{
    let (verdict, counted) = match result {
        Err(err) if core.insures(&err) => {
            let fallback = Fallback {
                key: &tab.key,
                cost: tab.cost,
            };
            let (verdict, insured) = core.insure(err, policy, request, fallback);
            // What the insurance counted is refunded, charged or cleared in
            // its own store, never in the backend.
            let counted = insured.is_some();
            if let Some(Insured { hits, policy }) = insured {
                tab.hits = hits;
                tab.policy = Some(Arc::new(policy));
                tab.insured = true;
            }
            (verdict, counted)
        }
        result => {
            let counted = match &result {
                Ok(hits) => {
                    tab.hits = hits.clone();
                    tab.policy = Some(policy.to_arc());
                    true
                }
                Err(_) => false,
            };
            (core.judge(result, policy, request, true), counted)
        }
    };
    match verdict {
        Verdict::Pass(Some(passed)) => {
            tab.passed = Some(passed);
            CountedVerdict::Pass(tab)
        }
        Verdict::Pass(None) => CountedVerdict::PassUncounted,
        Verdict::Respond(mut response) => {
            let wait = if counted {
                tab.deny(&mut response)
            } else {
                None
            };
            CountedVerdict::Respond(response, wait)
        }
    }
}

/// Amends (or refunds, `None`) `hit` of `key` in the insurance limiter's
/// store, which answers at once.
#[cold]
fn amend_insured(
    local: &MemoryBackend,
    namespace: &str,
    key: &Key,
    hit: &Hit,
    amend: Option<Amend>,
    settings: &Settings,
) {
    let mut refund = match amend {
        None => local.refund(namespace, key, hit),
        Some(amend) => local.amend(namespace, key, hit, amend),
    };
    if let Poll::Ready(result) = Pin::new(&mut refund).poll(&mut Context::from_waker(Waker::noop()))
    {
        report(&settings.name, &settings.warn_gate, amend, result);
    }
}

/// Logs one refund's or amend's result; failures at most once per period
/// of `gate`.
fn report(limiter: &str, gate: &LogGate, amend: Option<Amend>, result: Result<bool, BackendError>) {
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
        let Some(charge) = self.core.settings.charge.clone() else {
            return;
        };
        let cost = charge(end);
        if cost == 0 {
            return;
        }
        let (name, gate) = (
            self.core.settings.name.clone(),
            self.core.settings.warn_gate.clone(),
        );
        if self.amend(Some(Amend::Charge(cost))).is_some() && gate.admit().is_some() {
            // No tokio runtime to finish it on, and a body cannot wait.
            tracing::warn!(limiter = %name, cost, "rate-limit charge dropped: the backend could not take it at once, and there is no tokio runtime to finish it on");
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

impl sealed::Sealed for NoCharge {}
impl sealed::Sealed for Charged {}

/// Whether a layer's answers carry a charge: [`NoCharge`] (the default) or
/// [`Charged`] (after [`charge`](crate::RateLimitLayer::charge)). It picks
/// the body type of the answers to requests with a `B` body, for a layer
/// whose denials are made by `D`: the service's own, or [`Metered`] around
/// it. Sealed: only these two implement it.
pub trait ChargeMode<B, D>: sealed::Sealed {
    /// The answers' body type.
    type Body;

    /// Hands back `response`, metered by `tab` when there is one.
    #[doc(hidden)]
    fn answer<Bk: Backend>(
        response: Response<B>,
        tab: Option<Box<RefundTab<Bk, D>>>,
    ) -> Response<Self::Body>;
}

impl<B, D> ChargeMode<B, D> for NoCharge {
    type Body = B;

    #[inline(always)]
    fn answer<Bk: Backend>(
        response: Response<B>,
        tab: Option<Box<RefundTab<Bk, D>>>,
    ) -> Response<B> {
        debug_assert!(tab.is_none(), "a layer without a charge meters nothing");
        drop(tab);
        response
    }
}

impl<B, D> ChargeMode<B, D> for Charged
where
    B: http_body::Body,
    D: Send + Sync + 'static,
{
    type Body = Metered<B>;

    #[inline]
    fn answer<Bk: Backend>(
        response: Response<B>,
        tab: Option<Box<RefundTab<Bk, D>>>,
    ) -> Response<Metered<B>> {
        Metered::wrap(response, tab.map(|tab| tab as Box<dyn Meter>))
    }
}
