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

use crate::backend::{Backend, BackendError, Hits};
use crate::count::ResponseHead;
use crate::decision::Decision;
use crate::judge::{Core, LogGate, Passed, Verdict};
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
pub(crate) struct RefundTab<Bk, D> {
    core: Arc<Core<Bk, D>>,
    key: Key,
    policy: Option<Arc<Policy>>,
    hits: Hits,
    passed: Option<Passed>,
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
        })
    }

    /// The passed request's decision, before any refund.
    pub(crate) fn decision(&self) -> Option<&Decision> {
        self.passed.as_ref().map(|passed| &passed.decision)
    }

    /// Once the service answered with `response`: keep the hits if the
    /// answer counts; otherwise refund them and mark the request's decision
    /// refunded. Then the decision is written onto the answer. See
    /// [`refund`](Self::refund) for the returned wait.
    pub(crate) fn settle<B>(mut self: Box<Self>, response: &mut Response<B>) -> Option<Wait> {
        let Passed {
            mut decision,
            quota,
        } = self.passed.take().expect("a tab settles a passed request");
        let counts = self
            .core
            .settings
            .count_if
            .as_ref()
            .is_none_or(|counts| counts(&ResponseHead::new(response)));
        if counts {
            response::passed(response, decision, true);
            return None;
        }
        // The decision no longer counts the hit, when the deciding counter
        // counted it at all.
        if self
            .hits
            .get(quota)
            .is_some_and(|hit| hit.deadline.is_some())
        {
            decision.refund();
        }
        response::passed(response, decision, true);
        self.refund()
    }

    /// A denied request was never served: its hits are refunded at once,
    /// and the decision in the `denial` marked refunded when they were
    /// counted (a store counts all of a request's hits or, answering from a
    /// cache, none).
    fn deny<B>(self: Box<Self>, denial: &mut Response<B>) -> Option<Wait> {
        if self.hits.iter().any(|hit| hit.deadline.is_some())
            && let Some(decision) = denial.extensions_mut().get_mut::<Decision>()
        {
            decision.refund();
        }
        self.refund()
    }

    /// Refunds each hit the store counted (a hit with a deadline). A refund
    /// that completes at once (the memory backend's) is done here. One that
    /// has to go out is finished on a tokio task, so the client never waits
    /// for it; only outside a tokio runtime is it handed back, for the
    /// response to wait on.
    fn refund(self: Box<Self>) -> Option<Wait> {
        let Self {
            core,
            key,
            policy,
            hits,
            passed: _,
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
            let mut refund = core.backend.refund(counter.namespace, &key, hit);
            match Pin::new(&mut refund).poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(result) => report(&settings.name, &settings.warn_gate, result),
                Poll::Pending => pending.push(refund),
            }
        }
        if pending.is_empty() {
            return None;
        }
        let (name, gate) = (settings.name.clone(), settings.warn_gate.clone());
        let finish = async move {
            for refund in pending {
                report(&name, &gate, refund.await);
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
    let counted = match &result {
        Ok(hits) => {
            tab.hits = hits.clone();
            tab.policy = Some(policy.to_arc());
            true
        }
        Err(_) => false,
    };
    match core.judge(result, policy, request, true) {
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

/// Logs one refund's result; failures at most once per period of `gate`.
fn report(limiter: &str, gate: &LogGate, result: Result<bool, BackendError>) {
    match result {
        Ok(true) => tracing::trace!(limiter, "rate-limit hit refunded"),
        Ok(false) => tracing::debug!(
            limiter,
            "rate-limit refund found nothing to take back: the hit's window closed or was reset"
        ),
        Err(err) => {
            if let Some(suppressed) = gate.admit() {
                if err.is_corrupt() {
                    tracing::error!(limiter, error = %err, suppressed, "rate-limit refund found a corrupt counter: the hit stays counted, the value untouched");
                } else {
                    tracing::warn!(limiter, error = %err, suppressed, "rate-limit refund failed: the hit stays counted");
                }
            }
        }
    }
}
