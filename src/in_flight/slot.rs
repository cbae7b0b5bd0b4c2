//! The slots of one layer: its shared state (the backend, the cap, the
//! slots this instance holds and the task that extends their leases),
//! which takes, extends and gives back slots. The guard that gives a slot
//! back and the body that holds it are below, in `cost/leased.rs`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::backend::{BackendError, Cap, Held, InFlight, Leasing, SlotId, Taken};
use crate::budget::failure::{Failure, Outage};
use crate::budget::log::LogGate;
pub(crate) use crate::cost::leased::{Leased, Release, SlotGuard};
use crate::key::Key;

/// What every service of one layer shares.
pub(crate) struct Shared<Bk> {
    pub(crate) name: Arc<str>,
    pub(crate) in_flight: InFlight,
    pub(crate) backend: Bk,
    pub(crate) failure: Failure,
    pub(crate) timeout: Duration,
    /// How long a request may wait for a slot; zero: refused at once.
    pub(crate) wait: Duration,
    /// The header fields this layer writes, made once.
    pub(crate) fields: crate::response::InFlightFields,
    pub(crate) gate: LogGate,
    pub(crate) key_gate: LogGate,
    /// What a call gets when the store fails under fail-closed, in the
    /// middleware's words (for the log).
    pub(crate) fails: &'static str,
    /// The slots this instance holds in the store, to extend.
    held: Mutex<HashMap<SlotId, Key>>,
    /// Whether the task that extends them runs.
    renewing: std::sync::atomic::AtomicBool,
}

impl<Bk> Shared<Bk> {
    pub(crate) fn new(
        name: Arc<str>,
        in_flight: InFlight,
        backend: Bk,
        failure: Failure,
        timeout: Duration,
        wait: Duration,
    ) -> Self {
        Self {
            fields: crate::response::InFlightFields::new(&name, in_flight.max()),
            name,
            in_flight,
            backend,
            failure,
            timeout,
            wait,
            gate: LogGate::default(),
            key_gate: LogGate::default(),
            fails: "answering 503",
            held: Mutex::default(),
            renewing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn cap(&self) -> Cap<'_> {
        Cap {
            namespace: &self.name,
            in_flight: self.in_flight,
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<SlotId, Key>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many slots this instance holds in the store now.
    pub(crate) fn held_count(&self) -> usize {
        self.held().len()
    }
}

impl<Bk: fmt::Debug> fmt::Debug for Shared<Bk> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("name", &self.name)
            .field("in_flight", &self.in_flight)
            .field("backend", &self.backend)
            .field("failure", &self.failure.policy())
            .field("timeout", &self.timeout)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl<Bk: Leasing> Shared<Bk> {
    /// Hold `slot` of `key`, taken in the store: it is extended every third
    /// of its lease until it is given back. The first slot starts the task
    /// that extends them (on the tokio runtime of the request), which ends
    /// when the layer is gone.
    pub(crate) fn hold_slot(self: &Arc<Self>, key: &Key, slot: SlotId) {
        self.held().insert(slot, key.clone());
        if !self
            .renewing
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(renew(Arc::downgrade(self)));
                }
                Err(_) => {
                    // No runtime: the slots live out their lease.
                    self.renewing
                        .store(false, std::sync::atomic::Ordering::Release);
                }
            }
        }
    }
}

/// Which slot a call got, or what it gets instead.
#[derive(Debug)]
pub(crate) enum Admission {
    /// A slot: in the store, or in the insurance limiter's memory; `left`
    /// after it.
    Slot { local: bool, left: u64 },
    /// No slot: passed on uncounted (fail open).
    Uncounted,
    /// Refused: the cap is full.
    Answered(Taken),
    /// The store failed, and the failure policy fails the call (or the
    /// record is corrupt).
    Failed(BackendError),
}

/// When a refused call asks again: as the earliest lease runs out, and at
/// least every 50 ms (a slot given back frees sooner).
pub(crate) fn next_ask(retry: Duration) -> Duration {
    retry.clamp(Duration::from_millis(1), Duration::from_millis(50))
}

impl<Bk: Leasing> Shared<Bk> {
    /// One ask for `slot` of `key`, within the timeout: held (and extended)
    /// when the store grants it; when the store fails, the failure policy's
    /// answer.
    pub(crate) async fn take_once(self: &Arc<Self>, key: &Key, slot: SlotId) -> Admission {
        // Until the store's answer is read, the slot may have been taken
        // for a call that will never know it (a timeout, a call cancelled
        // while it asks, an answer lost with its connection): then it is
        // given back by its name, which frees nothing else.
        let mut unsure = Unsure {
            shared: self,
            key,
            slot,
            armed: true,
        };
        let take = self.backend.take(key, self.cap(), slot);
        let taken = match tokio::time::timeout(self.timeout, take).await {
            Ok(Ok(taken)) => taken,
            Ok(Err(err)) => {
                // A corrupt record is left as it is.
                unsure.armed = !err.is_corrupt();
                return self.outage(key, slot, err);
            }
            Err(_) => return self.outage(key, slot, BackendError::TimedOut),
        };
        unsure.armed = false;
        if !taken.granted {
            return Admission::Answered(taken);
        }
        self.hold_slot(key, slot);
        Admission::Slot {
            local: false,
            left: self.in_flight.max().saturating_sub(taken.in_use),
        }
    }

