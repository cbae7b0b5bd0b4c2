//! A local table of counters known to be over their limit until a
//! deadline, so that a remote store (Redis, PostgreSQL) is not asked again
//! about a counter it has already denied. Free of any store's types: a
//! counter is its namespace and its key's bytes, looked up as they are (no
//! storage key is built to ask), and deadlines are instants of this process.
//! The denials are held in the memory backend's own [expiring
//! table](crate::backend::MemoryBackend), with nothing beside each deadline.

use std::time::{Duration, Instant};

use crate::backend::expiring::id::{Id, KeyBytes, Scratch};
use crate::backend::expiring::{Entry, Shard, Table};
use crate::key::HASHED_KEY_LEN;

/// The most shards a cache is cut into.
const MAX_SHARDS: usize = 16;

/// The fewest entries a shard is made to hold: a small cache gets fewer
/// shards, so that its capacity is not cut into slivers.
const MIN_PER_SHARD: usize = 64;

/// Keys known to be over their limit until a deadline, on this instance.
///
/// Sharded by the key's hash, each shard behind its own lock, so that
/// requests on different keys rarely wait for each other. The capacity is
/// split exactly over the shards (each holds `capacity / shards` or one
/// more), so the cache never holds more than `capacity` entries; a shard
/// full of live entries takes no more (a key it cannot hold just costs a
/// round trip).
///
/// Each shard publishes how many entries it holds. A check reads that
/// count without the lock, and a shard holding nothing (the usual case:
/// nobody is over a limit) is answered without taking it. A count read a
/// moment stale can only miss an entry being written, and a missed entry
/// costs one round trip to the store, which answers the same; never a
/// wrong answer.
struct DenyCache {
    capacity: usize,
    /// Deadlines in nanoseconds since `epoch`.
    table: Table<()>,
    epoch: Instant,
}

