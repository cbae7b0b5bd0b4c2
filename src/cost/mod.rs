//! Costs and charges: what a request spends on the way in
//! ([`cost`](crate::RateLimitLayer::cost),
//! [`cost_fn`](crate::RateLimitLayer::cost_fn), an estimate with
//! [`reserve`](crate::RateLimitLayer::reserve), a lockout with
//! [`block_for`](crate::RateLimitLayer::block_for)), and what its answer
//! adds once its body ends ([`charge`](crate::RateLimitLayer::charge),
//! read from a [`ResponseHead`](crate::outcome::ResponseHead) with its
//! trailers and last chunk, through a [`Metered`] body), or how it
//! settles a reservation. A reservation can be read from the request's
//! body ([`reserve_from_body`](crate::RateLimitLayer::reserve_from_body),
//! [`BodyEstimate`]): a bounded prefix is read before the limiter runs,
//! and the service gets the body whole ([`Replay`]).
//!
//! The layer's mode says in its type whether it spends: `()`, plain hits,
//! by default, [`Spends`] or [`Charged`] once a setter asks for it. A layer
//! that spends builds only on a backend that implements [`Spending`],
//! whatever the order of its setters ([`Counts`]). A layer that does not
//! spend counts with `hit_all`, as it always has, and runs nothing here.
//! The guide: [`docs/costs.md`](crate::guide::costs).

pub use self::body::{BodyEstimate, DEFAULT_BODY_LIMIT, Replay};
pub use self::charge::Metered;
pub use self::leased::Capped;

pub(crate) mod body;
pub(crate) mod charge;
pub(crate) mod leased;

use std::any::Any;
use std::sync::Arc;

use http::Response;

use crate::backend::{Amend, Backend, Cap, Counter, Hit, SlotId, Spend, Spending};
use crate::cost::charge::Meter;
use crate::cost::leased::SlotGuard;
use crate::key::Key;

mod sealed {
    /// How a layer counts, in its type: `()`, plain hits, or
    /// [`Spends`](super::Spends) and [`Charged`](super::Charged), which
    /// need a backend that implements [`Spending`](super::Spending), each
    /// possibly [`Capped`](super::Capped) (a backend that implements
    /// [`Leasing`](crate::backend::Leasing) too). Sealed: the layer's
    /// setters move it from one to the next, whatever their order.
    pub trait Mode {
        /// The mode once the layer spends: `Spends`, or `Charged` when it
        /// is already charged.
        type Spending: Mode;
        /// The mode once the layer is charged.
        type Charged: Mode;
        /// The mode once the layer has an in-flight cap.
        type Capped: Mode;
    }

    impl Mode for () {
        type Spending = super::Spends;
        type Charged = super::Charged;
        type Capped = super::Capped<()>;
    }

    impl Mode for super::Spends {
        type Spending = super::Spends;
        type Charged = super::Charged;
        type Capped = super::Capped<super::Spends>;
    }

    impl Mode for super::Charged {
        type Spending = super::Charged;
        type Charged = super::Charged;
        type Capped = super::Capped<super::Charged>;
    }

    impl<M: Mode> Mode for super::Capped<M> {
        type Spending = super::Capped<M::Spending>;
        type Charged = super::Capped<M::Charged>;
        type Capped = Self;
    }
}

pub(crate) use sealed::Mode;

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

/// What a layer in mode `Self` (`()`, [`Spends`] or [`Charged`]) counts with on `Bk`, and the body of its
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
pub trait Counts<Bk, B>: sealed::Mode {
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

    /// Hands back `response`, metered by `meter` when there is one, its
    /// body holding `slot` under a cap.
    #[doc(hidden)]
    fn answer(
        response: Response<B>,
        meter: Option<Box<dyn Meter>>,
        slot: Option<SlotGuard>,
    ) -> Response<Self::Body>;

    /// Takes `slot` of `cap` for `key` and counts `counters` in one step,
    /// under a cap ([`Capped`]); no other mode is asked.
    #[doc(hidden)]
    fn take_all(
        backend: &Bk,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<Spend>,
    ) -> Bk::Future
    where
        Bk: Backend,
    {
        let _ = (cap, slot);
        debug_assert!(false, "only a capped layer takes slots");
        match spend {
            Some(spend) => Self::spend_all(backend, key, counters, spend),
            None => backend.hit_all(key, counters),
        }
    }

    /// The guard of `slot` of `key`, for the layer's slots `state` (its
    /// in-flight state, whose type names the backend), under a cap; no
    /// other mode is asked.
    #[doc(hidden)]
    fn guard(state: &Arc<dyn Any + Send + Sync>, key: &Key, slot: SlotId) -> Option<SlotGuard> {
        let _ = (state, key, slot);
        None
    }
}

impl<Bk: Backend, B> Counts<Bk, B> for () {
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
    fn answer(
        response: Response<B>,
        meter: Option<Box<dyn Meter>>,
        slot: Option<SlotGuard>,
    ) -> Response<B> {
        debug_assert!(meter.is_none(), "a layer without a charge meters nothing");
        debug_assert!(slot.is_none(), "a layer without a cap holds no slot");
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
    fn answer(
        response: Response<B>,
        meter: Option<Box<dyn Meter>>,
        slot: Option<SlotGuard>,
    ) -> Response<B> {
        debug_assert!(meter.is_none(), "a layer without a charge meters nothing");
        debug_assert!(slot.is_none(), "a layer without a cap holds no slot");
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
    fn answer(
        response: Response<B>,
        meter: Option<Box<dyn Meter>>,
        slot: Option<SlotGuard>,
    ) -> Response<Metered<B>> {
        debug_assert!(slot.is_none(), "a layer without a cap holds no slot");
        Metered::wrap(response, meter)
    }
}
