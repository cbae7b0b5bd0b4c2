//! The last step of a budgeted call's way back: under a
//! [`charge`](super::BudgetLayer::charge), the answer's body is
//! [`Metered`](crate::cost::Metered), and when it ends its usage settles
//! what the call spent, in the window it was spent in.

use std::sync::Arc;

use crate::backend::{Hit, Spending};
use crate::budget::settle::{Amending, drop_at_end, finish};
use crate::cost::charge::Meter;
use crate::count::ResponseHead;
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
    fn end(self: Box<Self>, end: &ResponseHead<'_>) {
        let budget = &self.budget;
        let (name, gate) = (&budget.name, &budget.warn_gate);
        let Some(amend) = budget.plan.settle_end(name, gate, self.spent, end) else {
            return;
        };
        let Some(amending) = Amending::new(name, gate, &budget.failure, self.insured) else {
            return;
        };
        // The counter the call's cost was spent from: the tokens', when the
        // budget has them.
        let namespace = budget.namespace(budget.cost_at());
        let in_store = || budget.backend.amend(namespace, &self.key, &self.hit, amend);
        let Some(pending) = amending.amend(namespace, &self.key, &self.hit, Some(amend), in_store)
        else {
            return;
        };
        // A body cannot wait: with no tokio runtime to finish it on, it is
        // dropped.
        let unfinished = finish(Arc::clone(name), Arc::clone(gate), Some(amend), [pending]);
        drop_at_end(name, gate, amend, unfinished);
    }
}
