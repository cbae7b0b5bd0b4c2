//! Spends and amends in memory: [`Backend::spend_all`] and
//! [`Backend::amend`] for [`MemoryBackend`].
//!
//! A spend takes the write locks of every shard its counters and their
//! lockouts live in, in one order (the counters' shards by address, then
//! the lockouts' by address), so it is one atomic step over all of them, and
//! two spends never wait on each other in a circle. A plain hit takes one
//! lock at a time, so it never takes part in a circle either. Lockouts are
//! kept in a table of their own: a lockout and a counter never meet,
//! whatever the namespace and key.
//!
//! [`Backend::spend_all`]: crate::backend::Backend::spend_all
//! [`Backend::amend`]: crate::backend::Backend::amend

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

use super::MemoryBackend;
#[cfg(test)]
use crate::backend::Spending;
use crate::backend::expiring::id::{KeyBytes, Scratch};
use crate::backend::expiring::{Entry, Shard, SlotsMut, Table};
use crate::backend::{Amend, BackendError, Counter, Hit, Hits, Spend};
use crate::key::Key;

/// Up to two counters (a quota and one `also`) without a heap allocation.
type Few<T> = SmallVec<[T; 2]>;

/// The write locks of the distinct shards `shards` names, taken in address
/// order; `at[i]` is the index in the result of `shards[i]`'s lock.
fn lock_all<'a, V>(
    table: &'a Table<V>,
    shards: &[&'a Shard<V>],
) -> (Few<SlotsMut<'a, V>>, Few<usize>) {
    let mut order: Few<&'a Shard<V>> = shards.iter().copied().collect();
    order.sort_by_key(|shard| std::ptr::from_ref(*shard) as usize);
    order.dedup_by(|a, b| std::ptr::eq(*a, *b));
    let at = shards
        .iter()
        .map(|shard| {
            order
                .iter()
                .position(|s| std::ptr::eq(*s, *shard))
                .unwrap_or_default()
        })
        .collect();
    let guards = order.iter().map(|shard| table.write(shard)).collect();
    (guards, at)
}

/// One counter as the spend found it.
struct Found {
    /// Its count and deadline, when it is live.
    live: Option<(u64, u64)>,
    /// The end of its live lockout.
    locked: Option<u64>,
}

