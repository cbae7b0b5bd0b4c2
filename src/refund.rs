//! The way back: once the service has answered, a passed request whose
//! answer does not count (see
//! [`count_if`](crate::RateLimitLayer::count_if)) has its hits refunded, each
//! in the window it was counted in.
//!
//! A request carries a [`Tab`] only when `count_if` is set: without it
//! nothing here runs, and nothing is kept or allocated.
//!
//! What keeps a hit counted, on purpose: a denial (it was not served, so
//! there is no answer to judge), a service error or a response future
//! dropped before the answer (no answer either), a refund the backend
//! failed, and a process that stops between the hit and the refund. Each
//! hit is refunded at most once: the tab is consumed by its one
//! [`settle`](Tab::settle).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Response;
use smallvec::SmallVec;

use crate::backend::{Backend, BackendError, Hits};
use crate::count::ResponseHead;
use crate::judge::{Core, LogGate, Stamp, Verdict};
use crate::key::Key;
use crate::policy::Policy;
use crate::request::RequestHead;
use crate::response::Deny;

/// Refunds still under way, for the response to wait on when no tokio
/// runtime is there to finish them.
pub(crate) type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a request's refund needs once its answer is known: the core (for
/// the backend and the `count_if` predicate), the key, and the hits with
/// their windows.
pub(crate) struct Tab<Bk, D> {
    core: Arc<Core<Bk, D>>,
    key: Key,
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
            hits: Hits::new(),
        }))
    }

    /// Once the service answered with `response`: keep the hits if the
    /// answer counts; otherwise refund each counted hit and mark the
    /// request's decision refunded.
    ///
    /// A refund that completes at once (the memory backend's) is done here.
    /// One that has to go out is finished on a tokio task, so the client
    /// never waits for it; only outside a tokio runtime is it handed back,
    /// for the response to wait on.
    pub(crate) fn settle<B>(
        self: Box<Self>,
        stamp: &mut Stamp,
        response: &Response<B>,
    ) -> Option<Wait> {
        let Self { core, key, hits } = *self;
        let settings = &core.settings;
        let counts = settings
            .count_if
            .as_ref()
            .is_none_or(|counts| counts(&ResponseHead::new(response)));
        if counts {
            return None;
        }
        stamp.refund(&hits);
        let pending = refund_all(&core.backend, stamp.policy(), &key, &hits, |result| {
            report(&settings.name, &settings.warn_gate, result);
        });
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

/// Issues the refund of every hit the store counted (a hit with a
/// deadline), each polled once at once: `done` gets those that complete
/// then, and the rest are returned.
fn refund_all<Bk: Backend>(
    backend: &Bk,
    policy: &Policy,
    key: &Key,
    hits: &Hits,
    mut done: impl FnMut(Result<bool, BackendError>),
) -> SmallVec<[Bk::Refund; 2]> {
    let mut pending = SmallVec::new();
    for (hit, counter) in hits.iter().zip(policy.counters().iter()) {
        if hit.deadline.is_none() {
            // Not counted in the store (a deny-cache answer): nothing to
            // take back.
            continue;
        }
        let mut refund = backend.refund(counter.namespace, key, hit);
        match Pin::new(&mut refund).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => done(result),
            Poll::Pending => pending.push(refund),
        }
    }
    pending
}

/// [`Core::judge`], keeping the backend's hits on `tab` when the request
/// passes counted; any other verdict drops the tab (a denial, a failure, a
/// request passed uncounted have nothing to refund).
#[inline]
pub(crate) fn judge<Bk, D, B>(
    core: &Core<Bk, D>,
    tab: Option<Box<Tab<Bk, D>>>,
    result: Result<Hits, BackendError>,
    policy: Arc<Policy>,
    request: &RequestHead<'_>,
) -> (Verdict<B>, Option<Box<Tab<Bk, D>>>)
where
    D: Deny<B>,
    B: Default,
{
    let Some(mut tab) = tab else {
        return (core.judge(result, policy, request), None);
    };
    if let Ok(hits) = &result {
        tab.hits = hits.clone();
    }
    let verdict = core.judge(result, policy, request);
    let tab = matches!(verdict, Verdict::Pass(Some(_))).then_some(tab);
    (verdict, tab)
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
