//! The spend plan, written once for every middleware: what a request or a
//! call costs on its way out (a fixed cost, one read from its head, or a
//! reservation), how that becomes the store's [`Spend`] (opened for a
//! charge to come, with a lockout), the checks of settings that depend on
//! each other, and what the answer's usage settles once it is read.

use std::fmt;
use std::sync::Arc;

use crate::backend::{Amend, Spend};
use crate::count::ResponseHead;
use crate::error::ConfigError;
use crate::quota::Window;
use crate::request::RequestHead;

use super::log::{LogGate, unreadable_usage};

/// A request's cost, read from its head.
pub(crate) type CostFn = Arc<dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync>;

/// What an answer used, read when its body has ended; `None` when it could
/// not be read (absent or malformed). The one type of every middleware's
/// `charge`.
pub(crate) type UsageFn = Arc<dyn Fn(&ResponseHead<'_>) -> Option<u64> + Send + Sync>;

/// A request's cost: the same for every request, or read from its head.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u64),
    By(CostFn),
}

/// How a layer that spends turns a request into a [`Spend`], and what its
/// answer settles.
#[derive(Clone, Default)]
pub(crate) struct SpendPlan {
    /// What a request costs; `None`: 1, or 0 when a charge follows.
    pub(crate) cost: Option<Cost>,
    /// What a request reserves, settled by the charge once its answer ends
    /// ([`settle`]); it takes the place of `cost` (`check` refuses both).
    pub(crate) reserve: Option<CostFn>,
    /// What the answer adds once its body ends (or settles a reservation
    /// to); the window is opened at a cost of 0 for it.
    pub(crate) charge: Option<UsageFn>,
    /// Lock a key that does not fit for this long.
    pub(crate) block: Option<Window>,
}

impl SpendPlan {
    /// A plan that counts 1 a request, with no lockout.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// What `request` costs: its reservation, when the layer reserves.
    #[inline]
    pub(crate) fn cost(&self, request: &RequestHead<'_>) -> u64 {
        if let Some(reserve) = &self.reserve {
            return reserve(request);
        }
        match &self.cost {
            None if self.charge.is_some() => 0,
            None => 1,
            Some(Cost::Fixed(cost)) => *cost,
            Some(Cost::By(cost)) => cost(request),
        }
    }

    /// The store's spend for a request of `cost`.
    #[inline]
    pub(crate) fn spend(&self, cost: u64) -> Spend {
        let mut spend = Spend::cost(cost);
        if self.charge.is_some() {
            // A charge to come needs a window to land in, even at cost 0.
            spend = spend.open();
        }
        if let Some(block) = self.block {
            spend = spend.block(block);
        }
        spend
    }

    /// Whether an answer may lower what a request spent: a settle of a
    /// reservation.
    #[inline]
    pub(crate) fn reserves(&self) -> bool {
        self.reserve.is_some()
    }

    /// Whether the plan can work, whatever the order its settings came in;
    /// `smallest_limit` is the smallest limit a request may be charged to.
    ///
    /// # Errors
    /// [`ConfigError::ReserveWithoutCharge`], [`ConfigError::ReserveWithCost`],
    /// [`ConfigError::CostAboveLimit`] for a fixed cost no request could fit.
    pub(crate) fn check(&self, smallest_limit: u64) -> Result<(), ConfigError> {
        if self.reserve.is_some() {
            if self.charge.is_none() {
                return Err(ConfigError::ReserveWithoutCharge);
            }
            if self.cost.is_some() {
                return Err(ConfigError::ReserveWithCost);
            }
        }
        if let Some(Cost::Fixed(cost)) = self.cost
            && cost > smallest_limit
        {
            return Err(ConfigError::CostAboveLimit {
                cost,
                limit: smallest_limit,
            });
        }
        Ok(())
    }

    /// What the answer's `end` settles for a request that `spent` this on
    /// its way out, under a charge: the amend, or `None` when there is
    /// nothing to change (or no charge). An unreadable usage is logged
    /// under `limiter`'s `gate`, and settles nothing: a reservation stays
    /// spent.
    pub(crate) fn settle_end(
        &self,
        limiter: &str,
        gate: &LogGate,
        spent: u64,
        end: &ResponseHead<'_>,
    ) -> Option<Amend> {
        let charge = self.charge.as_ref()?;
        // What the request spent for the charge to settle: its reservation
        // under `reserve`; 0 otherwise (a cost set beside a charge is kept,
        // and the charge added to it).
        let reserved = if self.reserves() { spent } else { 0 };
        let used = charge(end);
        if used.is_none() {
            unreadable_usage(limiter, gate, reserved);
        }
        settle(reserved, used)
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
            .field("reserve", &self.reserve.is_some())
            .field("charge", &self.charge.is_some())
            .field("block", &self.block)
            .finish()
    }
}