impl MemoryBackend {
    /// [`Backend::spend_all`](crate::backend::Backend::spend_all) at time
    /// `now`.
    pub(super) fn spend_at(
        &self,
        now: u64,
        key: &Key,
        counters: &[Counter<'_>],
        spend: Spend,
    ) -> Result<Hits, BackendError> {
        let inner = &*self.inner;
        let (table, locks) = (&inner.table, &inner.locks);
        let mut scratch: Few<Scratch> = counters.iter().map(|_| Scratch::new()).collect();
        let mut lock_scratch: Few<Scratch> = counters.iter().map(|_| Scratch::new()).collect();
        let ids: Few<_> = counters
            .iter()
            .zip(scratch.iter_mut())
            .map(|(c, s)| table.id(c.namespace, KeyBytes::of(key), s))
            .collect();
        let lock_ids: Few<_> = counters
            .iter()
            .zip(lock_scratch.iter_mut())
            .map(|(c, s)| locks.id(c.namespace, KeyBytes::of(key), s))
            .collect();
        let placed: Few<_> = ids.iter().map(|id| table.locate(id)).collect();
        let lock_placed: Few<_> = lock_ids.iter().map(|id| locks.locate(id)).collect();
        let shards: Few<_> = placed.iter().map(|(_, shard)| *shard).collect();
        let lock_shards: Few<_> = lock_placed.iter().map(|(_, shard)| *shard).collect();
        // Counters first, then lockouts: the one order every spend takes.
        let (mut slots, at) = lock_all(table, &shards);
        let (mut lock_slots, lock_at) = lock_all(locks, &lock_shards);

        let found: Few<Found> = (0..counters.len())
            .map(|i| {
                let live = slots[at[i]]
                    .find(placed[i].0, &ids[i])
                    .map(|e| (e.get().value.load(Ordering::Relaxed), e.get().deadline()))
                    .filter(|&(_, deadline)| deadline > now);
                let locked = lock_slots[lock_at[i]]
                    .find(lock_placed[i].0, &lock_ids[i])
                    .map(|e| e.get().deadline())
                    .filter(|&end| end > now);
                Found { live, locked }
            })
            .collect();
        let need = spend.cost.max(1);
        let fits = |i: usize, f: &Found| {
            let count = f.live.map_or(0, |(count, _)| count);
            f.locked.is_none()
                && count
                    .checked_add(need)
                    .is_some_and(|total| total <= counters[i].quota.limit())
        };
        let all_fit = found.iter().enumerate().all(|(i, f)| fits(i, f));
        let window_ns = |i: usize| counters[i].quota.window().as_millis() * 1_000_000;

        if !all_fit {
            // Nothing is spent; a counter that does not fit may be locked.
            let mut hits = Hits::with_capacity(counters.len());
            for (i, f) in found.iter().enumerate() {
                let count = f.live.map_or(0, |(count, _)| count);
                let limit = counters[i].quota.limit();
                if fits(i, f) {
                    let reset = f.live.map_or(window_ns(i), |(_, d)| d - now);
                    hits.push(Hit {
                        count: count.saturating_add(spend.cost),
                        reset: Duration::from_nanos(reset),
                        deadline: None,
                    });
                    continue;
                }
                let mut until = f.locked;
                if until.is_none()
                    && let Some(block) = spend.block
                {
                    let end = now.saturating_add(block.as_millis() * 1_000_000);
                    let lock = &mut lock_slots[lock_at[i]];
                    // An expired lockout not yet swept makes way for the new one.
                    lock.remove(lock_placed[i].0, &lock_ids[i]);
                    if lock.has_room(now) {
                        lock.insert(lock_placed[i].0, lock_ids[i], Entry::new(end, ()));
                        until = Some(end);
                    } else {
                        tracing::warn!(
                            namespace = counters[i].namespace,
                            "memory backend: no room for a lockout; the request is denied without one"
                        );
                    }
                }
                let reset = until
                    .or(f.live.map(|(_, d)| d))
                    .map_or(window_ns(i), |end| end - now);
                hits.push(Hit {
                    count: count.saturating_add(need).max(limit.saturating_add(1)),
                    reset: Duration::from_nanos(reset),
                    deadline: None,
                });
            }
            return Ok(hits);
        }

        // Every counter fits: room first, so that nothing is changed when a
        // new counter is refused.
        let creates = |f: &Found| f.live.is_none() && (spend.cost > 0 || spend.open);
        for (i, f) in found.iter().enumerate() {
            if creates(f) {
                let slots = &mut slots[at[i]];
                let missing = slots.find(placed[i].0, &ids[i]).is_none();
                if missing && !slots.has_room(now) {
                    return Err(BackendError::AtCapacity);
                }
            }
        }
        let mut hits = Hits::with_capacity(counters.len());
        for (i, f) in found.iter().enumerate() {
            let slots = &mut slots[at[i]];
            let hit = match f.live {
                Some((count, deadline)) => {
                    let mut entry = slots
                        .find(placed[i].0, &ids[i])
                        .expect("found live under the same lock");
                    let value = entry.value_mut().get_mut();
                    *value = value.saturating_add(spend.cost);
                    Hit {
                        count: count.saturating_add(spend.cost),
                        reset: Duration::from_nanos(deadline - now),
                        deadline: NonZeroU64::new(deadline),
                    }
                }
                None if creates(f) => {
                    let deadline = self.opened(now, counters[i].quota.window());
                    match slots.find(placed[i].0, &ids[i]) {
                        Some(mut entry) => {
                            *entry.value_mut().get_mut() = spend.cost;
                            entry.set_deadline(deadline);
                        }
                        None => slots.insert(
                            placed[i].0,
                            ids[i],
                            Entry::new(deadline, AtomicU64::new(spend.cost)),
                        ),
                    }
                    Hit {
                        count: spend.cost,
                        reset: Duration::from_nanos(deadline - now),
                        deadline: NonZeroU64::new(deadline),
                    }
                }
                // A check on a key with no counter: nothing is created.
                None => Hit {
                    count: 0,
                    reset: Duration::from_nanos(window_ns(i)),
                    deadline: None,
                },
            };
            hits.push(hit);
        }
        Ok(hits)
    }

    /// [`Backend::amend`](crate::backend::Backend::amend) at time `now`.
    pub(super) fn amend_at(
        &self,
        now: u64,
        namespace: &str,
        key: &Key,
        deadline: u64,
        amend: Amend,
    ) -> bool {
        let table = &self.inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        let mut slots = table.write(shard);
        // An expired entry not yet swept has the same deadline: its window
        // closed, so it is left alone like a missing one.
        let Some(mut entry) = slots
            .find(hash, &id)
            .filter(|e| e.get().deadline() == deadline && deadline > now)
        else {
            return false;
        };
        let count = entry.value_mut().get_mut();
        match amend {
            Amend::Refund(n) => {
                let taken = n.min(*count);
                *count -= taken;
                taken > 0
            }
            Amend::Charge(n) => {
                *count = count.saturating_add(n);
                n > 0
            }
            Amend::Clear => {
                slots.remove(hash, &id);
                self.note_removed(deadline);
                true
            }
        }
    }

    /// Delete the lockout of (`namespace`, `key`), if any; `true` when a
    /// live one was there.
    pub(super) fn unlock_at(&self, now: u64, namespace: &str, key: &Key) -> bool {
        let locks = &self.inner.locks;
        if locks.len() == 0 {
            return false;
        }
        let mut scratch = Scratch::new();
        let id = locks.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = locks.locate(&id);
        locks
            .write(shard)
            .remove(hash, &id)
            .is_some_and(|entry| entry.deadline() > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Quota, Window};

    const MS: u64 = 1_000_000;

    fn quota(limit: u64, ms: u64) -> Quota {
        Quota::new(limit, Duration::from_millis(ms)).unwrap()
    }

    fn counts(hits: &Hits) -> Vec<u64> {
        hits.iter().map(|h| h.count).collect()
    }

    #[test]
    fn a_cost_counts_whole_and_a_denied_request_spends_nothing() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let two = [
            Counter {
                namespace: "a",
                quota: quota(10, 1000),
            },
            Counter {
                namespace: "b",
                quota: quota(5, 1000),
            },
        ];
        let spend = |t, cost| store.spend_at(t, &key, &two, Spend::cost(cost)).unwrap();
        assert_eq!(counts(&spend(0, 4)), [4, 4]);
        assert!(
            spend(0, 4).iter().all(|h| h.deadline.is_none()),
            "b does not fit 4 more"
        );
        // Neither counter moved: a fits 2 more, b fits 1 more.
        assert_eq!(store.peek_at(1, "a", &key).unwrap().count, 4);
        assert_eq!(store.peek_at(1, "b", &key).unwrap().count, 4);
        assert_eq!(counts(&spend(1, 1)), [5, 5]);
        // A check (cost 0) on a full counter is denied.
        let check = spend(2, 0);
        assert!(check[1].count > 5 && check[1].deadline.is_none());
        // A cost above the limit never fits, even on no counter.
        let other = Key::new("other");
        let big = store
            .spend_at(0, &other, &two[..1], Spend::cost(11))
            .unwrap();
        assert!(big[0].count > 10 && big[0].deadline.is_none());
        assert!(store.peek_at(1, "a", &other).is_none());
    }

    #[test]
    fn a_check_creates_nothing_unless_it_opens_the_window() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let one = [Counter {
            namespace: "a",
            quota: quota(3, 1000),
        }];
        let hit = store.spend_at(0, &key, &one, Spend::cost(0)).unwrap()[0];
        assert_eq!((hit.count, hit.deadline), (0, None));
        assert!(store.peek_at(0, "a", &key).is_none());
        let hit = store
            .spend_at(0, &key, &one, Spend::cost(0).open())
            .unwrap()[0];
        assert_eq!(hit.count, 0);
        assert_eq!(hit.reset, Duration::from_secs(1));
        let d = hit.deadline.unwrap();
        // A charge lands in the opened window and may pass the limit.
        assert!(store.amend_at(MS, "a", &key, d.get(), Amend::Charge(5)));
        assert_eq!(store.peek_at(MS, "a", &key).unwrap().count, 5);
        let denied = store.spend_at(2 * MS, &key, &one, Spend::cost(0)).unwrap()[0];
        assert!(denied.count > 3 && denied.deadline.is_none());
        // The window keeps its deadline: after it, a fresh start.
        let later = store
            .spend_at(1000 * MS, &key, &one, Spend::cost(1))
            .unwrap()[0];
        assert_eq!(later.count, 1);
    }

