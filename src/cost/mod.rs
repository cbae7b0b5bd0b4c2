//! Costs and charges: what a request spends on the way in
//! ([`cost`](crate::RateLimitLayer::cost),
//! [`cost_fn`](crate::RateLimitLayer::cost_fn), an estimate with
//! [`reserve`](crate::RateLimitLayer::reserve), a lockout with
//! [`block_for`](crate::RateLimitLayer::block_for)), and what its answer
//! adds once its body ends ([`charge`](crate::RateLimitLayer::charge),
//! read from a [`ResponseEnd`], through a [`Metered`] body), or how it
//! settles a reservation. A reservation can be read from the request's
//! body ([`reserve_from_body`](crate::RateLimitLayer::reserve_from_body),
//! [`BodyEstimate`]): a bounded prefix is read before the limiter runs,
//! and the service gets the body whole ([`Replay`]).
//!
//! The layer's [`Mode`] says in its type whether it spends: [`Plain`] by
//! default, [`Spends`] or [`Charged`] once a setter asks for it. A layer
//! that spends builds only on a backend that implements [`Spending`],
//! whatever the order of its setters ([`Counts`]). A layer that does not
//! spend counts with `hit_all`, as it always has, and runs nothing here.
//! The guide: [`docs/costs.md`](crate::guide::costs).

pub use self::body::{
    BodyEstimate, DEFAULT_BODY_LIMIT, FromHead, OverLimit, ReadBody, ReadBodyFuture, Replay,
};
pub use self::charge::{Metered, ResponseEnd};

pub(crate) mod body;
pub(crate) mod charge;

use std::fmt;
use std::sync::Arc;

use http::Response;

use crate::backend::{Amend, Backend, Counter, Hit, Spend, Spending};
use crate::cost::charge::Meter;
use crate::key::Key;
use crate::quota::Window;
use crate::request::RequestHead;

mod sealed {
    pub trait Sealed {}
}

/// A layer that counts plain hits: the default mode, on any
/// [`Backend`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

/// A layer that spends: after a [`cost`](crate::RateLimitLayer::cost),
/// [`cost_fn`](crate::RateLimitLayer::cost_fn),
/// [`reserve`](crate::RateLimitLayer::reserve),
/// [`block_for`](crate::RateLimitLayer::block_for) or
/// [`reset_if`](crate::RateLimitLayer::reset_if). It builds only on a
/// backend that implements [`Spending`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Spends;

/// A layer with a [`charge`](crate::RateLimitLayer::charge): it spends,
/// and its answers' bodies are [`Metered`]. It builds only on a backend
/// that implements [`Spending`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Charged;

impl sealed::Sealed for Plain {}
impl sealed::Sealed for Spends {}
impl sealed::Sealed for Charged {}

/// How a layer counts, in its type: [`Plain`] hits, or [`Spends`] and
/// [`Charged`], which need a backend that implements [`Spending`]. Sealed:
/// the layer's setters move it from one to the next, whatever their order.
pub trait Mode: sealed::Sealed {
    /// The mode once the layer spends: [`Spends`], or [`Charged`] when
    /// it is already charged.
    type Spending: Mode;
}

impl Mode for Plain {
    type Spending = Spends;
}

impl Mode for Spends {
    type Spending = Spends;
}

impl Mode for Charged {
    type Spending = Charged;
}

/// What a layer in mode `Self` counts with on `Bk`, and the body of its
/// answers to a service whose bodies are `B`.
///
/// A layer that spends on a backend that only implements [`Backend`] does
/// not compile, in whatever order its setters came:
///
/// ```compile_fail,E0277
/// # use std::time::Duration;
/// # use tower::{Layer, ServiceExt, service_fn};
/// # use tower_pinned_window::backend::{Backend, BackendError, Counter, Hit, MemoryBackend};
/// # use tower_pinned_window::key::Key;
/// # use tower_pinned_window::{Quota, RateLimitLayer};
/// /// Counts plain hits only: no `Spending`.
/// #[derive(Clone)]
/// struct HitsOnly(MemoryBackend);
///
/// impl Backend for HitsOnly {
///     // ...
/// #   type Future = <MemoryBackend as Backend>::Future;
/// #   type Refund = <MemoryBackend as Backend>::Refund;
/// #   fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
/// #       self.0.hit_all(key, counters)
/// #   }
/// #   fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
/// #       self.0.refund(namespace, key, hit)
/// #   }
/// #   async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
/// #       self.0.peek(namespace, key).await
/// #   }
/// #   async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
/// #       self.0.reset(namespace, key).await
/// #   }
/// }
///
/// # async fn run() {
/// let layer = RateLimitLayer::new("api", Quota::new(10, Duration::from_secs(60)).unwrap())
///     .cost(2)
///     .backend(HitsOnly(MemoryBackend::new()));
/// let service = layer.layer(service_fn(|_: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// }));
/// // error: a layer with a cost ... needs a backend that implements `Spending`
/// service.oneshot(http::Request::new(String::new())).await;
/// # }
/// ```
///
/// The same layer without `.cost(2)`, or on [`MemoryBackend`](crate::backend::MemoryBackend),
/// compiles.
#[diagnostic::on_unimplemented(
    message = "a layer with a cost, a charge, a lockout or a reset on success needs a backend that implements `Spending`",
    label = "`{Bk}` cannot spend",
    note = "implement `tower_pinned_window::backend::Spending` for the backend, or drop the cost, charge, block_for or reset_if"
)]
pub trait Counts<Bk, B>: Mode {
    /// The answers' body type: `B`, or [`Metered<B>`] under a charge.
    type Body;