impl DenyCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            table: Table::new(capacity, MAX_SHARDS, MIN_PER_SHARD),
            epoch: Instant::now(),
        }
    }

    /// `instant` in nanoseconds since the cache was made (0 before it).
    fn nanos(&self, instant: Instant) -> u64 {
        let since = instant.saturating_duration_since(self.epoch);
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Time left while the counter (`namespace`, `key`) is denied.
    /// `now`: the caller's reading of the clock, which it also uses for
    /// what it sends.
    fn check(&self, namespace: &str, key: &[u8], now: Instant) -> Option<Duration> {
        self.find(namespace, key, |id, hash, shard| {
            if shard.held() == 0 {
                return None;
            }
            let now = self.nanos(now);
            let deadline = shard.read().find(hash, &id)?.deadline();
            if deadline > now {
                return Some(Duration::from_nanos(deadline - now));
            }
            // Found expired: dropped by the check that found it, unless it
            // was denied again meanwhile.
            let mut slots = self.table.write(shard);
            if slots
                .find(hash, &id)
                .is_some_and(|entry| entry.get().deadline() <= now)
            {
                slots.remove(hash, &id);
            }
            None
        })
    }

    /// Deny the counter (`namespace`, `key`) until `deadline`.
    fn insert(&self, namespace: &str, key: &[u8], deadline: Instant) {
        let now = Instant::now();
        if deadline <= now {
            return;
        }
        let (now, deadline) = (self.nanos(now), self.nanos(deadline));
        self.find(namespace, key, |id, hash, shard| {
            let mut slots = self.table.write(shard);
            if let Some(mut entry) = slots.find(hash, &id) {
                entry.set_deadline(deadline);
                return;
            }
            // Full of live entries: this key just costs a round trip.
            if slots.has_room(now) {
                slots.insert(hash, id, Entry::new(deadline, ()));
            }
        });
    }

    /// Forget the counter (`namespace`, `key`).
    fn remove(&self, namespace: &str, key: &[u8]) {
        self.find(namespace, key, |id, hash, shard| {
            self.table.write(shard).remove(hash, &id);
        });
    }

    /// `f` of the counter's id, its hash and its shard: the id is built on
    /// this frame's stack, from the key's bytes as they are.
    #[inline(always)]
    fn find<R>(
        &self,
        namespace: &str,
        key: &[u8],
        f: impl FnOnce(Id<'_>, u64, &Shard<()>) -> R,
    ) -> R {
        let (mut buffer, mut scratch) = ([0; HASHED_KEY_LEN], Scratch::new());
        let id = self
            .table
            .id(namespace, KeyBytes::copied(key, &mut buffer), &mut scratch);
        let (hash, shard) = self.table.locate(&id);
        f(id, hash, shard)
    }
}

/// What an instance remembers denied until a deadline, for a remote
/// store's hits and spends: counters at or over their limit, which hits and
/// spends read, and counters locked out, which only spends read. A spend
/// that would lock a counter out is answered here only by a lockout: a
/// counter merely at its limit goes to the store, which locks it out.
///
/// A denial is held until the store said it ends (its window's end, or its
/// lockout's), measured from when the request was sent, except on a
/// counter that [lowers](crate::backend::Counter::lowers): another
/// instance's settle, refund or clear may free it at any moment, so its
/// denial is held at most `recheck` from when it was sent, and the next
/// request after that asks the store again.
///
/// Free of any store's types: a counter is its namespace and its key's
/// bytes, looked up as they are (no storage key is built to ask), and
/// times are [`Instant`]s of this process, read by the caller once per
/// request. The capacity bounds each table (counters at their limit, and
/// counters locked out): a table full of live denials takes no more, and a
/// counter it cannot hold just costs a round trip, never a wrong answer.
///
/// What it guarantees: it answers for a counter only between a denial the
/// store gave and the end the store named for it (or the recheck bound), so
/// an answer from the cache is one the store would have given when it was
/// asked; it never admits anything (an admission always goes to the store).
/// A store calls [`forget`](Self::forget) when it resets a counter, and for
/// a counter that [lowers](crate::backend::Counter::lowers) on every amend
/// that takes something back.
///
/// Example: the [module docs](super).
pub struct Denials {
    over: DenyCache,
    locked: DenyCache,
    /// The longest a denial of a counter that lowers is held.
    recheck: Duration,
}

impl Denials {
    /// Room for `capacity` counters of each kind; a counter that lowers is
    /// held at most `recheck`.
    #[must_use]
    pub fn new(capacity: usize, recheck: Duration) -> Self {
        Self {
            over: DenyCache::new(capacity),
            locked: DenyCache::new(capacity),
            recheck,
        }
    }

    /// The counters each table holds at most, as given to [`new`](Self::new).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.over.capacity
    }

    /// The store denied the counter (`namespace`, `key`) for `left` from
    /// `sent` (when the request that learnt it was sent), at its limit or
    /// `locked` out: hold the denial until then, or for at most the
    /// recheck bound when the counter `lowers`. A denial that has already
    /// ended is not held.
    pub fn remember(
        &self,
        namespace: &str,
        key: &[u8],
        sent: Instant,
        left: Duration,
        locked: bool,
        lowers: bool,
    ) {
        let cache = if locked { &self.locked } else { &self.over };
        let held = if lowers { left.min(self.recheck) } else { left };
        cache.insert(namespace, key, sent + held);
    }

    /// Time left at `now` while a hit on (`namespace`, `key`) is denied
    /// here (the counter is at its limit), or `None`: ask the store.
    #[must_use]
    pub fn hit(&self, namespace: &str, key: &[u8], now: Instant) -> Option<Duration> {
        self.over.check(namespace, key, now)
    }

    /// Time left at `now` while a spend on (`namespace`, `key`) is denied
    /// here, or `None`: ask the store. `locks`: the spend would lock the
    /// counter out, so only a lockout answers it (a counter merely at its
    /// limit goes to the store, which locks it out).
    #[must_use]
    pub fn spend(
        &self,
        namespace: &str,
        key: &[u8],
        now: Instant,
        locks: bool,
    ) -> Option<Duration> {
        self.locked.check(namespace, key, now).or_else(|| {
            (!locks)
                .then(|| self.over.check(namespace, key, now))
                .flatten()
        })
    }

    /// Forget a denial of the counter (`namespace`, `key`) at its limit, and
    /// keep its lockout: a refund made room under the limit, but a lockout
    /// stands until its end.
    pub fn forget_hit(&self, namespace: &str, key: &[u8]) {
        self.over.remove(namespace, key);
    }

    /// Forget the counter (`namespace`, `key`) in both tables.
    pub fn forget(&self, namespace: &str, key: &[u8]) {
        self.over.remove(namespace, key);
        self.locked.remove(namespace, key);
    }
}