/// How an answer settles what its request spent on the way in, once its
/// charge has read the actual use: `reserved` is what the request
/// spent on the way in for the charge to settle (its
/// [`reserve`](crate::RateLimitLayer::reserve) estimate, 0 without one),
/// `used` what the charge read (`None`: it could not read it).
///
/// - `used` above `reserved`: charge the difference;
/// - below: refund the difference;
/// - equal, or `None` (the usage is unknown: the reservation stays spent,
///   since the work was done): nothing.
///
/// Without a reservation this is the plain charge: `used`, unless it is 0.
/// The amend applies in the request's own window under the amend rules
/// ([`Spending::amend`](crate::backend::Spending::amend)).
#[inline]
pub(crate) fn settle(reserved: u64, used: Option<u64>) -> Option<Amend> {
    let used = used?;
    match used.cmp(&reserved) {
        std::cmp::Ordering::Greater => Some(Amend::Charge(used - reserved)),
        std::cmp::Ordering::Less => Some(Amend::Refund(reserved - used)),
        std::cmp::Ordering::Equal => None,
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
        plan.charge = Some(Arc::new(|_: &ResponseHead<'_>| Some(1)));
        assert_eq!(plan.cost(&head), 0);
        assert_eq!(plan.spend(0), Spend::cost(0).open());
        plan.cost = Some(Cost::By(Arc::new(|_: &RequestHead<'_>| 7)));
        assert_eq!(plan.cost(&head), 7);
        let hour = Window::new(Duration::from_secs(3600)).unwrap();
        plan.block = Some(hour);
        assert_eq!(plan.spend(7), Spend::cost(7).open().block(hour));
        // A reservation is what the request spends on the way in.
        plan.reserve = Some(Arc::new(|_: &RequestHead<'_>| 300));
        assert_eq!(plan.cost(&head), 300);
    }

    #[test]
    fn a_reservation_settles_to_the_actual_use() {
        assert_eq!(settle(300, Some(450)), Some(Amend::Charge(150)));
        assert_eq!(settle(300, Some(120)), Some(Amend::Refund(180)));
        assert_eq!(settle(300, Some(0)), Some(Amend::Refund(300)));
        assert_eq!(settle(300, Some(300)), None, "nothing to change");
        assert_eq!(
            settle(300, None),
            None,
            "unknown use: the reservation stays"
        );
        // Without a reservation: the plain charge.
        assert_eq!(settle(0, Some(7)), Some(Amend::Charge(7)));
        assert_eq!(settle(0, Some(0)), None);
        assert_eq!(settle(0, None), None);
        // The extremes never overflow.
        assert_eq!(settle(0, Some(u64::MAX)), Some(Amend::Charge(u64::MAX)));
        assert_eq!(settle(u64::MAX, Some(0)), Some(Amend::Refund(u64::MAX)));
        assert_eq!(settle(u64::MAX, Some(u64::MAX)), None);
    }

    #[test]
    fn the_checks_that_span_setters_hold_in_one_order_for_every_layer() {
        let estimate: CostFn = Arc::new(|_: &RequestHead<'_>| 5);
        let usage: UsageFn = Arc::new(|_: &ResponseHead<'_>| Some(1));
        let plan = |cost: Option<u64>, reserve: bool, charge: bool| SpendPlan {
            cost: cost.map(Cost::Fixed),
            reserve: reserve.then(|| Arc::clone(&estimate)),
            charge: charge.then(|| Arc::clone(&usage)),
            block: None,
        };
        assert_eq!(plan(None, false, false).check(1), Ok(()));
        assert_eq!(plan(Some(10), false, false).check(10), Ok(()));
        assert_eq!(
            plan(Some(11), false, false).check(10),
            Err(ConfigError::CostAboveLimit {
                cost: 11,
                limit: 10
            })
        );
        assert_eq!(
            plan(None, true, false).check(10),
            Err(ConfigError::ReserveWithoutCharge)
        );
        assert_eq!(
            plan(Some(2), true, true).check(10),
            Err(ConfigError::ReserveWithCost)
        );
        // A reservation's errors come first, whatever else is wrong.
        assert_eq!(
            plan(Some(11), true, false).check(10),
            Err(ConfigError::ReserveWithoutCharge)
        );
        assert_eq!(plan(None, true, true).check(10), Ok(()));
    }
}
