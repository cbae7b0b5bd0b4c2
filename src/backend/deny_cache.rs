//! A local table of counters known to be over their limit until a
//! deadline, so that a remote store (Redis, PostgreSQL) is not asked again
//! about a counter it has already denied. Free of any store's types: a
//! counter is its namespace and its key's bytes, looked up as they are (no
//! storage key is built to ask), and deadlines are instants of this process.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};

use super::memory::shard_index;

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
/// more), so the cache never holds more than `capacity` entries.
pub(crate) struct DenyCache {
    pub(crate) capacity: usize,
    hasher: DefaultHashBuilder,
    shards: Box<[Shard]>,
    shard_bits: u32,
}

struct Shard {
    /// How many entries the table holds, written under the lock after each
    /// change. A check reads it without the lock, and a shard holding
    /// nothing (the usual case: nobody is over a limit) is answered without
    /// taking it. A count read a moment stale can only miss an entry being
    /// written, and a missed entry costs one round trip to the store, which
    /// answers the same; never a wrong answer.
    held: AtomicUsize,
    state: Mutex<DenyState>,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, DenyState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes the table's length after a change under `state`'s lock.
    fn held(&self, state: &DenyState) {
        self.held.store(state.table.len(), Ordering::Relaxed);
    }
}

struct DenyState {
    /// Each counter as [`entry`] writes it, and its deadline.
    table: HashTable<(Box<[u8]>, quanta::Instant)>,
    /// This shard's share of the capacity.
    cap: usize,
    /// No entry expires before this; a full shard is not swept until then.
    min_deadline: Option<quanta::Instant>,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        let fit = (capacity / MIN_PER_SHARD).clamp(1, MAX_SHARDS);
        // A power of two, at most `fit`.
        let shards = 1 << fit.ilog2();
        let (share, extra) = (capacity / shards, capacity % shards);
        Self {
            capacity,
            hasher: DefaultHashBuilder::default(),
            shards: (0..shards)
                .map(|i| Shard {
                    held: AtomicUsize::new(0),
                    state: Mutex::new(DenyState {
                        table: HashTable::new(),
                        cap: share + usize::from(i < extra),
                        min_deadline: None,
                    }),
                })
                .collect(),
            shard_bits: shards.trailing_zeros(),
        }
    }

    /// The hash of the counter (`namespace`, `key`), from its parts.
    fn hash(&self, namespace: &str, key: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        state.write_usize(namespace.len());
        state.write(namespace.as_bytes());
        state.write(key);
        state.finish()
    }

    /// The shard holding the key of `hash`.
    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[shard_index(hash, self.shard_bits)]
    }

    /// Time left while the counter (`namespace`, `key`) is denied.
    /// `now`: the caller's reading of the clock, which it also uses for
    /// what it sends.
    pub(crate) fn check(
        &self,
        namespace: &str,
        key: &[u8],
        now: quanta::Instant,
    ) -> Option<Duration> {
        let hash = self.hash(namespace, key);
        let shard = self.shard(hash);
        if shard.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut state = shard.lock();
        match state.table.find_entry(hash, |(k, _)| is(k, namespace, key)) {
            Ok(entry) if entry.get().1 > now => Some(entry.get().1 - now),
            Ok(entry) => {
                entry.remove();
                shard.held(&state);
                None
            }
            Err(_) => None,
        }
    }

    /// Deny the counter (`namespace`, `key`) until `deadline`.
    pub(crate) fn insert(&self, namespace: &str, key: &[u8], deadline: quanta::Instant) {
        let hash = self.hash(namespace, key);
        let now = quanta::Instant::now();
        if deadline <= now {
            return;
        }
        let shard = self.shard(hash);
        let mut state = shard.lock();
        let hasher = &self.hasher;
        let known = match state.table.find_entry(hash, |(k, _)| is(k, namespace, key)) {
            Ok(mut entry) => {
                entry.get_mut().1 = deadline;
                true
            }
            Err(_) => false,
        };
        if known {
            state.min_deadline = Some(state.min_deadline.map_or(deadline, |min| min.min(deadline)));
            return;
        }
        if state.table.len() >= state.cap {
            if state.min_deadline.is_some_and(|min| min > now) {
                return; // full of live entries: this key just costs a round trip
            }
            state.table.retain(|(_, d)| *d > now);
            shard.held(&state);
            state.min_deadline = state.table.iter().map(|(_, d)| *d).min();
            if state.table.len() >= state.cap {
                return;
            }
        }
        state.min_deadline = Some(state.min_deadline.map_or(deadline, |min| min.min(deadline)));
        state
            .table
            .insert_unique(hash, (entry(namespace, key), deadline), |(k, _)| {
                let (namespace, key) = parts(k);
                let mut state = hasher.build_hasher();
                state.write_usize(namespace.len());
                state.write(namespace);
                state.write(key);
                state.finish()
            });
        shard.held(&state);
    }

    /// Forget the counter (`namespace`, `key`).
    pub(crate) fn remove(&self, namespace: &str, key: &[u8]) {
        let hash = self.hash(namespace, key);
        let shard = self.shard(hash);
        let mut state = shard.lock();
        if let Ok(entry) = state.table.find_entry(hash, |(k, _)| is(k, namespace, key)) {
            entry.remove();
            shard.held(&state);
        }
    }
}

