//! Settling what a request spent once its answer is known (a refund, a
//! charge, a clear), written once for every middleware: each amend goes
//! where the hit was counted (the store, or the insurance limiter's own
//! store), is finished at once when the store can, and otherwise on a tokio
//! task so that nobody waits for it. With no tokio runtime, an amend still
//! under way is handed back for a response to wait on, or, at a body's end
//! (which cannot wait), dropped with a warning.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::backend::{Amend, BackendError, Hit};
use crate::insurance::Insurance;
use crate::key::Key;

use super::failure::Failure;
use super::log::{LogGate, report};

/// Amends still under way, for a response to wait on when no tokio runtime
/// is there to finish them.
pub(crate) type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Where a hit was counted, and so where it is amended.
#[derive(Clone, Copy)]
pub(crate) struct Amending<'a> {
    /// The name the log lines give.
    pub(crate) limiter: &'a str,
    pub(crate) gate: &'a LogGate,
    /// The insurance limiter counted the hit, in this process: it is
    /// amended there, never in the store.
    pub(crate) insured: Option<&'a Insurance>,
}

impl<'a> Amending<'a> {
    /// Where `limiter`'s hits are amended: in the insurance limiter's store
    /// of `failure` when it counted them (`insured`), otherwise in the
    /// store. `None` when the insurance counted them and is gone: nothing
    /// it counted is ever amended in the store.
    #[inline]
    pub(crate) fn new(
        limiter: &'a str,
        gate: &'a LogGate,
        failure: &'a Failure,
        insured: bool,
    ) -> Option<Self> {
        let insured = match (insured, failure.insurance()) {
            (false, _) => None,
            (true, Some(insurance)) => Some(insurance),
            (true, None) => return None,
        };
        Some(Self {
            limiter,
            gate,
            insured,
        })
    }

    /// Amends `hit` (a refund for `None`) of `namespace` and `key`: in the
    /// insurance limiter's store when it counted it, otherwise in the store
    /// with `in_store`. A result given at once is reported; an amend still
    /// under way is handed back, for [`finish`].
    #[inline]
    pub(crate) fn amend<R>(
        &self,
        namespace: &str,
        key: &Key,
        hit: &Hit,
        amend: Option<Amend>,
        in_store: impl FnOnce() -> R,
    ) -> Option<R>
    where
        R: Future<Output = Result<bool, BackendError>> + Unpin,
    {
        if let Some(insurance) = self.insured {
            let result = insurance.amend(namespace, key, hit, amend);
            report(self.limiter, self.gate, amend, result);
            return None;
        }
        let mut pending = in_store();
        match Pin::new(&mut pending).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => {
                report(self.limiter, self.gate, amend, result);
                None
            }
            Poll::Pending => Some(pending),
        }
    }
}

/// Finishes the `pending` amends on a tokio task, so nobody waits for them,
/// each result reported under `limiter`'s `gate`; outside a tokio runtime
/// they are handed back, for a response to wait on.
pub(crate) fn finish<I, R>(
    limiter: Arc<str>,
    gate: Arc<LogGate>,
    amend: Option<Amend>,
    pending: I,
) -> Option<Wait>
where
    I: IntoIterator<Item = R> + Send + 'static,
    I::IntoIter: Send,
    R: Future<Output = Result<bool, BackendError>> + Send + 'static,
{
    let finish = async move {
        for refund in pending {
            report(&limiter, &gate, amend, refund.await);
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

/// At a body's end, which cannot wait: the amends [`finish`] handed back
/// (no tokio runtime to finish them on) are dropped, with a warning at
/// most once per period of `gate`.
pub(crate) fn drop_at_end(limiter: &str, gate: &LogGate, amend: Amend, unfinished: Option<Wait>) {
    if unfinished.is_some() && gate.admit().is_some() {
        tracing::warn!(
            limiter,
            ?amend,
            "rate-limit charge dropped: the backend could not take it at once, and there is no tokio runtime to finish it on"
        );
    }
}