    /// Spends `spend` of `key` on `counters` in `backend`.
    #[doc(hidden)]
    fn spend_all(backend: &Bk, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Bk::Future
    where
        Bk: Backend;

    /// Amends `hit` of `key` on `namespace`'s counter in `backend`.
    #[doc(hidden)]
    fn amend(backend: &Bk, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund
    where
        Bk: Backend;

    /// Hands back `response`, metered by `meter` when there is one.
    #[doc(hidden)]
    fn answer(response: Response<B>, meter: Option<Box<dyn Meter>>) -> Response<Self::Body>;
}

impl<Bk: Backend, B> Counts<Bk, B> for Plain {
    type Body = B;

    fn spend_all(backend: &Bk, key: &Key, counters: &[Counter<'_>], _spend: Spend) -> Bk::Future {
        // A plain layer has no spend plan: it never gets here.
        debug_assert!(false, "a plain layer spends nothing");
        backend.hit_all(key, counters)
    }

    fn amend(backend: &Bk, namespace: &str, key: &Key, hit: &Hit, _amend: Amend) -> Bk::Refund {
        // A plain layer only refunds (`Backend::refund`): it never gets here.
        debug_assert!(false, "a plain layer amends nothing");
        backend.refund(
            namespace,
            key,
            &Hit {
                deadline: None,
                ..*hit
            },
        )
    }

    #[inline(always)]
    fn answer(response: Response<B>, meter: Option<Box<dyn Meter>>) -> Response<B> {
        debug_assert!(meter.is_none(), "a layer without a charge meters nothing");
        response
    }
}

impl<Bk: Spending, B> Counts<Bk, B> for Spends {
    type Body = B;

    #[inline]
    fn spend_all(backend: &Bk, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Bk::Future {
        backend.spend_all(key, counters, spend)
    }

    fn amend(backend: &Bk, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund {
        backend.amend(namespace, key, hit, amend)
    }

    #[inline(always)]
    fn answer(response: Response<B>, meter: Option<Box<dyn Meter>>) -> Response<B> {
        debug_assert!(meter.is_none(), "a layer without a charge meters nothing");
        response
    }
}

impl<Bk: Spending, B: http_body::Body> Counts<Bk, B> for Charged {
    type Body = Metered<B>;

    #[inline]
    fn spend_all(backend: &Bk, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Bk::Future {
        backend.spend_all(key, counters, spend)
    }

    fn amend(backend: &Bk, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund {
        backend.amend(namespace, key, hit, amend)
    }

    #[inline]
    fn answer(response: Response<B>, meter: Option<Box<dyn Meter>>) -> Response<Metered<B>> {
        Metered::wrap(response, meter)
    }
}

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
    /// What a request reserves, settled by the charge once its answer ends
    /// ([`settle`]); it takes the place of `cost` (`check` refuses both).
    pub(crate) reserve: Option<CostFn>,
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
            reserve: None,
            open: false,
            block: None,
        }
    }

    /// What `request` costs: its reservation, when the layer reserves.
    #[inline]
    pub(crate) fn cost(&self, request: &RequestHead<'_>) -> u64 {
        if let Some(reserve) = &self.reserve {
            return reserve(request);
        }
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
            .field("reserve", &self.reserve.is_some())
            .field("open", &self.open)
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
/// ([`Spending::amend`]).
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
        plan.open = true;
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
}
