//! How a [`RateLimitLayer`](crate::RateLimitLayer) with an in-flight cap
//! counts ([`Capped`]): each request's slot and quotas in one store step
//! ([`Leasing::take_all`]), and its answer's body holding the slot.

use std::any::Any;
use std::sync::Arc;

use http::Response;

use crate::backend::{Amend, Backend, Cap, Counter, Hit, Leasing, SlotId, Spend};
use crate::cost::charge::Meter;
use crate::cost::{Capped, Counts};
use crate::key::Key;

use super::slot::{Leased, Shared, SlotGuard};

impl<Bk, B, M> Counts<Bk, B> for Capped<M>
where
    Bk: Leasing,
    M: Counts<Bk, B>,
{
    type Body = Leased<M::Body>;

    #[inline]
    fn spend_all(backend: &Bk, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Bk::Future
    where
        Bk: Backend,
    {
        M::spend_all(backend, key, counters, spend)
    }

    fn amend(backend: &Bk, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Bk::Refund
    where
        Bk: Backend,
    {
        M::amend(backend, namespace, key, hit, amend)
    }

    #[inline]
    fn answer(
        response: Response<B>,
        meter: Option<Box<dyn Meter>>,
        slot: Option<SlotGuard>,
    ) -> Response<Leased<M::Body>> {
        M::answer(response, meter, None).map(|body| Leased::new(body, slot))
    }

    #[inline]
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
        backend.take_all(key, cap, slot, counters, spend)
    }

    fn guard(state: &Arc<dyn Any + Send + Sync>, key: &Key, slot: SlotId) -> Option<SlotGuard> {
        // The layer's slots were made for this backend when it was built.
        let shared = Arc::clone(state).downcast::<Shared<Bk>>().ok()?;
        Some(SlotGuard::new(shared, key.clone(), slot, false))
    }
}
