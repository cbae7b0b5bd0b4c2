//! Spends and amends in memory: [`Backend::spend_all`] and
//! [`Backend::amend`] for [`MemoryBackend`].
//!
//! A spend takes the write locks of every shard its counters and their
//! lockouts live in, in one order (the counters' shards by address, then
//! the lockouts' by address), so it is one atomic step over all of them, and
//! two spends never wait on each other in a circle. A spend of one counter
//! that only adds to a live counter (or is denied without creating a
//! lockout) takes its shard's read lock instead, as a hit does, and the
//! lockout shard's after it, in the same order. A plain hit takes one lock
//! at a time, so it never takes part in a circle either. Lockouts are kept
//! in a table of their own: a lockout and a counter never meet, whatever the
//! namespace and key. A lockout is named by its counter's id and hash, and
//! lives in the shard of the same index as its counter (the lockout table is
//! the counter table's sibling), so a spend hashes its key once.
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
use crate::backend::{Amend, BackendError, Counter, Hit, Hits, Spend, refused_count};
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
    /// [`Backend::spend_all`](crate::backend::Backend::spend_all) of one
    /// counter at time `now`: what [`spend_at`](Self::spend_at) answers for
    /// it, in the way a hit is taken. On a live counter, the spend takes the
    /// shard's read lock, and adds its cost in one atomic step that checks
    /// the limit, so spends (and hits) on a shard, and on one key, don't
    /// wait for each other; the lockout table is looked into only when the
    /// lockout's shard holds any. Everything else (a counter to create or
    /// whose window closed, a lockout to create) is left to `spend_at`,
    /// under the write locks.
    ///
    /// Under the counter's shard's read lock, its lockout cannot appear: a
    /// lockout is only ever added under the write lock of its counter's
    /// shard, and published (the lockout shard's count) before that lock is
    /// let go. So a lockout shard that holds nothing holds no lockout of
    /// this counter, and one that is there stays for the whole step (a
    /// reset may take it away meanwhile: the reset came after).
    #[inline(never)]
    pub(super) fn spend_one(
        &self,
        now: u64,
        key: &Key,
        counter: &Counter<'_>,
        spend: Spend,
    ) -> Result<Hit, BackendError> {
        let inner = &*self.inner;
        let table = &inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(counter.namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        let limit = counter.quota.limit();
        // The one counter is the first: `Spend::first` names its cost.
        let cost = spend.cost_of(0);
        let need = cost.max(1);
        let fits = |count: u64| count.checked_add(need).is_some_and(|total| total <= limit);
        let denied = |count: u64, locked: bool, until: u64| Hit {
            count: refused_count(count, limit, locked, need),
            reset: Duration::from_nanos(until - now),
            deadline: None,
        };
        {
            let slots = shard.read();
            if let Some(entry) = slots.find(hash, &id).filter(|e| e.deadline() > now) {
                let deadline = entry.deadline();
                let lock_shard = inner.locks.shard_of(hash);
                let locked = if lock_shard.held() == 0 {
                    None
                } else {
                    lock_shard
                        .read()
                        .find(hash, &id)
                        .map(Entry::deadline)
                        .filter(|&end| end > now)
                };
                if let Some(end) = locked {
                    // Locked: it does not fit, and its lockout is never
                    // extended.
                    return Ok(denied(entry.value.load(Ordering::Relaxed), true, end));
                }
                let taken = if cost == 0 {
                    // A check: nothing to add.
                    let count = entry.value.load(Ordering::Relaxed);
                    if fits(count) { Ok(count) } else { Err(count) }
                } else {
                    entry
                        .value
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |count| {
                            fits(count).then(|| count + cost)
                        })
                };
                match taken {
                    Ok(count) => {
                        return Ok(Hit {
                            count: count + cost,
                            reset: Duration::from_nanos(deadline - now),
                            deadline: NonZeroU64::new(deadline),
                        });
                    }
                    // Denied with no lockout to create: nothing changes.
                    Err(count) if spend.block.is_none() => {
                        return Ok(denied(count, false, deadline));
                    }
                    // Denied, and a lockout to create: under the write locks.
                    Err(_) => {}
                }
            }
        }
        self.spend_rest(now, key, counter, spend)
    }

    /// [`spend_one`](Self::spend_one)'s spends that change more than a
    /// count: the general spend, of one counter. Kept out of `spend_one`,
    /// so that its spend on a live counter compiles small.
    #[cold]
    #[inline(never)]
    fn spend_rest(
        &self,
        now: u64,
        key: &Key,
        counter: &Counter<'_>,
        spend: Spend,
    ) -> Result<Hit, BackendError> {
        let hits = self.spend_at(now, key, std::slice::from_ref(counter), spend)?;
        Ok(hits[0])
    }

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
        let ids: Few<_> = counters
            .iter()
            .zip(scratch.iter_mut())
            .map(|(c, s)| table.id(c.namespace, KeyBytes::of(key), s))
            .collect();
        let placed: Few<_> = ids.iter().map(|id| table.locate(id)).collect();
        // A lockout is named by its counter's id and hash (`locks` is
        // `table`'s sibling).
        let lock_ids = &ids;
        let lock_placed: Few<_> = placed
            .iter()
            .map(|&(hash, _)| (hash, locks.shard_of(hash)))
            .collect();
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
        // Each counter's own cost (`Spend::first` for the first), and
        // what it needs to fit.
        let cost = |i: usize| spend.cost_of(i);
        let need = |i: usize| cost(i).max(1);
        let fits = |i: usize, f: &Found| {
            let count = f.live.map_or(0, |(count, _)| count);
            f.locked.is_none()
                && count
                    .checked_add(need(i))
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
                        count: count.saturating_add(cost(i)),
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
                    count: refused_count(count, limit, until.is_some(), need(i)),
                    reset: Duration::from_nanos(reset),
                    deadline: None,
                });
            }
            return Ok(hits);
        }

        // Every counter fits: room first, so that nothing is changed when a
        // new counter is refused.
        let creates = |i: usize, f: &Found| f.live.is_none() && (cost(i) > 0 || spend.open);
        for (i, f) in found.iter().enumerate() {
            if creates(i, f) {
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
                    *value = value.saturating_add(cost(i));
                    Hit {
                        count: count.saturating_add(cost(i)),
                        reset: Duration::from_nanos(deadline - now),
                        deadline: NonZeroU64::new(deadline),
                    }
                }
                None if creates(i, f) => {
                    let deadline = self.opened(now, counters[i].quota.window());
                    match slots.find(placed[i].0, &ids[i]) {
                        Some(mut entry) => {
                            *entry.value_mut().get_mut() = cost(i);
                            entry.set_deadline(deadline);
                        }
                        None => slots.insert(
                            placed[i].0,
                            ids[i],
                            Entry::new(deadline, AtomicU64::new(cost(i))),
                        ),
                    }
                    Hit {
                        count: cost(i),
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
        let (table, locks) = (&self.inner.table, &self.inner.locks);
        if locks.len() == 0 {
            return false;
        }
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, _) = table.locate(&id);
        let shard = locks.shard_of(hash);
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
    use proptest::prelude::*;

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
                lowers: false,
            },
            Counter {
                namespace: "b",
                quota: quota(5, 1000),
                lowers: false,
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
    fn a_first_unit_spends_the_first_counter_its_own_amount() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        // A provider's budgets: 3 requests and 100 tokens.
        let both = [
            Counter {
                namespace: "requests",
                quota: quota(3, 1000),
                lowers: false,
            },
            Counter {
                namespace: "tokens",
                quota: quota(100, 1000),
                lowers: false,
            },
        ];
        let call = |t, tokens| {
            store
                .spend_at(t, &key, &both, Spend::cost(tokens).first(1))
                .unwrap()
        };
        let peeked = |name| store.peek_at(MS, name, &key).map(|h| h.count);
        // Both fit: each counted with its own amount, in its own window.
        let hits = call(0, 60);
        assert_eq!(counts(&hits), [1, 60]);
        assert!(hits.iter().all(|h| h.deadline.is_some()));
        let tokens_window = hits[1].deadline.unwrap().get();
        // The tokens do not fit: nothing on either; the tokens counter
        // reports what stands plus its cost, the requests counter is not
        // counted.
        let hits = call(0, 50);
        assert!(hits.iter().all(|h| h.deadline.is_none()));
        assert_eq!(hits[1].count, 60 + 50);
        assert_eq!((peeked("requests"), peeked("tokens")), (Some(1), Some(60)));
        assert_eq!(counts(&call(0, 40)), [2, 100]);
        let check = call(0, 0);
        assert_eq!(check[1].count, 100 + 1, "a check of the tokens at 100");
        assert_eq!(peeked("requests"), Some(2), "the requests counter stays");
        // The requests do not fit: nothing on either, though the tokens
        // would (30 of them given back first).
        assert!(store.amend_at(MS, "tokens", &key, tokens_window, Amend::Refund(30)));
        assert_eq!(counts(&call(MS, 10)), [3, 80]);
        let hits = call(MS, 10);
        assert!(hits.iter().all(|h| h.deadline.is_none()));
        assert_eq!(hits[0].count, 3 + 1, "the requests counter: 3 and its unit");
        assert_eq!((peeked("requests"), peeked("tokens")), (Some(3), Some(80)));

        // `first(0)` with a cost of 5: a check on the first counter.
        let other = Key::new("other");
        let check = |t| {
            store
                .spend_at(t, &other, &both, Spend::cost(5).first(0))
                .unwrap()
        };
        let hits = check(0);
        assert_eq!(counts(&hits), [0, 5]);
        assert_eq!(hits[0].deadline, None, "a check creates no counter");
        assert!(store.peek_at(0, "requests", &other).is_none());
        let opened = store
            .spend_at(0, &other, &both, Spend::cost(5).first(0).open())
            .unwrap();
        assert_eq!(counts(&opened), [0, 10]);
        assert!(opened[0].deadline.is_some(), "open creates it at 0");
        // A full first counter refuses the check, and the cost is not spent.
        let requests_window = opened[0].deadline.unwrap().get();
        assert!(store.amend_at(0, "requests", &other, requests_window, Amend::Charge(3)));
        let hits = check(MS);
        assert_eq!(hits[0].count, 3 + 1, "a check reports the count and 1");
        assert_eq!(store.peek_at(MS, "tokens", &other).unwrap().count, 10);

        // One counter: the first, spent its unit, on the fast path as on
        // the general one.
        let one = [both[0]];
        let lone = Key::new("lone");
        let general = store
            .spend_at(0, &lone, &one, Spend::cost(9).first(1))
            .unwrap();
        assert_eq!(general[0].count, 1);
        // On a live counter, under the read lock.
        let fast = store
            .spend_one(0, &lone, &one[0], Spend::cost(9).first(2))
            .unwrap();
        assert_eq!(fast.count, 3);
        let fast = store
            .spend_one(0, &lone, &one[0], Spend::cost(0).first(1))
            .unwrap();
        assert_eq!((fast.count, fast.deadline), (4, None), "denied by its unit");
    }

    #[test]
    fn a_check_creates_nothing_unless_it_opens_the_window() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let one = [Counter {
            namespace: "a",
            quota: quota(3, 1000),
            lowers: false,
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
            lowers: false,
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
            lowers: false,
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
            lowers: false,
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

    #[test]
    fn one_counter_and_several_see_the_same_lockouts() {
        let store = MemoryBackend::new().shards(1);
        let key = Key::new("k");
        let (a, b) = (
            Counter {
                namespace: "a",
                quota: quota(10, 1000),
                lowers: false,
            },
            Counter {
                namespace: "b",
                quota: quota(1, 1000),
                lowers: false,
            },
        );
        let block = Window::new(Duration::from_secs(5)).unwrap();
        assert_eq!(
            counts(&store.spend_at(0, &key, &[a, b], Spend::cost(1)).unwrap()),
            [1, 1]
        );
        // The general spend locks `b` out; the one-counter spend sees it.
        let denied = store
            .spend_at(MS, &key, &[a, b], Spend::cost(1).block(block))
            .unwrap();
        assert_eq!(denied[1].reset, Duration::from_secs(5));
        let one = store.spend_one(2 * MS, &key, &b, Spend::cost(0)).unwrap();
        assert_eq!((one.count, one.deadline), (2, None));
        assert_eq!(one.reset, Duration::from_nanos(5000 * MS - MS));
        assert_eq!(
            store
                .spend_one(2 * MS, &key, &a, Spend::cost(1))
                .unwrap()
                .count,
            2
        );
        // After b's window closes it would fit, but its lockout holds.
        let one = store
            .spend_one(1500 * MS, &key, &b, Spend::cost(1))
            .unwrap();
        assert!(one.count > 1 && one.deadline.is_none());
        assert_eq!(one.reset, Duration::from_nanos(3501 * MS));
        // The one-counter spend locks `a` out; the general spend sees it.
        let c = Counter {
            namespace: "a",
            quota: quota(2, 1000),
            lowers: false,
        };
        let locked = store
            .spend_one(3 * MS, &key, &c, Spend::cost(1).block(block))
            .unwrap();
        assert_eq!(
            (locked.deadline, locked.reset),
            (None, Duration::from_secs(5))
        );
        let both = store
            .spend_at(4 * MS, &key, &[c, b], Spend::cost(0))
            .unwrap();
        assert_eq!(both[0].reset, Duration::from_nanos(5000 * MS - MS));
        // A reset takes the lockout away for both.
        assert!(store.remove_at(5 * MS, "a", &key));
        assert_eq!(
            store
                .spend_one(5 * MS, &key, &c, Spend::cost(1))
                .unwrap()
                .count,
            1
        );
        assert!(!store.remove_at(6 * MS, "a", &Key::new("never")));
    }

    #[test]
    fn one_counter_and_general_spends_at_once_keep_to_the_limit() {
        // One-counter spends (read lock, atomic add) and two-counter spends
        // (write locks) on one counter, some with a lockout of a minute:
        // what was admitted is what the counter holds, never past the limit,
        // and nothing waits on anything in a circle.
        let store = MemoryBackend::new().shards(1);
        let a = Counter {
            namespace: "a",
            quota: quota(300, 60_000),
            lowers: false,
        };
        let b = Counter {
            namespace: "b",
            quota: quota(1_000_000, 60_000),
            lowers: false,
        };
        let block = Window::new(Duration::from_secs(60)).unwrap();
        let admitted: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        let key = Key::new("hot");
                        let mut admitted = 0;
                        for i in 0..400u64 {
                            let cost = (t * 5 + i) % 4;
                            let mut spend = Spend::cost(cost);
                            if i % 7 == 0 {
                                spend = spend.block(block);
                            }
                            let fits = if t % 2 == 0 {
                                store
                                    .spend_one(store.now(), &key, &a, spend)
                                    .unwrap()
                                    .deadline
                            } else {
                                store.spend_at(store.now(), &key, &[a, b], spend).unwrap()[0]
                                    .deadline
                            };
                            if fits.is_some() {
                                admitted += cost;
                            }
                        }
                        admitted
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        let stored = store
            .peek_at(store.now(), "a", &Key::new("hot"))
            .unwrap()
            .count;
        assert!(admitted <= 300, "{admitted}");
        assert_eq!(admitted, stored);
    }

    /// One step of [`the_one_counter_spend_answers_as_the_general_one`].
    #[derive(Debug, Clone)]
    enum Step {
        Spend {
            cost: u64,
            open: bool,
            block_ms: Option<u64>,
            first: Option<u64>,
        },
        /// 0: refund, 1: charge, 2: clear; of the last counted hit.
        Amend(u8, u64),
        Reset,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0u64..6, any::<bool>(), proptest::option::of(1u64..30), proptest::option::of(0u64..6))
                .prop_map(|(cost, open, block_ms, first)| Step::Spend { cost, open, block_ms, first }),
            2 => (0u8..3, 0u64..4).prop_map(|(kind, n)| Step::Amend(kind, n)),
            1 => Just(Step::Reset),
        ]
    }

    proptest! {
        /// A one-counter spend through `spend_one` (the fast path) and
        /// through the general `spend_at`, on two backends given the same
        /// steps at the same times, answer exactly alike: counts, resets,
        /// deadlines (the window's identity, after resets too), lockouts,
        /// amends and what a peek then sees, with and without a first
        /// counter's own unit. Keys in short and long ids;
        /// one shard, so that other keys' lockouts share a lockout shard.
        #[test]
        fn the_one_counter_spend_answers_as_the_general_one(
            shards in 1usize..3,
            limit in 1u64..5,
            window_ms in 1u64..12,
            steps in proptest::collection::vec((0u64..4_000_000, 0usize..3, step()), 1..200),
        ) {
            let fast = MemoryBackend::new().shards(shards);
            let general = MemoryBackend::new().shards(shards);
            let keys = [
                Key::new("k0"),
                Key::new("k1"),
                Key::new("a key longer than a short id holds"),
            ];
            let counter = Counter { namespace: "n", quota: quota(limit, window_ms), lowers: false };
            let mut last: [Option<Hit>; 3] = [None; 3];
            let mut now = 0;
            for (advance, k, step) in steps {
                now += advance;
                let key = &keys[k];
                match step {
                    Step::Spend { cost, open, block_ms, first } => {
                        let mut spend = Spend::cost(cost);
                        if open {
                            spend = spend.open();
                        }
                        if let Some(unit) = first {
                            spend = spend.first(unit);
                        }
                        if let Some(ms) = block_ms {
                            spend = spend.block(Window::new(Duration::from_millis(ms)).unwrap());
                        }
                        let got = fast.spend_one(now, key, &counter, spend).unwrap();
                        let want = general.spend_at(now, key, &[counter], spend).unwrap();
                        prop_assert_eq!(got, want[0]);
                        if got.deadline.is_some() {
                            last[k] = Some(got);
                        }
                    }
                    Step::Amend(kind, n) => {
                        if let Some(d) = last[k].and_then(|h| h.deadline) {
                            let amend = match kind {
                                0 => Amend::Refund(n),
                                1 => Amend::Charge(n),
                                _ => Amend::Clear,
                            };
                            prop_assert_eq!(
                                fast.amend_at(now, "n", key, d.get(), amend),
                                general.amend_at(now, "n", key, d.get(), amend)
                            );
                        }
                    }
                    Step::Reset => {
                        prop_assert_eq!(fast.remove_at(now, "n", key), general.remove_at(now, "n", key));
                    }
                }
                prop_assert_eq!(fast.peek_at(now, "n", key), general.peek_at(now, "n", key));
            }
        }
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
