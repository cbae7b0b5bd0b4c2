//! The in-memory backend: counters in this process, bounded, sharded.

use std::future::{Ready, ready};
use std::hash::{BuildHasher, Hasher};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::{Backend, BackendError, Counter, Hit, Hits};
use crate::ConfigError;
use crate::key::{Key, MAX_KEY_LEN};
#[cfg(test)]
use crate::quota::Quota;
use crate::quota::Window;

/// Live keys held by default before new keys are refused.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A shard is swept of expired counters at least once each time it doubles.
const MIN_SWEEP_LEN: usize = 64;

/// Counters held in this process: the embedded default.
///
/// A hit on a key locks one of several shards, reads the clock, and
/// increments or creates the key's counter; the future it returns is already
/// complete, and a hit on an existing key allocates nothing.
///
/// # Bounded memory
///
/// Expired counters are reclaimed as new keys arrive, with no task to
/// schedule: a shard is swept whenever it has doubled since its last sweep,
/// and before it refuses a new key. At most [`max_keys`] live keys are held
/// (split evenly over the shards). When a shard is full of **live** counters,
/// a new key is refused with [`BackendError::AtCapacity`], which the layer
/// treats as an outage under its [`FailurePolicy`](crate::FailurePolicy): a
/// live counter is never evicted to make room, because evicting it would
/// hand that client a fresh window. Checking that nothing can be reclaimed
/// costs O(1), so a flood at the cap cannot make each request scan the shard.
///
/// A counter takes one 64-byte slot (plus a control byte) when its namespace
/// and key fit in 39 bytes (a layer name and an IP address do), and a heap
/// copy of them when they do not. The hash tables keep slack: at the default
/// cap of [`DEFAULT_MAX_KEYS`] (split over 16 shards of up to 131,072 slots
/// on a machine with up to 4 cores) it is about 140 MB when full of short
/// keys.
///
/// [`max_keys`]: MemoryBackendBuilder::max_keys
///
/// # Time
///
/// Windows are measured on a monotonic clock (the processor's time-stamp counter); a test on
/// a paused tokio runtime builds the backend with
/// [`tokio_clock`](MemoryBackendBuilder::tokio_clock) and moves windows with
/// `tokio::time::advance`.
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    hasher: DefaultHashBuilder,
    shards: Box<[Mutex<Shard>]>,
    shard_bits: u32,
    keys_per_shard: usize,
    clock: Clock,
}

/// The clock a [`MemoryBackend`] reads on every hit.
#[derive(Debug, Clone, Copy)]
enum Clock {
    /// The processor's time-stamp counter through [`quanta`], calibrated
    /// against the OS's monotonic clock: about half the cost of
    /// [`std::time::Instant::now`] (the default).
    Quanta(quanta::Instant),
    /// tokio's clock: `tokio::time::pause` and `tokio::time::advance`
    /// move the windows, so tests need not sleep.
    Tokio(Instant),
}

impl Clock {
    fn quanta() -> Self {
        Self::Quanta(quanta::Instant::now())
    }

    fn tokio() -> Self {
        Self::Tokio(Instant::now())
    }

    /// Nanoseconds since this clock was made.
    fn now(&self) -> u64 {
        nanos(match self {
            Self::Quanta(epoch) => quanta::Instant::now().saturating_duration_since(*epoch),
            Self::Tokio(epoch) => Instant::now().saturating_duration_since(*epoch),
        })
    }
}

#[derive(Debug)]
struct Shard {
    table: HashTable<Entry>,
    /// Sweep when the table reaches this length.
    sweep_at: usize,
    /// No entry expires before this (nanoseconds since the epoch).
    min_deadline: u64,
}

/// 64 bytes: one cache line.
#[derive(Debug)]
struct Entry {
    /// `[namespace length][namespace][key]`, inline up to 40 bytes.
    id: SmallVec<[u8; 40]>,
    count: u64,
    /// Nanoseconds since the backend's epoch.
    deadline: u64,
}

/// A counter's identity as a lookup sees it, without copying.
#[derive(Clone, Copy)]
struct Id<'a> {
    namespace: &'a [u8],
    key: &'a [u8],
}