    #[test]
    fn a_lockout_is_pinned_to_the_first_denial() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let one = [Counter {
            namespace: "login",
            quota: quota(2, 1000),
        }];
        let block = Window::new(Duration::from_secs(10)).unwrap();
        let spend = |t| {
            store
                .spend_at(t, &key, &one, Spend::cost(1).block(block))
                .unwrap()[0]
        };
        assert_eq!(spend(0).count, 1);
        assert_eq!(spend(0).count, 2);
        let first = spend(100 * MS);
        assert!(first.count > 2);
        assert_eq!(first.reset, Duration::from_secs(10));
        // More attempts, after the window closed too, do not move its end.
        let again = spend(5000 * MS);
        assert!(again.count > 2);
        assert_eq!(again.reset, Duration::from_millis(5100));
        // After the lockout, the key starts over.
        assert_eq!(spend(10_100 * MS).count, 1);
        // A reset clears a lockout.
        spend(10_100 * MS);
        assert!(spend(10_200 * MS).count > 2);
        assert!(store.remove_at(10_300 * MS, "login", &key));
        assert_eq!(spend(10_300 * MS).count, 1);
    }

    #[test]
    fn amends_touch_only_their_own_window() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let one = [Counter {
            namespace: "a",
            quota: quota(10, 1000),
        }];
        let first = store.spend_at(0, &key, &one, Spend::cost(3)).unwrap()[0];
        let d = first.deadline.unwrap().get();
        assert!(store.amend_at(0, "a", &key, d, Amend::Refund(5)));
        assert_eq!(store.peek_at(0, "a", &key).unwrap().count, 0);
        assert!(
            !store.amend_at(0, "a", &key, d, Amend::Refund(1)),
            "never below zero"
        );
        // A reset, and a new window opened at the same instant.
        assert!(store.remove_at(0, "a", &key));
        let second = store.spend_at(0, &key, &one, Spend::cost(2)).unwrap()[0];
        assert_ne!(second.deadline.unwrap().get(), d);
        for amend in [Amend::Refund(1), Amend::Charge(1), Amend::Clear] {
            assert!(!store.amend_at(0, "a", &key, d, amend));
        }
        assert_eq!(store.peek_at(0, "a", &key).unwrap().count, 2);
        let d2 = second.deadline.unwrap().get();
        assert!(store.amend_at(0, "a", &key, d2, Amend::Clear));
        assert!(store.peek_at(0, "a", &key).is_none());
        // Nothing is created by an amend.
        assert!(!store.amend_at(0, "a", &key, d2, Amend::Charge(4)));
        assert!(store.peek_at(0, "a", &key).is_none());
    }

    #[test]
    fn concurrent_spends_never_add_up_past_the_limit() {
        let store = MemoryBackend::new();
        let one = [Counter {
            namespace: "a",
            quota: quota(1000, 60_000),
        }];
        let admitted: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let key = Key::new("hot");
                        (0..500u64)
                            .map(|i| {
                                let cost = (t * 7 + i) % 9;
                                let hit = store.spend_all(&key, &one, Spend::cost(cost));
                                let hit = futures_ready(hit)[0];
                                if hit.count <= 1000 { cost } else { 0 }
                            })
                            .sum::<u64>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        let stored = futures_ready_peek(&store);
        assert!(admitted <= 1000);
        assert_eq!(admitted, stored);
    }

    fn futures_ready(f: std::future::Ready<Result<Hits, BackendError>>) -> Hits {
        f.into_inner().unwrap()
    }

    fn futures_ready_peek(store: &MemoryBackend) -> u64 {
        store
            .peek_at(store.now(), "a", &Key::new("hot"))
            .unwrap()
            .count
    }
}