impl std::fmt::Debug for Denials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denials")
            .field("capacity", &self.over.capacity)
            .field("recheck", &self.recheck)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shard's published count is its table's length.
    fn counts_match(cache: &DenyCache) {
        assert!(cache.table.published());
    }

    /// Entries held, counted under the shards' locks.
    fn held(cache: &DenyCache) -> usize {
        cache.table.each().map(|s| s.len()).sum()
    }

    #[test]
    fn the_deny_cache_expires_and_stays_bounded() {
        let cache = DenyCache::new(2);
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        cache.insert("n", b"a", later);
        cache.insert("n", b"b", later);
        cache.insert("n", b"c", later);
        assert!(cache.check("n", b"a", Instant::now()).is_some());
        assert!(cache.check("n", b"b", Instant::now()).is_some());
        assert_eq!(
            cache.check("n", b"c", Instant::now()),
            None,
            "a full cache of live entries takes no more"
        );
        counts_match(&cache);
        cache.remove("n", b"a");
        counts_match(&cache);
        assert_eq!(cache.check("n", b"a", Instant::now()), None);
        // An entry found expired is dropped by the check that finds it.
        let soon = Instant::now() + Duration::from_millis(1);
        cache.insert("n", b"soon", soon);
        counts_match(&cache);
        assert_eq!(cache.check("n", b"soon", soon), None);
        counts_match(&cache);
        assert_eq!(held(&cache), 1);
        cache.insert("n", b"past", now);
        assert_eq!(
            cache.check("n", b"past", Instant::now()),
            None,
            "a deadline already gone is not cached"
        );
    }

    #[test]
    fn a_denial_of_a_counter_that_lowers_is_held_only_for_the_recheck_bound() {
        let recheck = Duration::from_millis(100);
        let denials = Denials::new(64, recheck);
        // Sent a little ahead of the clock, so that no deadline here is
        // already gone when it is written, however slow the test runs.
        let sent = Instant::now() + Duration::from_secs(10);
        let window = Duration::from_secs(60);
        for locked in [false, true] {
            let cache = if locked {
                &denials.locked
            } else {
                &denials.over
            };
            let (steady, lowers) = (format!("steady{locked}"), format!("lowers{locked}"));
            denials.remember("n", steady.as_bytes(), sent, window, locked, false);
            denials.remember("n", lowers.as_bytes(), sent, window, locked, true);
            // Read at instants given, not the clock's: nothing here waits.
            let before = sent + recheck - Duration::from_millis(1);
            let after = sent + recheck + Duration::from_millis(1);
            let held = cache.check("n", lowers.as_bytes(), before);
            assert_eq!(
                held,
                Some(Duration::from_millis(1)),
                "{locked}: held until the bound"
            );
            assert_eq!(
                cache.check("n", lowers.as_bytes(), after),
                None,
                "{locked}: asked again past the bound"
            );
            let late = sent + Duration::from_secs(59);
            assert_eq!(
                cache.check("n", steady.as_bytes(), late),
                Some(Duration::from_secs(1)),
                "{locked}: a counter that only goes up is held for its whole window"
            );
        }
        // A window that ends before the bound ends the denial with it.
        let short = Duration::from_millis(10);
        denials.remember("n", b"short", sent, short, false, true);
        assert_eq!(denials.over.check("n", b"short", sent), Some(short));
        assert_eq!(denials.over.check("n", b"short", sent + short), None);
    }

    #[test]
    fn a_sharded_cache_holds_exactly_its_capacity() {
        for capacity in [1, 63, 64, 100, 1000, 1025, 10_000] {
            let cache = DenyCache::new(capacity);
            let caps: usize = cache.table.each().map(|s| s.cap()).sum();
            assert_eq!(caps, capacity, "the shards' shares add up to {capacity}");
            assert!(cache.table.shards() <= MAX_SHARDS);
            let later = Instant::now() + Duration::from_secs(60);
            for i in 0..3 * capacity {
                cache.insert("n", i.to_string().as_bytes(), later);
            }
            let held = held(&cache);
            assert!(held <= capacity, "{held} > {capacity}");
            let found = (0..3 * capacity)
                .filter(|i| {
                    let now = Instant::now();
                    cache.check("n", i.to_string().as_bytes(), now).is_some()
                })
                .count();
            assert_eq!(found, held, "every entry held is found");
        }
    }

    #[test]
    fn a_counter_is_its_namespace_and_key_together() {
        let cache = DenyCache::new(64);
        let later = Instant::now() + Duration::from_secs(60);
        cache.insert("a:b", b"c", later);
        // The same bytes, cut elsewhere, are other counters.
        assert_eq!(cache.check("a", b":bc", Instant::now()), None);
        assert_eq!(cache.check("a:", b"bc", Instant::now()), None);
        assert_eq!(cache.check("a:bc", b"", Instant::now()), None);
        assert_eq!(cache.check("", b"a:bc", Instant::now()), None);
        assert!(cache.check("a:b", b"c", Instant::now()).is_some());
        cache.insert("", b"", later);
        assert!(cache.check("", b"", Instant::now()).is_some());
    }

    #[test]
    fn keys_of_every_form_are_denied_apart() {
        // Short, inline and heap ids, a digest-long key, a key longer than
        // any the crate makes, and a namespace longer than a key may be.
        let long_name = "n".repeat(100);
        let names = ["a", "api:1/3600000ms", long_name.as_str()];
        let mut keys: Vec<Vec<u8>> = [0, 1, 15, 16, 38, 39, 64, 65, 200]
            .into_iter()
            .flat_map(|len| [vec![0u8; len], vec![b'k'; len]])
            .collect();
        keys.dedup(); // one empty key, not two

        let cache = DenyCache::new(1024);
        let later = Instant::now() + Duration::from_secs(60);
        for (i, name) in names.iter().enumerate() {
            for (j, key) in keys.iter().enumerate() {
                cache.insert(name, key, later);
                for (m, other_name) in names.iter().enumerate() {
                    for (n, other) in keys.iter().enumerate() {
                        let denied = cache.check(other_name, other, Instant::now());
                        let before = (m, n) <= (i, j);
                        assert_eq!(denied.is_some(), before, "{m}/{n} after inserting {i}/{j}");
                    }
                }
            }
        }
        assert_eq!(held(&cache), names.len() * keys.len());
        counts_match(&cache);
    }
}