/// A counter as the table holds it: the namespace's length (8 bytes, little
/// endian), the namespace, the key. The length makes it one-to-one: no two
/// (namespace, key) pairs are one entry.
fn entry(namespace: &str, key: &[u8]) -> Box<[u8]> {
    let mut entry = Vec::with_capacity(8 + namespace.len() + key.len());
    entry.extend_from_slice(&(namespace.len() as u64).to_le_bytes());
    entry.extend_from_slice(namespace.as_bytes());
    entry.extend_from_slice(key);
    entry.into()
}

/// The namespace's bytes and the key an [`entry`] holds.
fn parts(entry: &[u8]) -> (&[u8], &[u8]) {
    let (len, rest) = entry.split_at(8);
    let len = u64::from_le_bytes(len.try_into().expect("an entry starts with 8 bytes")) as usize;
    rest.split_at(len)
}

/// Whether `entry` is the counter (`namespace`, `key`).
fn is(entry: &[u8], namespace: &str, key: &[u8]) -> bool {
    parts(entry) == (namespace.as_bytes(), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shard's published count is its table's length.
    fn counts_match(cache: &DenyCache) {
        for shard in &cache.shards {
            let len = shard.lock().table.len();
            assert_eq!(shard.held.load(Ordering::Relaxed), len);
        }
    }

    #[test]
    fn the_deny_cache_expires_and_stays_bounded() {
        let cache = DenyCache::new(2);
        let now = quanta::Instant::now();
        let later = now + Duration::from_secs(60);
        cache.insert("n", b"a", later);
        cache.insert("n", b"b", later);
        cache.insert("n", b"c", later);
        assert!(cache.check("n", b"a", quanta::Instant::now()).is_some());
        assert!(cache.check("n", b"b", quanta::Instant::now()).is_some());
        assert_eq!(
            cache.check("n", b"c", quanta::Instant::now()),
            None,
            "a full cache of live entries takes no more"
        );
        counts_match(&cache);
        cache.remove("n", b"a");
        counts_match(&cache);
        assert_eq!(cache.check("n", b"a", quanta::Instant::now()), None);
        // An entry found expired is dropped by the check that finds it.
        let soon = quanta::Instant::now() + Duration::from_millis(1);
        cache.insert("n", b"soon", soon);
        counts_match(&cache);
        assert_eq!(cache.check("n", b"soon", soon), None);
        counts_match(&cache);
        assert_eq!(
            cache
                .shards
                .iter()
                .map(|s| s.lock().table.len())
                .sum::<usize>(),
            1
        );
        cache.insert("n", b"past", now);
        assert_eq!(
            cache.check("n", b"past", quanta::Instant::now()),
            None,
            "a deadline already gone is not cached"
        );
    }

    #[test]
    fn a_sharded_cache_holds_exactly_its_capacity() {
        for capacity in [1, 63, 64, 100, 1000, 1025, 10_000] {
            let cache = DenyCache::new(capacity);
            let caps: usize = cache.shards.iter().map(|s| s.lock().cap).sum();
            assert_eq!(caps, capacity, "the shards' shares add up to {capacity}");
            assert!(cache.shards.len() <= MAX_SHARDS);
            let later = quanta::Instant::now() + Duration::from_secs(60);
            for i in 0..3 * capacity {
                cache.insert("n", i.to_string().as_bytes(), later);
            }
            let held: usize = cache.shards.iter().map(|s| s.lock().table.len()).sum();
            assert!(held <= capacity, "{held} > {capacity}");
            let found = (0..3 * capacity)
                .filter(|i| {
                    let now = quanta::Instant::now();
                    cache.check("n", i.to_string().as_bytes(), now).is_some()
                })
                .count();
            assert_eq!(found, held, "every entry held is found");
        }
    }

    #[test]
    fn a_counter_is_its_namespace_and_key_together() {
        let cache = DenyCache::new(64);
        let later = quanta::Instant::now() + Duration::from_secs(60);
        cache.insert("a:b", b"c", later);
        // The same bytes, cut elsewhere, are other counters.
        assert_eq!(cache.check("a", b":bc", quanta::Instant::now()), None);
        assert_eq!(cache.check("a:", b"bc", quanta::Instant::now()), None);
        assert_eq!(cache.check("a:bc", b"", quanta::Instant::now()), None);
        assert_eq!(cache.check("", b"a:bc", quanta::Instant::now()), None);
        assert!(cache.check("a:b", b"c", quanta::Instant::now()).is_some());
        cache.insert("", b"", later);
        assert!(cache.check("", b"", quanta::Instant::now()).is_some());
        assert_eq!(parts(&entry("a:b", b"c")), (&b"a:b"[..], &b"c"[..]));
    }
}
