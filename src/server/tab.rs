//! The request's tab, under a layer that counts by outcome
//! ([`outcome`](crate::outcome)): what its hits were counted as, kept from
//! the verdict to the answer, whose fate
//! ([`OutcomeRules::fate`](crate::outcome::rules::OutcomeRules::fate)) or charge settles them; a denial's are refunded
//! at once.

use std::sync::Arc;

use http::Response;
use smallvec::SmallVec;

use crate::backend::{Amend, Backend, Hit, Hits};
use crate::budget::settle::{Amending, Wait, drop_at_end, finish};
use crate::core::Core;
use crate::cost::charge::Meter;
use crate::count::ResponseHead;
use crate::decision::Decision;
use crate::key::Key;
use crate::outcome::rules::Fate;
use crate::policy::Policy;
use crate::response;

/// What a request's refund needs once its fate is known: the core (for the
/// backend and the [`OutcomeRules`]), the key, the policy whose counters
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

    /// Once the service answered with `response`, as its fate
    /// ([`OutcomeRules::fate`](crate::outcome::rules::OutcomeRules::fate)) says: clear the counters if `reset_if` picks
    /// the answer; refund the request's cost if `count_if` rejects it;
    /// otherwise keep it and, under a charge, meter the body.
    /// The decision, marked accordingly, is written onto the answer. See
    /// [`amend`](Self::amend) for the returned wait.
    pub(crate) fn settle<B>(mut self: Box<Self>, response: &mut Response<B>) -> Settled<Bk, D> {
        let Passed {
            mut decision,
            quota,
        } = self.passed.take().expect("a tab settles a passed request");
        let settings = &self.core.settings;
        let fate = (settings.outcome.as_ref()).map_or(Fate::Keep, |rules| rules.fate(response));
        // Whether the deciding counter counted the request at all.
        let counted = self
            .hits
            .get(quota)
            .is_some_and(|hit| hit.deadline.is_some());
        match fate {
            Fate::Clear => {
                if counted {
                    decision.clear();
                }
                response::passed(response, decision, true);
                self.amend(Some(Amend::Clear))
                    .map_or(Settled::Done, Settled::Wait)
            }
            Fate::Refund => {
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
                self.amend(refund).map_or(Settled::Done, Settled::Wait)
            }
            Fate::Keep => {
                response::passed(response, decision, true);
                if self.core.charges() && self.hits.iter().any(|hit| hit.deadline.is_some()) {
                    return Settled::Meter(self);
                }
                Settled::Done
            }
        }
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
        let amending = Amending::new(
            &settings.name,
            &settings.warn_gate,
            &settings.failure,
            insured,
        )?;
        let mut pending: SmallVec<[Bk::Refund; 2]> = SmallVec::new();
        for (hit, counter) in hits.iter().zip(policy.counters().iter()) {
            if hit.deadline.is_none() {
                // Not counted in the store (a deny-cache answer): nothing to
                // take back.
                continue;
            }
            let namespace = counter.namespace;
            let in_store = || match amend {
                None => core.backend.refund(namespace, &key, hit),
                Some(amend) => amend_in(&core.backend, namespace, &key, hit, amend),
            };
            pending.extend(amending.amend(namespace, &key, hit, amend, in_store));
        }
        if pending.is_empty() {
            return None;
        }
        let (name, gate) = (settings.name.clone(), settings.warn_gate.clone());
        finish(name, gate, amend, pending)
    }
}

impl<Bk, D> Meter for RefundTab<Bk, D>
where
    Bk: Backend,
    D: Send + Sync + 'static,
{
    fn end(self: Box<Self>, end: &ResponseHead<'_>) {
        let settings = &self.core.settings;
        let Some(plan) = &settings.spend else {
            return;
        };
        // A `cost` set beside a charge is kept, and the charge added to it;
        // a reservation is settled to the use.
        let spent = self.cost.unwrap_or(0);
        let Some(amend) = plan.settle_end(&settings.name, &settings.warn_gate, spent, end) else {
            return;
        };
        let (name, gate) = (settings.name.clone(), settings.warn_gate.clone());
        // A body cannot wait: with no tokio runtime to finish it on, it is
        // dropped.
        drop_at_end(&name, &gate, amend, self.amend(Some(amend)));
    }
}
