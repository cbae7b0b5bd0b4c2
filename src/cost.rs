//! What a request spends: the plan a layer with a cost, a charge, a lockout
//! or a reset on success follows on the way in (see
//! [`RateLimitLayer::cost`](crate::RateLimitLayer::cost)), turned per
//! request into the backend's [`Spend`].
//!
//! Without any of these, nothing here runs: the request is counted with
//! `hit_all`, as a layer has always counted it.

use std::fmt;
use std::sync::Arc;

use crate::backend::Spend;
use crate::quota::Window;
use crate::request::RequestHead;

/// A request's cost, read from its head.
pub(crate) type CostFn = Arc<dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync>;

/// A request's cost: the same for every request, or read from its head.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u64),
    By(CostFn),
}

/// How a layer that spends turns a request into a [`Spend`].
#[derive(Clone)]
pub(crate) struct SpendPlan {
    /// What a request costs; `None`: 1, or 0 when a charge follows.
    pub(crate) cost: Option<Cost>,
    /// Open the window at a cost of 0, for a charge to come.
    pub(crate) open: bool,
    /// Lock a key that does not fit for this long.
    pub(crate) block: Option<Window>,
}

impl SpendPlan {
    /// A plan that counts 1 a request, with no lockout.
    pub(crate) fn new() -> Self {
        Self {
            cost: None,
            open: false,
            block: None,
        }
    }

    /// What `request` costs.
    #[inline]
    pub(crate) fn cost(&self, request: &RequestHead<'_>) -> u64 {
        match &self.cost {
            None if self.open => 0,
            None => 1,
            Some(Cost::Fixed(cost)) => *cost,
            Some(Cost::By(cost)) => cost(request),
        }
    }

    /// The backend's spend for a request of `cost`.
    #[inline]
    pub(crate) fn spend(&self, cost: u64) -> Spend {
        let mut spend = Spend::cost(cost);
        if self.open {
            spend = spend.open();
        }
        if let Some(block) = self.block {
            spend = spend.block(block);
        }
        spend
    }
}

impl fmt::Debug for SpendPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cost = match &self.cost {
            None => "default".to_owned(),
            Some(Cost::Fixed(cost)) => cost.to_string(),
            Some(Cost::By(_)) => "per request".to_owned(),
        };
        f.debug_struct("SpendPlan")
            .field("cost", &cost)
            .field("open", &self.open)
            .field("block", &self.block)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_cost_is_one_or_nothing_before_a_charge() {
        let request = http::Request::new(());
        let head = RequestHead::new(&request);
        let mut plan = SpendPlan::new();
        assert_eq!(plan.cost(&head), 1);
        assert_eq!(plan.spend(1), Spend::cost(1));
        plan.open = true;
        assert_eq!(plan.cost(&head), 0);
        assert_eq!(plan.spend(0), Spend::cost(0).open());
        plan.cost = Some(Cost::By(Arc::new(|_: &RequestHead<'_>| 7)));
        assert_eq!(plan.cost(&head), 7);
        let hour = Window::new(Duration::from_secs(3600)).unwrap();
        plan.block = Some(hour);
        assert_eq!(plan.spend(7), Spend::cost(7).open().block(hour));
    }
}
