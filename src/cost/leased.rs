//! A request's slot in flight, held by its answer: the guard that gives
//! it back, the body that holds the guard until the answer ends
//! ([`Leased`]), and the mode of a [`RateLimitLayer`](crate::RateLimitLayer)
//! with an [in-flight cap](crate::RateLimitLayer::in_flight)
//! ([`Capped`]). The layers' shared state, which takes, extends and gives
//! back slots in a store, is in `in_flight/slot.rs`, above: a guard names
//! it without its backend's type ([`Release`]).

use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::backend::SlotId;
use crate::key::Key;

/// The mode of a [`RateLimitLayer`](crate::RateLimitLayer) with an
/// [in-flight cap](crate::RateLimitLayer::in_flight) over the mode `M` it
/// had: each request takes its slot and counts its quotas in one store
/// step, and its answer's body is [`Leased`], holding the slot. It builds
/// only on a backend that implements [`Leasing`](crate::backend::Leasing).
#[derive(Debug, Clone, Copy, Default)]
pub struct Capped<M>(PhantomData<fn() -> M>);

/// What a guard asks of its layer's slots, without the backend's type:
/// the in-flight layer's shared state implements it (`in_flight/slot.rs`)
/// for a backend that implements [`Leasing`](crate::backend::Leasing).
pub(crate) trait Release: Send + Sync {
    /// Give `slot` of `key` back: to the store, or to the insurance
    /// limiter when `local`. One that fails is left to the lease.
    fn release(&self, key: &Key, slot: SlotId, local: bool);

    /// Extend `slot` of `key`, taken in the store, until it is given back.
    fn hold(self: Arc<Self>, key: &Key, slot: SlotId);
}

/// A slot a request holds: given back when dropped. Made before the
/// store's answer is read, it gives back a take that may have been made
/// for a request that will never know it (a timeout, a cancelled call, an
/// answer lost with its connection), by its name, which frees nothing
/// else; [`disarm`](Self::disarm) it once the store said nothing was taken.
pub struct SlotGuard {
    shared: Arc<dyn Release>,
    key: Key,
    slot: SlotId,
    local: bool,
    armed: bool,
}

impl SlotGuard {
    pub(crate) fn new(shared: Arc<dyn Release>, key: Key, slot: SlotId, local: bool) -> Self {
        Self {
            shared,
            key,
            slot,
            local,
            armed: true,
        }
    }

    /// The key the slot is for.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The slot's name.
    pub(crate) fn slot(&self) -> SlotId {
        self.slot
    }

    /// Nothing to give back: the store took no slot (refused, or failed
    /// on a corrupt record, which is left as it is).
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// The slot was taken in the store: its lease is extended until the
    /// guard is dropped.
    pub(crate) fn hold(&self) {
        Arc::clone(&self.shared).hold(&self.key, self.slot);
    }

    /// The guard of this slot taken in the insurance limiter's memory
    /// (this one still gives back the store's take, if any, when dropped).
    pub(crate) fn local(&self) -> Self {
        Self::new(Arc::clone(&self.shared), self.key.clone(), self.slot, true)
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release(&self.key, self.slot, self.local);
        }
    }
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard")
            .field("key", &self.key)
            .field("slot", &self.slot)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The body of an answer from an [`InFlightLayer`](crate::InFlightLayer):
    /// the service's body, holding the request's slot until the body ends,
    /// fails or is dropped (a client that went away, a stream cut short).
    /// Frames, size hints and the end pass through unchanged.
    pub struct Leased<B> {
        #[pin]
        body: B,
        slot: Option<SlotGuard>,
    }
}

impl<B> Leased<B> {
    pub(crate) fn new(body: B, slot: Option<SlotGuard>) -> Self {
        Self { body, slot }
    }

    /// Whether this body still holds its request's slot.
    pub fn holds_slot(&self) -> bool {
        self.slot.is_some()
    }

    /// The service's body; the slot is given back.
    pub fn into_inner(self) -> B {
        self.body
    }
}

impl<B: Default> Default for Leased<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

impl<B: fmt::Debug> fmt::Debug for Leased<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leased")
            .field("body", &self.body)
            .field("slot", &self.slot)
            .finish()
    }
}

impl<B: Body> Body for Leased<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.body.poll_frame(cx);
        match &frame {
            // The end, or a failure: the request is over.
            Poll::Ready(None | Some(Err(_))) => drop(this.slot.take()),
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
