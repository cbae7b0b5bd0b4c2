//! Slots on leases, in this process: the in-memory backend's
//! [`Leasing`](crate::backend::Leasing).
//!
//! Each key's slots are a short list (at most the cap's `max` live ones)
//! behind its shard's mutex, so a take, a give-back and an extend are each
//! one step under one lock, one hash of the pair: exact in this process.
//! Expired slots are dropped by the key's next take; a sweep, every 1,024
//! takes on a shard, drops them and the keys left without slots, so the map
//! holds the keys with slots (at most the requests in flight, plus the
//! expired slots of holders that stopped extending) and the keys emptied
//! since the shard's last sweep.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;

use crate::backend::{Cap, Held, SlotId, Taken};
use crate::key::Key;
use crate::quota::Window;

use super::clock::nanos;

/// A key's slots: each slot and its lease's end (nanoseconds on the
/// backend's clock). Four inline: a cap of four or fewer allocates nothing
/// once the key's entry exists.
type Leases = SmallVec<[(SlotId, u64); 4]>;

/// The shards of the slot map.
const SHARDS: usize = 16;

/// Takes on one shard between two sweeps of its expired slots.
const SWEEP_EVERY: u32 = 1024;

#[derive(Debug)]
pub(super) struct Slots {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
}

/// One (namespace, key) pair's slots. An entry whose last slot went back
/// stays until its shard's next sweep, so a key taken and given back again
/// and again finds its entry in place (no insert, no allocation).
#[derive(Debug)]
struct Entry {
    /// One of its shard's `names`: a new key of a known namespace
    /// allocates nothing for it.
    namespace: Arc<str>,
    key: Key,
    leases: Leases,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashTable<Entry>,
    takes: u32,
    /// The namespaces its entries name, each once (a layer's name: a
    /// handful).
    names: Vec<Arc<str>>,
}

impl Shard {
    fn find(&mut self, hash: u64, namespace: &str, key: &Key) -> Option<&mut Entry> {
        self.entries
            .find_mut(hash, |e| e.key == *key && &*e.namespace == namespace)
    }

    /// Drop every expired slot, and the entries left empty.
    fn sweep(&mut self, now: u64) {
        self.entries.retain(|entry| {
            entry.leases.retain(|(_, end)| *end > now);
            !entry.leases.is_empty()
        });
        // A name no entry holds any more goes too.
        self.names.retain(|name| Arc::strong_count(name) > 1);
    }

    /// `namespace`, as one of `names` (added when new).
    fn name(names: &mut Vec<Arc<str>>, namespace: &str) -> Arc<str> {
        if let Some(name) = names.iter().find(|name| ***name == *namespace) {
            return Arc::clone(name);
        }
        let name: Arc<str> = namespace.into();
        names.push(Arc::clone(&name));
        name
    }
}

