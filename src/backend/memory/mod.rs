//! The in-memory backend: counters in this process, bounded, sharded.

mod clock;
mod heed;
mod lease;
mod spend;

use std::future::{Future, Ready, ready};
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::expiring::id::{Id, KeyBytes, Scratch};
use super::expiring::{Entry, Shard, Table};
use super::{
    Amend, Backend, BackendError, Cap, Counter, Heeding, Held, Hit, Hits, Leasing, LimitScope,
    Limits, SlotId, Spend, Spending, StoredLimits, Taken,
};
use crate::error::ConfigError;
use crate::key::Key;
use crate::quota::{Quota, Window};
use clock::Clock;

/// Live keys held by default before new keys are refused (see
/// [`MemoryBackend`]'s [configuration](MemoryBackend#configuration)).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The most shards a backend may be built with (see
/// [`try_shards`](MemoryBackend::try_shards)'s example).
pub const MAX_SHARDS: usize = 1 << 16;

/// The fewest live keys a shard is made to hold: below that, a backend uses
/// fewer shards than asked, so that a small cap is not cut into slivers that
/// fill up long before the cap is reached.
const MIN_KEYS_PER_SHARD: usize = 1024;

/// Counters held in this process: the embedded default.
///
/// A hit reads the clock and finds the key's shard. A hit on a live counter
/// takes the shard's read lock and increments the counter atomically, so
/// hits from several threads, on one key too, don't wait for each other;
/// creating a counter or opening its next window takes the write lock. The
/// future a hit returns is already complete, and a hit on an existing key
/// allocates nothing.
///
/// # Bounded memory
///
/// Expired counters are reclaimed as new keys arrive, with no task to
/// schedule: a shard is swept whenever it has doubled since its last sweep,
/// and before it refuses a new key. When a shard is full of **live**
/// counters, a new key is refused with [`BackendError::AtCapacity`], which
/// the layer treats as an outage under its
/// [`FailurePolicy`](crate::FailurePolicy): a live counter is never evicted
/// to make room, because evicting it would hand that client a fresh window.
/// Checking that nothing can be reclaimed costs O(1), so a flood at the cap
/// cannot make each request scan the shard.
///
/// What [`max_keys(n)`] guarantees:
///
/// - **Never more than `n` live counters.** `n` is split exactly over the
///   shards (each holds `n / shards` or one more), so the shards' caps add
///   up to `n`.
/// - **A key is refused only when its own shard is full**, holding its share
///   of live counters. Keys spread over the shards by hash, so under a flood
///   of distinct keys one shard fills a little before the others: the store
///   may refuse a key while it holds somewhat fewer than `n` counters in all.
///   Each shard is made to hold at least 1,024 keys (a small cap gets fewer
///   shards) to keep that margin small; a store with one shard (any cap
///   under 2,048, or [`shards(1)`](MemoryBackend::shards)) holds
///   exactly `n` before its first refusal.
///
/// [`max_keys(n)`]: MemoryBackend::max_keys
///
/// A counter takes one 32-byte slot (plus a control byte) when its key has
/// at most 15 bytes (an IPv4 address as text does) and its namespace is one
/// of the first 16 the backend sees (a layer's name and its quotas' counter
/// names are a handful). Any other counter takes a 64-byte slot, and a heap
/// copy of its namespace and key when the two together pass 38 bytes. The
/// hash tables keep slack: at the default cap of [`DEFAULT_MAX_KEYS`] (split
/// over 16 shards of up to 131,072 slots each on a machine with up to 4
/// cores) it is about 70 MB when full of short keys and about 140 MB when
/// full of longer ones.
///
/// # Configuration
///
/// [`new`](Self::new) makes a backend with the defaults; the setters
/// ([`max_keys`](Self::max_keys), [`shards`](Self::shards),
/// [`tokio_clock`](Self::tokio_clock)) each make it anew, empty, with their
/// change. Chain them where the backend is made, before it is used or
/// cloned: a clone made before a setter keeps the backend it was, with its
/// own counters.
///
/// ```
/// use tower_pinned_window::backend::MemoryBackend;
///
/// let store = MemoryBackend::new().max_keys(10_000).shards(4);
/// assert_eq!(store.capacity(), 10_000);
/// assert_eq!(store.shard_count(), 4);
/// // A small cap is not cut into slivers: 1,000 keys make one shard.
/// assert_eq!(MemoryBackend::new().max_keys(1_000).shard_count(), 1);
/// ```
///
/// # Time
///
/// Windows are measured on a monotonic clock (the processor's time-stamp counter); a test on
/// a paused tokio runtime builds the backend with
/// [`tokio_clock`](MemoryBackend::tokio_clock) and moves windows with
/// `tokio::time::advance`.
///
/// ```
/// use std::num::NonZeroU32;
/// use tower_pinned_window::Quota;
/// use tower_pinned_window::backend::{Backend, Counter, MemoryBackend};
/// use tower_pinned_window::key::Key;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryBackend::new();
/// assert!(store.is_empty());
/// let quota = Quota::per_minute(NonZeroU32::new(2).unwrap());
/// let counters = [Counter { namespace: "login", quota, lowers: false }];
/// let key = Key::new("alice");
/// let counts: Vec<u64> = [
///     store.hit_all(&key, &counters).await.unwrap()[0].count,
///     store.hit_all(&key, &counters).await.unwrap()[0].count,
///     store.hit_all(&key, &counters).await.unwrap()[0].count,
/// ]
/// .into();
/// // The third hit is over the limit of 2: the layer would deny it.
/// assert_eq!(counts, [1, 2, 3]);
/// assert_eq!(store.len(), 1);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Each counter's count, until its window's deadline.
    table: Table<AtomicU64>,
    /// Each lockout, until its end: a table of its own, so a lockout never
    /// meets a counter. It is `table`'s sibling, named by `table`'s ids: a
    /// counter's lockout has the counter's hash and is in the shard of the
    /// same index, so a spend hashes the key once, and a lockout is only
    /// ever added under the write lock of its counter's shard (see
    /// `spend.rs`).
    locks: Table<()>,
    /// The deadline of the last live counter a reset or a clear removed: a
    /// window opened at the same instant gets a deadline a nanosecond
    /// earlier, so that a refund or an amend meant for the removed window
    /// never lands on the new one (a paused test clock can open both in one
    /// instant).
    removed: AtomicU64,
    /// The slots of requests in flight ([`Leasing`]), apart from every
    /// counter.
    slots: lease::Slots,
    /// The limits held here ([`Limits`]), per layer: apart from every
    /// counter, never counted against `max_keys`.
    limits: std::sync::Mutex<std::collections::HashMap<Box<str>, StoredLimits>>,
    /// What it was made with, for a setter to make it anew.
    config: Config,
    clock: Clock,
}