impl<'a> Id<'a> {
    /// `hashed` holds the namespace's hashed form if it is longer than a
    /// key may be (a layer's name never is).
    fn new(namespace: &'a str, key: &'a Key, hashed: &'a mut Option<Key>) -> Self {
        let namespace = if namespace.len() <= MAX_KEY_LEN {
            namespace.as_bytes()
        } else {
            hashed.insert(Key::new(namespace)).as_bytes()
        };
        Self {
            namespace,
            key: key.as_bytes(),
        }
    }

    fn of(entry: &'a Entry) -> Self {
        let len = usize::from(entry.id[0]);
        Self {
            namespace: &entry.id[1..=len],
            key: &entry.id[1 + len..],
        }
    }

    fn matches(self, entry: &Entry) -> bool {
        let other = Id::of(entry);
        self.key == other.key && self.namespace == other.namespace
    }

    fn hash(self, hasher: &DefaultHashBuilder) -> u64 {
        let mut state = hasher.build_hasher();
        state.write(self.namespace);
        state.write_u8(0xff);
        state.write(self.key);
        state.finish()
    }

    fn to_owned(self) -> SmallVec<[u8; 40]> {
        let mut id = SmallVec::with_capacity(1 + self.namespace.len() + self.key.len());
        id.push(self.namespace.len() as u8);
        id.extend_from_slice(self.namespace);
        id.extend_from_slice(self.key);
        id
    }
}

/// Builds a [`MemoryBackend`] with a key cap and shard count of your choice.
#[derive(Debug, Clone)]
pub struct MemoryBackendBuilder {
    max_keys: usize,
    shards: usize,
    tokio_clock: bool,
}

impl Default for MemoryBackendBuilder {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, NonZeroUsize::get);
        Self {
            max_keys: DEFAULT_MAX_KEYS,
            shards: (cores * 4).next_power_of_two().clamp(16, 256),
            tokio_clock: false,
        }
    }
}

impl MemoryBackendBuilder {
    /// The most live keys held at once; new keys past it are refused with
    /// [`BackendError::AtCapacity`] until old windows close.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] for zero.
    pub fn max_keys(mut self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        self.max_keys = max_keys;
        Ok(self)
    }

