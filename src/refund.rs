//! The way back: when the layer counts by outcome (see
//! [`count_if`](crate::RateLimitLayer::count_if)), the hits of a request
//! whose answer does not count, or that was denied, are refunded, each in
//! the window it was counted in.
//!
//! A request carries a [`Tab`] only when `count_if` is set: without it
//! nothing here runs, and nothing is kept or allocated.
//!
//! A denied request is refunded at once: it was never served. What keeps a
//! hit counted, on purpose: a service error or a response future dropped
//! before the answer (no answer, and the service may have done the work),
//! a refund the backend failed, and a process that stops between the hit
//! and the refund. Each hit is refunded at most once: the tab is consumed
//! by its one [`settle`](Tab::settle) or [`deny`](Tab::deny).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Response;
use smallvec::SmallVec;

use crate::backend::{Backend, BackendError, Hits};
use crate::count::ResponseHead;
use crate::decision::Decision;
use crate::judge::{Core, LogGate, Stamp, Verdict};
use crate::key::Key;
use crate::policy::{Policy, Selected};
use crate::request::RequestHead;
use crate::response::Deny;

/// Refunds still under way, for the response to wait on when no tokio
/// runtime is there to finish them.
pub(crate) type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a request's refund needs once its fate is known: the core (for the
/// backend and the `count_if` predicate), the key, the policy whose counters
/// were hit, and the hits with their windows.
pub(crate) struct Tab<Bk, D> {
    core: Arc<Core<Bk, D>>,
    key: Key,
    policy: Option<Arc<Policy>>,
    hits: Hits,
}

impl<Bk: Backend, D> Tab<Bk, D> {
    /// The tab of a request charged to `key`; `None` (no allocation, no
    /// clone) unless the layer counts by outcome.
    #[inline]
    pub(crate) fn open(core: &Arc<Core<Bk, D>>, key: &Key) -> Option<Box<Self>> {
        core.settings.count_if.as_ref()?;
        Some(Box::new(Self {
            core: Arc::clone(core),
            key: key.clone(),
            policy: None,
            hits: Hits::new(),
        }))
    }

    /// Once the service answered with `response`: keep the hits if the
    /// answer counts; otherwise refund them and mark the request's decision
    /// refunded. See [`refund`](Self::refund) for the returned wait.
    pub(crate) fn settle<B>(self, stamp: &mut Stamp, response: &Response<B>) -> Option<Wait> {
        let counts = self
            .core
            .settings
            .count_if
            .as_ref()
            .is_none_or(|counts| counts(&ResponseHead::new(response)));
        if counts {
            return None;
        }
        stamp.refund(&self.hits);
        self.refund()
    }

    /// A denied request was never served: its hits are refunded at once,
    /// and the decision in the `denial` marked refunded when they were
    /// counted (a store counts all of a request's hits or, answering from a
    /// cache, none).
    pub(crate) fn deny<B>(self, denial: &mut Response<B>) -> Option<Wait> {
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
    fn refund(self) -> Option<Wait> {
        let Self {
            core,
            key,
            policy,
            hits,
        } = self;
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

/// [`Core::judge`], keeping the backend's hits and the policy on `tab` when
/// they may be refunded: for a request passed counted (after its answer) or
/// denied (at once). Any other verdict drops the tab: a failure or a request
/// passed uncounted has nothing to refund.
#[inline]
pub(crate) fn judge<Bk, D, B>(
    core: &Core<Bk, D>,
    tab: Option<Box<Tab<Bk, D>>>,
    result: Result<Hits, BackendError>,
    policy: &Selected<'_>,
    request: &RequestHead<'_>,
) -> (Verdict<B>, Option<Box<Tab<Bk, D>>>)
where
    D: Deny<B>,
    B: Default,
{
    let Some(mut tab) = tab else {
        return (core.judge(result, policy, request), None);
    };
    let counted = match &result {
        Ok(hits) => {
            tab.hits = hits.clone();
            tab.policy = Some(policy.to_arc());
            true
        }
        Err(_) => false,
    };
    let verdict = core.judge(result, policy, request);
    let keep = match &verdict {
        Verdict::Pass(stamp) => stamp.is_some(),
        Verdict::Respond(_) => counted,
    };
    (verdict, keep.then_some(tab))
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