/// How a backend is made: what its setters change.
#[derive(Debug, Clone, Copy)]
struct Config {
    max_keys: usize,
    /// The most shards, a power of two.
    shards: usize,
    tokio_clock: bool,
}

impl Default for Config {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, NonZeroUsize::get);
        Self {
            max_keys: DEFAULT_MAX_KEYS,
            shards: (cores * 4).next_power_of_two().clamp(16, 256),
            tokio_clock: false,
        }
    }
}

impl Config {
    fn build(self) -> MemoryBackend {
        let table = Table::new(self.max_keys, self.shards, MIN_KEYS_PER_SHARD);
        MemoryBackend {
            inner: Arc::new(Inner {
                locks: table.sibling(),
                table,
                removed: AtomicU64::new(0),
                slots: lease::Slots::new(),
                limits: std::sync::Mutex::default(),
                config: self,
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
    /// A backend holding at most [`DEFAULT_MAX_KEYS`] live keys, in four
    /// shards per core (16 to 256), on the processor's clock: the setters
    /// below change these (see the [type's example](Self)).
    #[must_use]
    pub fn new() -> Self {
        Config::default().build()
    }

    /// This backend made anew with `change` to its configuration (see
    /// [configuration](Self#configuration)).
    fn with(self, change: impl FnOnce(&mut Config)) -> Self {
        let mut config = self.inner.config;
        change(&mut config);
        config.build()
    }

    /// The most live keys held at once (default [`DEFAULT_MAX_KEYS`]); new
    /// keys past it are refused with [`BackendError::AtCapacity`] until old
    /// windows close. See [bounded memory](Self#bounded-memory) for what is
    /// guaranteed about refusing before the cap, and
    /// [configuration](Self#configuration)'s example.
    ///
    /// # Panics
    /// When `max_keys` is zero. Use [`try_max_keys`](Self::try_max_keys) for a
    /// value read from configuration.
    #[track_caller]
    #[must_use]
    pub fn max_keys(self, max_keys: usize) -> Self {
        match self.try_max_keys(max_keys) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`max_keys`](Self::max_keys), for a value known only at run time.
    ///
    /// ```
    /// use tower_pinned_window::backend::MemoryBackend;
    /// use tower_pinned_window::ConfigError;
    ///
    /// let from_config = "0".parse::<usize>().unwrap();
    /// let refused = MemoryBackend::new().try_max_keys(from_config);
    /// assert_eq!(refused.err(), Some(ConfigError::ZeroCapacity));
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] for zero.
    pub fn try_max_keys(self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        Ok(self.with(|config| config.max_keys = max_keys))
    }

    /// How many independently locked shards, rounded up to a power of two
    /// (default: four per core, 16 to 256). This is the most the backend
    /// uses: it uses fewer when [`max_keys`](Self::max_keys) would give a
    /// shard fewer than 1,024 keys (one shard below 2,048 keys), and
    /// [`shard_count`](Self::shard_count) says how many it has (see
    /// [configuration](Self#configuration)'s example).
    ///
    /// # Panics
    /// When `shards` is zero or above [`MAX_SHARDS`]. Use
    /// [`try_shards`](Self::try_shards) for a value read from configuration.
    #[track_caller]
    #[must_use]
    pub fn shards(self, shards: usize) -> Self {
        match self.try_shards(shards) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`shards`](Self::shards), for a value known only at run time.
    ///
    /// ```
    /// use tower_pinned_window::backend::{MAX_SHARDS, MemoryBackend};
    /// use tower_pinned_window::ConfigError;
    ///
    /// let too_many = MemoryBackend::new().try_shards(MAX_SHARDS + 1);
    /// assert_eq!(too_many.err(), Some(ConfigError::InvalidShards(MAX_SHARDS + 1)));
    /// // Rounded up to a power of two.
    /// let store = MemoryBackend::new().try_shards(3).unwrap();
    /// assert_eq!(store.shard_count(), 4);
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::InvalidShards`] for zero or more than [`MAX_SHARDS`].
    pub fn try_shards(self, shards: usize) -> Result<Self, ConfigError> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(ConfigError::InvalidShards(shards));
        }
        Ok(self.with(|config| config.shards = shards.next_power_of_two()))
    }

    /// Read tokio's clock instead of the default the processor's time-stamp counter, so that
    /// `tokio::time::pause` and `tokio::time::advance` move the windows
    /// (for tests; it costs about 8 ns more per hit).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use tower_pinned_window::Quota;
    /// use tower_pinned_window::backend::{Backend, Counter, MemoryBackend};
    /// use tower_pinned_window::key::Key;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let store = MemoryBackend::new().tokio_clock();
    /// let quota = Quota::per_minute(NonZeroU32::new(5).unwrap());
    /// let counters = [Counter { namespace: "api", quota, lowers: false }];
    /// let key = Key::new("203.0.113.7");
    /// assert_eq!(store.hit_all(&key, &counters).await.unwrap()[0].count, 1);
    /// tokio::time::advance(Duration::from_secs(61)).await;
    /// // The paused clock moved past the window: a new one opens.
    /// assert_eq!(store.hit_all(&key, &counters).await.unwrap()[0].count, 1);
    /// # }
    /// ```
    #[must_use]
    pub fn tokio_clock(self) -> Self {
        self.with(|config| config.tokio_clock = true)
    }

    /// Live and expired-but-unswept counters held now (see the
    /// [type's example](Self)).
    pub fn len(&self) -> usize {
        self.inner.table.len()
    }

    /// Whether no counter is held (see the [type's example](Self)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most live keys this backend holds: exactly what
    /// [`max_keys`](Self::max_keys) was given (see
    /// [configuration](Self#configuration)'s example).
    pub fn capacity(&self) -> usize {
        self.inner.config.max_keys
    }

    /// How many shards the backend has (see [`shards`](Self::shards) and
    /// [configuration](Self#configuration)'s example).
    pub fn shard_count(&self) -> usize {
        self.inner.table.shards()
    }

    fn now(&self) -> u64 {
        self.inner.clock.now()
    }

    /// The hit itself, at time `now` (nanoseconds since the epoch). Inlined
    /// into its caller, which builds the `Hit` from the two words
    /// [`count_at`](Self::count_at) returns in registers.
    #[inline]
    pub(crate) fn hit_at(
        &self,
        now: u64,
        namespace: &str,
        key: &Key,
        window: Window,
    ) -> Result<Hit, BackendError> {
        match self.count_at(now, namespace, key, window) {
            Some(counted) => Ok(counted.hit(now)),
            None => Err(BackendError::AtCapacity),
        }
    }

    /// The hit, as its count and deadline; `None` for a new counter refused
    /// because the shard is full. Two words, returned in registers: the
    /// caller builds the [`Hit`] where it is used. (Built here and returned
    /// through memory, it was written field by field and read back by the
    /// caller in wider loads, which some processors cannot forward from
    /// narrower stores: a stall on every hit.)
    #[inline(never)]
    fn count_at(
        &self,
        now: u64,
        namespace: &str,
        key: &Key,
        window: Window,
    ) -> Option<CountAndDeadline> {
        let table = &self.inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        // A live counter takes the hit under the read lock, so hits on a
        // shard (and on one key) from several threads don't wait for each
        // other: the deadline can't change while the lock is held, and the
        // count is one atomic increment.
        let live = {
            let slots = shard.read();
            match slots.find(hash, &id) {
                Some(entry) if entry.deadline() > now => Some(CountAndDeadline::take(entry)),
                _ => None,
            }
        };
        match live {
            Some(counted) => Some(counted),
            None => self.open_or_count(now, id, hash, shard, window),
        }
    }

    /// [`hit_all`](Backend::hit_all) on several counters.
    fn hit_many(
        &self,
        now: u64,
        key: &Key,
        counters: &[Counter<'_>],
    ) -> Result<Hits, BackendError> {
        let hit = |counter: &Counter<'_>| {
            self.hit_at(now, counter.namespace, key, counter.quota.window())
        };
        match counters {
            // Two quotas (`also`), built in place.
            [first, second] => Ok(Hits::two(hit(first)?, hit(second)?)),
            _ => counters.iter().map(hit).collect(),
        }
    }

    /// A hit that found no live counter under the read lock: a new counter,
    /// or a window to open again, under the write lock, looking again
    /// (another thread may have done it meanwhile). Kept out of
    /// [`hit_at`](Self::hit_at), so the hit on a live counter compiles small
    /// and stays so when unrelated code changes the compiler's inlining.
    /// `cold` only lays it out of the way: new counters are common, but
    /// the write lock and the insert cost far more than the call.
    /// `None`: a new counter, refused because the shard is full of live
    /// ones.
    #[cold]
    #[inline(never)]
    fn open_or_count(
        &self,
        now: u64,
        id: Id<'_>,
        hash: u64,
        shard: &Shard<AtomicU64>,
        window: Window,
    ) -> Option<CountAndDeadline> {
        // The deadline of a window this hit opens, from the same `now`; it
        // is only ever written into a counter this hit creates or restarts,
        // and only computed then. Window::MAX is 3.2e18 ns, so the product
        // cannot overflow.
        let opened = || self.opened(now, window);
        let mut slots = self.inner.table.write(shard);
        if let Some(mut entry) = slots.find(hash, &id) {
            if entry.get().deadline() > now {
                return Some(CountAndDeadline::take(entry.get()));
            }
            // The old window closed: this hit opens a new one.
            let deadline = opened();
            *entry.value_mut().get_mut() = 1;
            entry.set_deadline(deadline);
            return Some(CountAndDeadline::first(deadline));
        }
        if !slots.has_room(now) {
            return None;
        }
        let deadline = opened();
        slots.insert(hash, id, Entry::new(deadline, AtomicU64::new(1)));
        Some(CountAndDeadline::first(deadline))
    }

    /// The deadline of a window opened at `now`: `window` later, or a
    /// nanosecond earlier when that is the deadline of the window a reset
    /// just removed (see [`Inner::removed`]).
    fn opened(&self, now: u64, window: Window) -> u64 {
        let deadline = now.saturating_add(window.as_millis() * 1_000_000);
        if deadline == self.inner.removed.load(Ordering::Relaxed) {
            deadline - 1
        } else {
            deadline
        }
    }

    /// A live counter closing at `deadline` was removed.
    fn note_removed(&self, deadline: u64) {
        self.inner.removed.store(deadline, Ordering::Relaxed);
    }

    /// Each of `counters` as it stands, uncounted (`deadline` `None`); a
    /// missing one at 0 with its full window: what a `take_all` refused by
    /// its cap answers.
    fn read_at(&self, now: u64, key: &Key, counters: &[Counter<'_>]) -> Hits {
        counters
            .iter()
            .map(|counter| {
                let hit = self.peek_at(now, counter.namespace, key);
                Hit {
                    count: hit.map_or(0, |hit| hit.count),
                    reset: hit.map_or(counter.quota.window().as_duration(), |hit| hit.reset),
                    deadline: None,
                }
            })
            .collect()
    }

    fn peek_at(&self, now: u64, namespace: &str, key: &Key) -> Option<Hit> {
        let table = &self.inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        shard
            .read()
            .find(hash, &id)
            .filter(|e| e.deadline() > now)
            .map(|e| Hit {
                count: e.value.load(Ordering::Relaxed),
                reset: Duration::from_nanos(e.deadline() - now),
                deadline: None,
            })
    }

    /// The refund itself, at time `now`: one less on the counter, if it is
    /// still the window that closes at `deadline` and above zero.
    fn refund_at(&self, now: u64, namespace: &str, key: &Key, deadline: u64) -> bool {
        let table = &self.inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        let mut slots = table.write(shard);
        match slots.find(hash, &id) {
            // An expired entry not yet swept has the same deadline: the
            // window closed, so it is left alone like a missing one.
            Some(mut entry)
                if entry.get().deadline() == deadline
                    && deadline > now
                    && entry.get().value.load(Ordering::Relaxed) > 0 =>
            {
                *entry.value_mut().get_mut() -= 1;
                true
            }
            _ => false,
        }
    }

    fn remove_at(&self, now: u64, namespace: &str, key: &Key) -> bool {
        let table = &self.inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        let removed = table
            .write(shard)
            .remove(hash, &id)
            .filter(|entry| entry.deadline() > now);
        if let Some(entry) = &removed {
            self.note_removed(entry.deadline());
        }
        let unlocked = self.unlock_at(now, namespace, key);
        removed.is_some() || unlocked
    }
}

/// A counter's count just after a hit, and the deadline of the window it
/// counts in: two words, so that a function returns it in registers
/// (`None` for a refused new counter fits in the same two).
#[derive(Debug, Clone, Copy)]
struct CountAndDeadline {
    count: NonZeroU64,
    /// Nanoseconds since the backend's epoch.
    deadline: u64,
}

impl CountAndDeadline {
    /// One more hit on the live counter `entry` (`deadline > now`), under
    /// either lock: the count goes up by one atomically, saturating (a
    /// count never wraps to a small number).
    #[inline(always)]
    fn take(entry: &Entry<AtomicU64>) -> Self {
        let count = match entry
            .value
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
        {
            Ok(old) => NonZeroU64::MIN.saturating_add(old),
            Err(_) => NonZeroU64::MAX,
        };
        Self {
            count,
            deadline: entry.deadline(),
        }
    }

    /// The hit that opened the window closing at `deadline`.
    fn first(deadline: u64) -> Self {
        Self {
            count: NonZeroU64::MIN,
            deadline,
        }
    }

    /// The [`Hit`] this is at time `now`.
    #[inline]
    fn hit(self, now: u64) -> Hit {
        Hit {
            count: self.count.get(),
            reset: Duration::from_nanos(self.deadline - now),
            deadline: NonZeroU64::new(self.deadline),
        }
    }
}

impl Backend for MemoryBackend {
    type Future = Ready<Result<Hits, BackendError>>;
    type Refund = Ready<Result<bool, BackendError>>;

    // Inlined where the layer (or any caller) is compiled, so the one
    // counter's `Hit` is built in the caller's frame from the two words
    // `count_at` returns in registers.
    #[inline]
    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
        let now = self.now();
        if let [counter] = counters {
            // The common case, without the loop.
            return ready(
                self.hit_at(now, counter.namespace, key, counter.quota.window())
                    .map(Hits::one),
            );
        }
        ready(self.hit_many(now, key, counters))
    }

    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
        let refunded = hit
            .deadline
            .is_some_and(|deadline| self.refund_at(self.now(), namespace, key, deadline.get()));
        ready(Ok(refunded))
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        Ok(self.peek_at(self.now(), namespace, key))
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        Ok(self.remove_at(self.now(), namespace, key))
    }
}

impl Spending for MemoryBackend {
    #[inline]
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Self::Future {
        let now = self.now();
        if let [counter] = counters {
            // The common case, without the general spend's vectors and
            // ordered locks.
            return ready(self.spend_one(now, key, counter, spend).map(Hits::one));
        }
        ready(self.spend_at(now, key, counters, spend))
    }

    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Self::Refund {
        let amended = hit.deadline.is_some_and(|deadline| {
            self.amend_at(self.now(), namespace, key, deadline.get(), amend)
        });
        ready(Ok(amended))
    }
}

/// Exact in this process: each step is one atomic step under the write lock
/// of the counter's shard (and, for a close, of its lockout's shard after
/// it), the locks a spend that creates a counter or a lockout takes (see
/// [the provider's word](super#the-providers-word)). A lockout or a counter
/// refused because its shard is full of live ones is
/// [`BackendError::AtCapacity`], and nothing changes.
impl Heeding for MemoryBackend {
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<> {
        ready(self.close_at(self.now(), namespace, key, span))
    }

    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<> {
        ready(self.raise_at(self.now(), key, &counter, count, within))
    }
}

/// Exact in this process: each step is one lock of the key's shard of the
/// slot map (see [requests in flight](super#requests-in-flight)). A slot's
/// lease runs on the backend's clock, so a test on a paused runtime
/// ([`tokio_clock`](MemoryBackend::tokio_clock)) moves leases with
/// `tokio::time::advance`.
/// Limits in this process: exact, and read by every layer on this backend.
impl Limits for MemoryBackend {
    fn set_limit(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Option<Quota>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'static {
        let mut limits = self
            .inner
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        limits.entry(layer.into()).or_default().set(scope, quota);
        ready(Ok(()))
    }

    fn limits(
        &self,
        layer: &str,
    ) -> impl Future<Output = Result<StoredLimits, BackendError>> + Send + 'static {
        let limits = self
            .inner
            .limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ready(Ok(limits.get(layer).cloned().unwrap_or_default()))
    }
}

impl Leasing for MemoryBackend {
    type Take = Ready<Result<Taken, BackendError>>;