    /// How many independently locked shards (rounded up to a power of two,
    /// at least 1). `max_keys` is split evenly over them.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1).next_power_of_two();
        self
    }

    /// Read tokio's clock instead of the default the processor's time-stamp counter, so that
    /// `tokio::time::pause` and `tokio::time::advance` move the windows
    /// (for tests; it costs about 8 ns more per hit).
    pub fn tokio_clock(mut self) -> Self {
        self.tokio_clock = true;
        self
    }

    /// The backend.
    pub fn build(self) -> MemoryBackend {
        let shards = self.shards.min(self.max_keys.next_power_of_two());
        let keys_per_shard = self.max_keys.div_ceil(shards);
        MemoryBackend {
            inner: Arc::new(Inner {
                hasher: DefaultHashBuilder::default(),
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Shard {
                            table: HashTable::new(),
                            sweep_at: MIN_SWEEP_LEN,
                            min_deadline: u64::MAX,
                        })
                    })
                    .collect(),
                shard_bits: shards.trailing_zeros(),
                keys_per_shard,
                clock: if self.tokio_clock {
                    Clock::tokio()
                } else {
                    Clock::quanta()
                },
            }),
        }
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A backend holding at most [`DEFAULT_MAX_KEYS`] live keys.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Choose the key cap and shard count.
    pub fn builder() -> MemoryBackendBuilder {
        MemoryBackendBuilder::default()
    }

    /// Live and expired-but-unswept counters held now.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Whether no counter is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most live keys this backend holds.
    pub fn max_keys(&self) -> usize {
        self.inner.keys_per_shard * self.inner.shards.len()
    }

    fn now(&self) -> u64 {
        self.inner.clock.now()
    }

    fn locate(&self, id: Id<'_>) -> (u64, MutexGuard<'_, Shard>) {
        let hash = id.hash(&self.inner.hasher);
        let index = if self.inner.shard_bits == 0 {
            0
        } else {
            (hash >> (64 - self.inner.shard_bits)) as usize
        };
        (hash, lock(&self.inner.shards[index]))
    }

    /// The hit itself, at time `now` (nanoseconds since the epoch).
    #[inline]
    pub(crate) fn hit_at(
        &self,
        now: u64,
        namespace: &str,
        key: &Key,
        window: Window,
    ) -> Result<Hit, BackendError> {
        // The deadline is computed first; it is only ever written into a
        // counter that this hit creates.
        let deadline = now.saturating_add(window.as_millis().saturating_mul(1_000_000));
        let mut hashed = None;
        let id = Id::new(namespace, key, &mut hashed);
        let (hash, mut shard) = self.locate(id);
        if let Some(entry) = shard.table.find_mut(hash, |e| id.matches(e)) {
            if entry.deadline > now {
                entry.count = entry.count.saturating_add(1);
                return Ok(Hit {
                    count: entry.count,
                    reset: Duration::from_nanos(entry.deadline - now),
                });
            }
            // The old window closed: this hit opens a new one.
            entry.count = 1;
            entry.deadline = deadline;
            shard.min_deadline = shard.min_deadline.min(deadline);
            return Ok(Hit {
                count: 1,
                reset: Duration::from_nanos(deadline - now),
            });
        }
        let len = shard.table.len();
        if len >= shard.sweep_at || len >= self.inner.keys_per_shard {
            shard.sweep(now, &self.inner.hasher);
            if shard.table.len() >= self.inner.keys_per_shard {
                return Err(BackendError::AtCapacity);
            }
        }
        shard.min_deadline = shard.min_deadline.min(deadline);
        let hasher = &self.inner.hasher;
        shard.table.insert_unique(
            hash,
            Entry {
                id: id.to_owned(),
                count: 1,
                deadline,
            },
            |e| entry_hash(hasher, e),
        );
        Ok(Hit {
            count: 1,
            reset: Duration::from_nanos(deadline - now),
        })
    }

    fn peek_at(&self, now: u64, namespace: &str, key: &Key) -> Option<Hit> {
        let mut hashed = None;
        let id = Id::new(namespace, key, &mut hashed);
        let (hash, shard) = self.locate(id);
        shard
            .table
            .find(hash, |e| id.matches(e))
            .filter(|e| e.deadline > now)
            .map(|e| Hit {
                count: e.count,
                reset: Duration::from_nanos(e.deadline - now),
            })
    }

    fn remove_at(&self, now: u64, namespace: &str, key: &Key) -> bool {
        let mut hashed = None;
        let id = Id::new(namespace, key, &mut hashed);
        let (hash, mut shard) = self.locate(id);
        match shard.table.find_entry(hash, |e| id.matches(e)) {
            Ok(entry) => entry.remove().0.deadline > now,
            Err(_) => false,
        }
    }
}

impl Shard {
    /// Drop expired counters, unless none can have expired yet (O(1)).
    fn sweep(&mut self, now: u64, hasher: &DefaultHashBuilder) {
        if self.min_deadline > now {
            self.sweep_at = self.sweep_at.max(self.table.len().saturating_mul(2));
            return;
        }
        let mut min_deadline = u64::MAX;
        self.table.retain(|e| {
            let live = e.deadline > now;
            if live {
                min_deadline = min_deadline.min(e.deadline);
            }
            live
        });
        self.min_deadline = min_deadline;
        let len = self.table.len();
        if len < self.table.capacity() / 4 {
            self.table.shrink_to(len * 2, |e| entry_hash(hasher, e));
        }
        self.sweep_at = len.saturating_mul(2).max(MIN_SWEEP_LEN);
    }
}

fn entry_hash(hasher: &DefaultHashBuilder, entry: &Entry) -> u64 {
    Id::of(entry).hash(hasher)
}

