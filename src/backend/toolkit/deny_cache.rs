//! A local table of counters known to be over their limit until a
//! deadline, so that a remote store (Redis, PostgreSQL) is not asked again
//! about a counter it has already denied. Free of any store's types: a
//! counter is its namespace and its key's bytes, looked up as they are (no
//! storage key is built to ask), and deadlines are instants of this process.
//! The denials are held in the memory backend's own [expiring
//! table](crate::backend::MemoryBackend), each deadline with the limit the
//! counter was denied at.

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
    /// Deadlines in nanoseconds since `epoch`, each with the highest limit
    /// it answers for.
    table: Table<u64>,
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

    /// Time left while the counter (`namespace`, `key`) is denied under a
    /// limit of `limit`: `None` when it is not held, or held for lower
    /// limits only. `now`: the caller's reading of the clock, which it also
    /// uses for what it sends.
    fn check(&self, namespace: &str, key: &[u8], limit: u64, now: Instant) -> Option<Duration> {
        self.find(namespace, key, |id, hash, shard| {
            if shard.held() == 0 {
                return None;
            }
            let now = self.nanos(now);
            let (deadline, most) = {
                let slots = shard.read();
                let entry = slots.find(hash, &id)?;
                (entry.deadline(), *entry.value())
            };
            if deadline > now {
                // Denied at a lower limit than this request's (the limit
                // was raised): the store may admit it.
                return (limit <= most).then(|| Duration::from_nanos(deadline - now));
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

    /// Deny the counter (`namespace`, `key`) until `deadline`, for any
    /// limit up to `most`.
    fn insert(&self, namespace: &str, key: &[u8], deadline: Instant, most: u64) {
        let now = Instant::now();
        if deadline <= now {
            return;
        }
        let (now, deadline) = (self.nanos(now), self.nanos(deadline));
        self.find(namespace, key, |id, hash, shard| {
            let mut slots = self.table.write(shard);
            if let Some(mut entry) = slots.find(hash, &id) {
                entry.set_deadline(deadline);
                *entry.value_mut() = most;
                return;
            }
            // Full of live entries: this key just costs a round trip.
            if slots.has_room(now) {
                slots.insert(hash, id, Entry::new(deadline, most));
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
        f: impl FnOnce(Id<'_>, u64, &Shard<u64>) -> R,
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
/// A limit that changes (a [`quota_by`](crate::RateLimitLayer::quota_by)
/// tier, on a counter that tiers share) is told by the limit each request
/// asks with: a denial at its limit answers only requests under that limit
/// or a lower one, and a request under a higher limit (an upgrade) goes to
/// the store.
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
    /// `sent` (when the request that learnt it was sent), as `denied` says
    /// (at its limit, or locked out): hold the denial until then, or for
    /// at most the recheck bound when the counter `lowers`. A denial that
    /// has already ended is not held.
    pub fn remember(
        &self,
        namespace: &str,
        key: &[u8],
        sent: Instant,
        left: Duration,
        denied: Denied,
        lowers: bool,
    ) {
        let (cache, most) = match denied {
            Denied::AtLimit { limit } => (&self.over, limit),
            Denied::Locked => (&self.locked, u64::MAX),
        };
        let held = if lowers { left.min(self.recheck) } else { left };
        cache.insert(namespace, key, sent + held, most);
    }

    /// Time left at `now` while a hit on (`namespace`, `key`) under a limit
    /// of `limit` is denied here (the counter was denied at that limit or a
    /// higher one), or `None`: ask the store.
    #[must_use]
    pub fn hit(&self, namespace: &str, key: &[u8], limit: u64, now: Instant) -> Option<Duration> {
        self.over.check(namespace, key, limit, now)
    }

    /// Time left at `now` while a spend on (`namespace`, `key`) under a
    /// limit of `limit` is denied here, or `None`: ask the store. `locks`:
    /// the spend would lock the counter out, so only a lockout answers it
    /// (a counter merely at its limit goes to the store, which locks it
    /// out).
    #[must_use]
    pub fn spend(
        &self,
        namespace: &str,
        key: &[u8],
        limit: u64,
        now: Instant,
        locks: bool,
    ) -> Option<Duration> {
        self.locked
            .check(namespace, key, u64::MAX, now)
            .or_else(|| {
                (!locks)
                    .then(|| self.over.check(namespace, key, limit, now))
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

/// How the store denied a counter, for [`Denials::remember`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// At its limit or over it, `limit` being the limit the request was
    /// judged under: requests under that limit or a lower one are denied
    /// until the time given.
    AtLimit {
        /// The limit the store denied the counter at.
        limit: u64,
    },
    /// Locked out: every spend is denied until the time given, whatever
    /// its limit.
    Locked,
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
        cache.insert("n", b"a", later, u64::MAX);
        cache.insert("n", b"b", later, u64::MAX);
        cache.insert("n", b"c", later, u64::MAX);
        assert!(cache.check("n", b"a", 1, Instant::now()).is_some());
        assert!(cache.check("n", b"b", 1, Instant::now()).is_some());
        assert_eq!(
            cache.check("n", b"c", 1, Instant::now()),
            None,
            "a full cache of live entries takes no more"
        );
        counts_match(&cache);
        cache.remove("n", b"a");
        counts_match(&cache);
        assert_eq!(cache.check("n", b"a", 1, Instant::now()), None);
        // An entry found expired is dropped by the check that finds it.
        let soon = Instant::now() + Duration::from_millis(1);
        cache.insert("n", b"soon", soon, u64::MAX);
        counts_match(&cache);
        assert_eq!(cache.check("n", b"soon", 1, soon), None);
        counts_match(&cache);
        assert_eq!(held(&cache), 1);
        cache.insert("n", b"past", now, u64::MAX);
        assert_eq!(
            cache.check("n", b"past", 1, Instant::now()),
            None,
            "a deadline already gone is not cached"
        );
    }

    /// A lockout, or a denial at a limit of 1.
    fn denied(locked: bool) -> Denied {
        if locked {
            Denied::Locked
        } else {
            Denied::AtLimit { limit: 1 }
        }
    }

    #[test]
    fn a_denial_answers_only_requests_under_its_limit_or_a_lower_one() {
        let denials = Denials::new(64, Duration::from_secs(1));
        let sent = Instant::now() + Duration::from_secs(10);
        let window = Duration::from_secs(60);
        denials.remember(
            "n",
            b"k",
            sent,
            window,
            Denied::AtLimit { limit: 50 },
            false,
        );
        assert!(denials.hit("n", b"k", 50, sent).is_some(), "the same limit");
        assert!(denials.hit("n", b"k", 20, sent).is_some(), "a lower limit");
        assert_eq!(
            denials.hit("n", b"k", 51, sent),
            None,
            "a raised limit asks"
        );
        assert!(denials.spend("n", b"k", 50, sent, false).is_some());
        assert_eq!(denials.spend("n", b"k", 100, sent, false), None);
        // A later denial at the higher limit answers for it.
        denials.remember(
            "n",
            b"k",
            sent,
            window,
            Denied::AtLimit { limit: 100 },
            false,
        );
        assert!(denials.hit("n", b"k", 100, sent).is_some());
        // A lockout answers spends under any limit.
        denials.remember("n", b"l", sent, window, Denied::Locked, false);
        assert!(denials.spend("n", b"l", u64::MAX, sent, false).is_some());
        assert!(denials.spend("n", b"l", 1, sent, true).is_some());
        assert_eq!(
            denials.hit("n", b"l", 1, sent),
            None,
            "hits read no lockout"
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
            denials.remember("n", steady.as_bytes(), sent, window, denied(locked), false);
            denials.remember("n", lowers.as_bytes(), sent, window, denied(locked), true);
            // Read at instants given, not the clock's: nothing here waits.
            let before = sent + recheck - Duration::from_millis(1);
            let after = sent + recheck + Duration::from_millis(1);
            let held = cache.check("n", lowers.as_bytes(), 1, before);
            assert_eq!(
                held,
                Some(Duration::from_millis(1)),
                "{locked}: held until the bound"
            );
            assert_eq!(
                cache.check("n", lowers.as_bytes(), 1, after),
                None,
                "{locked}: asked again past the bound"
            );
            let late = sent + Duration::from_secs(59);
            assert_eq!(
                cache.check("n", steady.as_bytes(), 1, late),
                Some(Duration::from_secs(1)),
                "{locked}: a counter that only goes up is held for its whole window"
            );
        }
        // A window that ends before the bound ends the denial with it.
        let short = Duration::from_millis(10);
        denials.remember("n", b"short", sent, short, denied(false), true);
        assert_eq!(denials.over.check("n", b"short", 1, sent), Some(short));
        assert_eq!(denials.over.check("n", b"short", 1, sent + short), None);
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
                cache.insert("n", i.to_string().as_bytes(), later, u64::MAX);
            }
            let held = held(&cache);
            assert!(held <= capacity, "{held} > {capacity}");
            let found = (0..3 * capacity)
                .filter(|i| {
                    let now = Instant::now();
                    cache.check("n", i.to_string().as_bytes(), 1, now).is_some()
                })
                .count();
            assert_eq!(found, held, "every entry held is found");
        }
    }

    #[test]
    fn a_counter_is_its_namespace_and_key_together() {
        let cache = DenyCache::new(64);
        let later = Instant::now() + Duration::from_secs(60);
        cache.insert("a:b", b"c", later, u64::MAX);
        // The same bytes, cut elsewhere, are other counters.
        assert_eq!(cache.check("a", b":bc", 1, Instant::now()), None);
        assert_eq!(cache.check("a:", b"bc", 1, Instant::now()), None);
        assert_eq!(cache.check("a:bc", b"", 1, Instant::now()), None);
        assert_eq!(cache.check("", b"a:bc", 1, Instant::now()), None);
        assert!(cache.check("a:b", b"c", 1, Instant::now()).is_some());
        cache.insert("", b"", later, u64::MAX);
        assert!(cache.check("", b"", 1, Instant::now()).is_some());
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
                cache.insert(name, key, later, u64::MAX);
                for (m, other_name) in names.iter().enumerate() {
                    for (n, other) in keys.iter().enumerate() {
                        let denied = cache.check(other_name, other, 1, Instant::now());
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