    /// The failure policy's answer for a take the store could not make.
    fn outage(&self, key: &Key, slot: SlotId, err: BackendError) -> Admission {
        if err.is_corrupt() {
            return Admission::Failed(err);
        }
        let decided = self
            .failure
            .decide(&self.name, &self.gate, err, self.fails, |insurance| {
                insurance.take(key, self.cap(), slot)
            });
        match decided {
            Outage::Insured(taken) if taken.granted => Admission::Slot {
                local: true,
                left: self
                    .failure
                    .insurance()
                    .map_or(0, |i| i.share().of(self.in_flight.max()))
                    .saturating_sub(taken.in_use),
            },
            Outage::Insured(taken) => Admission::Answered(taken),
            Outage::Open => Admission::Uncounted,
            Outage::Closed(err) => Admission::Failed(err),
        }
    }
}

/// A take whose answer is not known yet: dropped armed, it gives the slot
/// back by its name (a give-back of a slot never taken finds nothing).
struct Unsure<'a, Bk: Leasing> {
    shared: &'a Shared<Bk>,
    key: &'a Key,
    slot: SlotId,
    armed: bool,
}

impl<Bk: Leasing> Drop for Unsure<'_, Bk> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.release(self.key, self.slot, false);
        }
    }
}

/// A layer's slots, without its backend's type: what the outbound layer
/// holds, whose service does not name [`Leasing`].
pub(crate) trait Slots: Release {
    /// [`Shared::take_once`], boxed.
    fn take_boxed(
        self: Arc<Self>,
        key: Key,
        slot: SlotId,
    ) -> Pin<Box<dyn Future<Output = Admission> + Send>>;

    /// The guard of a slot [`take_boxed`](Self::take_boxed) gave.
    fn guard(self: Arc<Self>, key: Key, slot: SlotId, local: bool) -> SlotGuard;
}

impl<Bk: Leasing> Slots for Shared<Bk> {
    fn take_boxed(
        self: Arc<Self>,
        key: Key,
        slot: SlotId,
    ) -> Pin<Box<dyn Future<Output = Admission> + Send>> {
        Box::pin(async move { self.take_once(&key, slot).await })
    }

    fn guard(self: Arc<Self>, key: Key, slot: SlotId, local: bool) -> SlotGuard {
        SlotGuard::new(self, key, slot, local)
    }
}

/// Extends every slot this instance holds, once every third of the lease,
/// in one store call, until the layer is dropped.
async fn renew<Bk: Leasing>(shared: Weak<Shared<Bk>>) {
    let every = match shared.upgrade() {
        Some(shared) => shared.in_flight.lease().as_duration() / 3,
        None => return,
    };
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let held: Vec<(Key, SlotId)> = shared
            .held()
            .iter()
            .map(|(slot, key)| (key.clone(), *slot))
            .collect();
        if held.is_empty() {
            continue;
        }
        let list: Vec<Held<'_>> = held
            .iter()
            .map(|(key, slot)| Held {
                namespace: &shared.name,
                key,
                slot: *slot,
            })
            .collect();
        let call = shared.backend.extend(&list, shared.in_flight.lease());
        drop(list);
        match tokio::time::timeout(shared.timeout.max(every / 2), call).await {
            Ok(Ok(extended)) if extended as usize >= held.len() => {}
            Ok(Ok(extended)) => {
                // Given back while the call was on its way, or lost: a
                // holder stalled past its lease, or a store that lost them.
                tracing::debug!(limiter = %shared.name, held = held.len(), extended, "some slots in flight were not extended (given back meanwhile, or their lease ran out)");
            }
            Ok(Err(err)) => {
                if shared.gate.admit().is_some() {
                    tracing::warn!(limiter = %shared.name, error = %err, held = held.len(), "could not extend the leases of the slots in flight: they run out unless the next extend reaches the store");
                }
            }
            Err(_) => {
                if shared.gate.admit().is_some() {
                    tracing::warn!(limiter = %shared.name, held = held.len(), "extending the leases of the slots in flight timed out");
                }
            }
        }
    }
}

impl<Bk: Leasing> Release for Shared<Bk> {
    fn hold(self: Arc<Self>, key: &Key, slot: SlotId) {
        self.hold_slot(key, slot);
    }

    fn release(&self, key: &Key, slot: SlotId, local: bool) {
        if local {
            // Taken from the insurance limiter while the store was out.
            if let Some(insurance) = self.failure.insurance() {
                insurance.give_back(&self.name, key, slot);
            }
            return;
        }
        self.held().remove(&slot);
        // A give-back that fails is left to the lease, never retried: the
        // slot may be another request's by then.
        self.backend.release(&self.name, key, slot);
    }
}
