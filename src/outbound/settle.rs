//! The last step of a budgeted call's way back: under a
//! [`charge`](super::BudgetLayer::charge), the answer's body is
//! [`Metered`](crate::cost::Metered), and when it ends its usage settles
//! what the call spent, in the window it was spent in.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::backend::{Hit, Spending};
use crate::cost::charge::{Meter, ResponseEnd};
use crate::cost::settle;
use crate::key::Key;
use crate::outcome::report;

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
                let result = insurance.amend(&budget.name, &self.key, &self.hit, Some(amend));
                report(&budget.name, &budget.warn_gate, Some(amend), result);
            }
            return;
        }
        let mut pending = budget
            .backend
            .amend(&budget.name, &self.key, &self.hit, amend);
        if let Poll::Ready(result) =
            Pin::new(&mut pending).poll(&mut Context::from_waker(Waker::noop()))
        {
            report(&budget.name, &budget.warn_gate, Some(amend), result);
            return;
        }
        let (name, gate) = (Arc::clone(&budget.name), Arc::clone(&budget.warn_gate));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                report(&name, &gate, Some(amend), pending.await);
            })),
            Err(_) => {
                tracing::warn!(budget = %name, "budget settle dropped: the store could not take it at once, and there is no tokio runtime to finish it on");
            }
        }
    }
}