impl Slots {
    pub(super) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: DefaultHashBuilder::default(),
        }
    }

    /// The pair's hash (one per step) and its shard, locked. A panic while
    /// the lock was held left no half-done step (each step writes last):
    /// the map is still whole.
    fn shard(&self, namespace: &str, key: &Key) -> (u64, std::sync::MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one((namespace, key));
        let shard = self.shards[(hash >> 60) as usize % SHARDS]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (hash, shard)
    }

    pub(super) fn take(&self, now: u64, key: &Key, cap: Cap<'_>, slot: SlotId) -> Taken {
        let taken: Result<_, std::convert::Infallible> =
            self.take_with(now, key, cap, slot, |_| Ok(((), true)));
        match taken {
            Ok((taken, ())) => taken.expect("a take without counters always answers"),
            Err(never) => match never {},
        }
    }

    /// [`take`](Self::take), with the counters of a `take_all` counted by
    /// `count` while the key's shard is locked: `count` is told whether the
    /// cap has room (`true`: count; `false`: read only) and answers what it
    /// counted and whether the counters admit the request; the slot is
    /// taken only when they do. Answers the cap's answer (`None` when the
    /// counters refused) and what `count` gave.
    pub(super) fn take_with<T, E>(
        &self,
        now: u64,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        count: impl FnOnce(bool) -> Result<(T, bool), E>,
    ) -> Result<(Option<Taken>, T), E> {
        let lease_end = now.saturating_add(nanos(cap.in_flight.lease().as_duration()));
        let max = cap.in_flight.max();
        let (hash, mut shard) = self.shard(cap.namespace, key);
        shard.takes += 1;
        if shard.takes >= SWEEP_EVERY {
            shard.takes = 0;
            shard.sweep(now);
        }
        let hasher = &self.hasher;
        let shard = &mut *shard;
        let entry = match shard
            .entries
            .find_entry(hash, |e| e.key == *key && &*e.namespace == cap.namespace)
        {
            Ok(found) => found.into_mut(),
            Err(absent) => absent
                .into_table()
                .insert_unique(
                    hash,
                    Entry {
                        namespace: Shard::name(&mut shard.names, cap.namespace),
                        key: key.clone(),
                        leases: Leases::new(),
                    },
                    |e| hasher.hash_one((&*e.namespace, &e.key)),
                )
                .into_mut(),
        };
        let leases = &mut entry.leases;
        // One pass: the leases that ran out go, and the slot is looked for.
        let mut held = false;
        let mut at = 0;
        while at < leases.len() {
            let (id, end) = leases[at];
            if end <= now {
                leases.swap_remove(at);
                continue;
            }
            held |= id == slot;
            at += 1;
        }
        let in_use = leases.len() as u64;
        let granted = |in_use| Taken {
            granted: true,
            in_use,
            retry: Duration::ZERO,
        };
        if held {
            // A step retried: the counters are read, not counted again.
            return Ok((Some(granted(in_use)), count(false)?.0));
        }
        if in_use < max {
            let (counted, admitted) = count(true)?;
            if !admitted {
                return Ok((None, counted));
            }
            leases.push((slot, lease_end));
            return Ok((Some(granted(in_use + 1)), counted));
        }
        let earliest = leases.iter().map(|(_, end)| *end).min().unwrap_or(now);
        let refused = Taken {
            granted: false,
            in_use,
            retry: Duration::from_nanos(earliest.saturating_sub(now)),
        };
        Ok((Some(refused), count(false)?.0))
    }

    pub(super) fn give_back(&self, namespace: &str, key: &Key, slot: SlotId) -> bool {
        let (hash, mut shard) = self.shard(namespace, key);
        let Some(entry) = shard.find(hash, namespace, key) else {
            return false;
        };
        match entry.leases.iter().position(|(held, _)| *held == slot) {
            Some(at) => {
                entry.leases.swap_remove(at);
                true
            }
            None => false,
        }
    }

    pub(super) fn extend(&self, now: u64, held: &[Held<'_>], lease: Window) -> u64 {
        let lease_end = now.saturating_add(nanos(lease.as_duration()));
        let mut extended = 0;
        for h in held {
            let (hash, mut shard) = self.shard(h.namespace, h.key);
            let Some(entry) = shard.find(hash, h.namespace, h.key) else {
                continue;
            };
            // A lease that ran out is gone, whoever asks: never extended.
            if let Some((_, end)) = entry
                .leases
                .iter_mut()
                .find(|(slot, end)| *slot == h.slot && *end > now)
            {
                *end = (*end).max(lease_end);
                extended += 1;
            }
        }
        extended
    }

    pub(super) fn in_use(&self, now: u64, namespace: &str, key: &Key) -> u64 {
        let (hash, mut shard) = self.shard(namespace, key);
        shard.find(hash, namespace, key).map_or(0, |entry| {
            entry.leases.iter().filter(|(_, end)| *end > now).count() as u64
        })
    }

    /// Keys holding slots now, live or expired-but-unswept.
    #[cfg(test)]
    pub(super) fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let shard = shard
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                shard
                    .entries
                    .iter()
                    .filter(|entry| !entry.leases.is_empty())
                    .count()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::InFlight;

    fn cap(max: u64, lease_ms: u64) -> Cap<'static> {
        Cap {
            namespace: "n",
            in_flight: InFlight::new(max, Duration::from_millis(lease_ms)).unwrap(),
        }
    }

    #[test]
    fn a_key_without_slots_is_dropped_and_a_sweep_drops_what_ran_out() {
        let slots = Slots::new();
        let (a, b) = (Key::new("a"), Key::new("b"));
        let slot = SlotId::next();
        assert!(slots.take(0, &a, cap(1, 10), slot).granted);
        assert_eq!(slots.keys(), 1);
        assert!(slots.give_back("n", &a, slot));
        assert_eq!(slots.keys(), 0, "an emptied key is removed");
        // A holder that never gives back: its slot runs out, and its
        // shard's next sweep drops it, whichever key of the shard is taken
        // then (here every shard gets its sweep's worth of takes).
        assert!(slots.take(0, &b, cap(1, 10), SlotId::next()).granted);
        let later = 1_000_000_000;
        for n in 0..4 * SHARDS * SWEEP_EVERY as usize {
            let (key, slot) = (Key::new(format!("k{n}")), SlotId::next());
            assert!(slots.take(later, &key, cap(1, 10), slot).granted);
            assert!(slots.give_back("n", &key, slot));
        }
        assert_eq!(slots.keys(), 0, "the sweep dropped the slot that ran out");
    }
}