/// Whole nanoseconds, saturating (without the u128 division of `as_nanos`).
fn nanos(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(duration.subsec_nanos()))
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a half-written counter
    // (every write is a single field store), so the data is still sound.
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Backend for MemoryBackend {
    type Future = Ready<Result<Hits, BackendError>>;

    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        let now = self.now();
        let mut hits = Hits::new();
        for counter in counters {
            match self.hit_at(now, counter.namespace, key, counter.quota.window()) {
                Ok(hit) => hits.push(hit),
                Err(err) => return ready(Err(err)),
            }
        }
        ready(Ok(hits))
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        Ok(self.peek_at(self.now(), namespace, key))
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        Ok(self.remove_at(self.now(), namespace, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn window(ms: u64) -> Window {
        Window::new(Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn the_window_stays_pinned_to_the_first_hit() {
        let store = MemoryBackend::new();
        let key = Key::new("alice");
        let w = window(15 * 60 * 1000);
        let min = 60 * 1000 * MS;
        let at = |t: u64| store.hit_at(t, "login", &key, w).unwrap();
        assert_eq!(
            at(0),
            Hit {
                count: 1,
                reset: Duration::from_secs(900)
            }
        );
        assert_eq!(
            at(14 * min),
            Hit {
                count: 2,
                reset: Duration::from_secs(60)
            },
            "the 14-minute knock does not move the window"
        );
        assert_eq!(at(15 * min - 1).count, 3, "still inside the first window");
        assert_eq!(
            at(15 * min + MS),
            Hit {
                count: 1,
                reset: Duration::from_secs(900)
            },
            "a new window opens with count 1"
        );
        // A client knocking every 14 minutes is not locked out forever: each
        // window closes 15 minutes after the hit that opened it.
        let mut opened = 0;
        for i in 1..=40u64 {
            let hit = at(15 * min + MS + i * 14 * min);
            if hit.count == 1 {
                opened += 1;
            }
            assert!(hit.count <= 2, "knock {i} counted {}", hit.count);
        }
        assert_eq!(opened, 20, "every other knock opens a fresh window");
    }

    #[test]
    fn the_default_clock_counts_within_the_window() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let quota = Quota::with_window(std::num::NonZeroU64::MIN, window(60_000));
        let counter = [Counter {
            namespace: "n",
            quota,
        }];
        let first = store.hit_all(&key, &counter).into_inner().unwrap()[0];
        let second = store.hit_all(&key, &counter).into_inner().unwrap()[0];
        assert_eq!((first.count, second.count), (1, 2));
        assert!(second.reset <= first.reset && first.reset <= Duration::from_secs(60));
        assert!(second.reset > Duration::from_secs(59), "{:?}", second.reset);
    }

    #[test]
    fn long_namespaces_are_hashed_like_keys() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let long = "n".repeat(200);
        let other = format!("{}m", "n".repeat(199));
        assert_eq!(store.hit_at(0, &long, &key, window(1000)).unwrap().count, 1);
        assert_eq!(store.hit_at(0, &long, &key, window(1000)).unwrap().count, 2);
        assert_eq!(
            store.hit_at(0, &other, &key, window(1000)).unwrap().count,
            1
        );
        assert_eq!(store.peek_at(0, &long, &key).unwrap().count, 2);
    }

    #[test]
    fn namespaces_keep_counters_apart() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        assert_eq!(store.hit_at(0, "a", &key, window(1000)).unwrap().count, 1);
        assert_eq!(store.hit_at(0, "a", &key, window(1000)).unwrap().count, 2);
        assert_eq!(store.hit_at(0, "b", &key, window(1000)).unwrap().count, 1);
    }

    #[test]
    fn peek_does_not_count_and_reset_deletes() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        assert_eq!(store.peek_at(0, "n", &key), None);
        store.hit_at(0, "n", &key, window(1000)).unwrap();
        store.hit_at(MS, "n", &key, window(1000)).unwrap();
        assert_eq!(
            store.peek_at(2 * MS, "n", &key),
            Some(Hit {
                count: 2,
                reset: Duration::from_millis(998)
            })
        );
        assert_eq!(
            store.peek_at(2 * MS, "n", &key).unwrap().count,
            2,
            "peek does not count"
        );
        assert!(store.remove_at(3 * MS, "n", &key));
        assert!(!store.remove_at(3 * MS, "n", &key));
        assert_eq!(
            store.hit_at(4 * MS, "n", &key, window(1000)).unwrap().count,
            1
        );
        assert_eq!(store.peek_at(1004 * MS, "n", &key), None, "expired");
    }

    #[test]
    fn a_full_store_refuses_new_keys_and_keeps_live_counters() {
        let store = MemoryBackend::builder()
            .max_keys(100)
            .unwrap()
            .shards(1)
            .build();
        let w = window(1000);
        for i in 0..100 {
            store.hit_at(0, "n", &Key::display(i), w).unwrap();
        }
        // A flood of distinct keys is refused, not let in by eviction.
        for i in 100..10_000 {
            assert!(matches!(
                store.hit_at(MS, "n", &Key::display(i), w),
                Err(BackendError::AtCapacity)
            ));
        }
        assert_eq!(store.len(), 100);
        // Every live counter is intact and still counting.
        for i in 0..100 {
            assert_eq!(
                store
                    .hit_at(2 * MS, "n", &Key::display(i), w)
                    .unwrap()
                    .count,
                2,
                "key {i}"
            );
        }
        // Once the windows close, room is made without anyone scheduling it.
        assert_eq!(
            store
                .hit_at(1000 * MS, "n", &Key::display(100_000), w)
                .unwrap()
                .count,
            1
        );
        assert_eq!(store.len(), 1, "the expired counters were swept");
    }

    #[test]
    fn expired_counters_are_reclaimed_as_keys_arrive() {
        let store = MemoryBackend::builder().shards(1).build();
        let w = window(10);
        for i in 0..100_000u64 {
            // Every key lives 10 ms; a new key arrives every millisecond.
            store.hit_at(i * MS, "n", &Key::display(i), w).unwrap();
        }
        assert!(
            store.len() < 2 * MIN_SWEEP_LEN.max(20),
            "held {} counters",
            store.len()
        );
    }

    #[test]
    fn the_default_cap_holds_under_a_flood_across_shards() {
        let store = MemoryBackend::builder().max_keys(1000).unwrap().build();
        let mut refused = 0;
        for i in 0..50_000 {
            if store
                .hit_at(0, "n", &Key::display(i), window(60_000))
                .is_err()
            {
                refused += 1;
            }
        }
        assert!(
            store.len() <= store.max_keys(),
            "{} > {}",
            store.len(),
            store.max_keys()
        );
        assert_eq!(refused, 50_000 - store.len());
    }

    /// The reference model: a map from key to (count, deadline) where only a
    /// hit that finds no live counter sets the deadline.
    #[derive(Default)]
    struct Model(std::collections::HashMap<u8, (u64, u64)>);

    impl Model {
        fn hit(&mut self, now: u64, key: u8, window_ns: u64) -> Hit {
            let entry = self.0.entry(key).or_insert((0, 0));
            if entry.1 <= now {
                *entry = (0, now + window_ns);
            }
            entry.0 += 1;
            Hit {
                count: entry.0,
                reset: Duration::from_nanos(entry.1 - now),
            }
        }
    }

    proptest! {
        #[test]
        fn matches_the_reference_model(
            window_ms in 1u64..50,
            steps in proptest::collection::vec((0u64..20_000_000, 0u8..4), 1..300),
        ) {
            let store = MemoryBackend::builder().shards(2).build();
            let mut model = Model::default();
            let mut now = 0;
            let w = window(window_ms);
            let mut opened = std::collections::HashMap::new();
            for (advance, key) in steps {
                now += advance;
                let got = store.hit_at(now, "p", &Key::new([key]), w).unwrap();
                let want = model.hit(now, key, window_ms * MS);
                prop_assert_eq!(got, want);
                // The window never moves once created.
                if got.count == 1 {
                    opened.insert(key, now);
                }
                prop_assert_eq!(now + got.reset.as_nanos() as u64, opened[&key] + window_ms * MS);
            }
        }
    }
}