    fn take(&self, key: &Key, cap: Cap<'_>, slot: SlotId) -> Self::Take {
        ready(Ok(self.inner.slots.take(self.now(), key, cap, slot)))
    }

    fn take_all(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<Spend>,
    ) -> Self::Future {
        let now = self.now();
        // The key's slots stay locked while its counters are counted: no
        // other step on the key's slots comes in between.
        let step = self.inner.slots.take_with(now, key, cap, slot, |count| {
            if !count {
                return Ok((self.read_at(now, key, counters), false));
            }
            let hits = match spend {
                None => self.hit_many(now, key, counters)?,
                Some(spend) => self.spend_at(now, key, counters, spend)?,
            };
            let admitted = hits
                .iter()
                .zip(counters)
                .all(|(hit, counter)| hit.count <= counter.quota.limit());
            Ok((hits, admitted))
        });
        ready(step.map(|(taken, hits)| hits.with_taken(taken)))
    }

    fn give_back(
        &self,
        namespace: &str,
        key: &Key,
        slot: SlotId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static + use<> {
        ready(Ok(self.inner.slots.give_back(namespace, key, slot)))
    }

    /// At once, in this process: no future to box.
    fn release(&self, namespace: &str, key: &Key, slot: SlotId) {
        self.inner.slots.give_back(namespace, key, slot);
    }

    fn extend(
        &self,
        held: &[Held<'_>],
        lease: Window,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send + 'static + use<> {
        ready(Ok(self.inner.slots.extend(self.now(), held, lease)))
    }

    fn in_use(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send {
        ready(Ok(self.inner.slots.in_use(self.now(), namespace, key)))
    }
}

#[cfg(test)]
mod tests;
