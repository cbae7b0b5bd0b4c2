//! The last step of a budgeted call's way back: under a
//! [`charge`](super::BudgetLayer::charge), the answer's body is
//! [`Metered`](crate::cost::Metered), and when it ends its usage settles
//! what the call spent, in the window it was spent in.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::backend::{BackendError, Hit, Spending};
use crate::charge::{Meter, ResponseEnd};
use crate::cost::settle;
use crate::key::Key;

use super::admit::Budget;

/// What a call that the store counted owes once its answer's usage is read.
pub(crate) struct Tab<Bk> {
    pub(crate) budget: Arc<Budget<Bk>>,
    pub(crate) key: Key,
    pub(crate) hit: Hit,
    /// What the call spent on its way out.
    pub(crate) spent: u64,
    /// Counted by the insurance limiter, in this process.
    pub(crate) insured: bool,
}

impl<Bk: Spending> Meter for Tab<Bk> {
    fn end(self: Box<Self>, end: &ResponseEnd<'_>) {
        let budget = &self.budget;
        let Some(charge) = &budget.charge else {
            return;
        };
        let Some(used) = charge(end) else {
            budget.log_unreadable_usage();
            return;
        };
        let reserved = if budget.reserve { self.spent } else { 0 };
        let Some(amend) = settle(reserved, Some(used)) else {
            return;
        };
        if self.insured {
            if let Some(insurance) = &budget.insurance {
                report(
                    &budget.name,
                    insurance.amend(&budget.name, &self.key, &self.hit, Some(amend)),
                );
            }
            return;
        }
        let mut pending = budget
            .backend
            .amend(&budget.name, &self.key, &self.hit, amend);
        if let Poll::Ready(result) =
            Pin::new(&mut pending).poll(&mut Context::from_waker(Waker::noop()))
        {
            report(&budget.name, result);
            return;
        }
        let name = Arc::clone(&budget.name);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move { report(&name, pending.await) })),
            Err(_) => {
                tracing::warn!(budget = %name, "budget settle dropped: the store could not take it at once, and there is no tokio runtime to finish it on");
            }
        }
    }
}

/// Logs one settle's result.
fn report(budget: &str, result: Result<bool, BackendError>) {
    match result {
        Ok(true) => tracing::trace!(budget, "budget settled"),
        Ok(false) => tracing::debug!(
            budget,
            "budget settle found nothing to change: the call's window closed or was reset"
        ),
        Err(err) => {
            tracing::warn!(budget, error = %err, "budget settle failed: what the call spent stays")
        }
    }
}
