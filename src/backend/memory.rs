//! The in-memory backend: counters in this process, bounded, sharded.

use std::future::{Ready, ready};
use std::hash::{BuildHasher, Hasher};
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;
use tokio::time::Instant;

use super::{Backend, BackendError, Counter, Hit, Hits};
use crate::error::ConfigError;
use crate::key::{Key, MAX_KEY_LEN};
#[cfg(test)]
use crate::quota::Quota;
use crate::quota::Window;

/// Live keys held by default before new keys are refused.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The most shards a backend may be built with.
pub const MAX_SHARDS: usize = 1 << 16;

/// A shard is swept of expired counters at least once each time it doubles.
const MIN_SWEEP_LEN: usize = 64;

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
///   under 2,048, or [`shards(1)`](MemoryBackendBuilder::shards)) holds
///   exactly `n` before its first refusal.
///
/// [`max_keys(n)`]: MemoryBackendBuilder::max_keys
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
    shards: Box<[RwLock<Shard>]>,
    shard_bits: u32,
    max_keys: usize,
    clock: Clock,
    names: Names,
}

/// Namespaces that get a short id, and so 32-byte slots: the first
/// [`SHORT_NAMES`] a backend sees, each at the place it was given. A place
/// once given never changes, so whether a namespace has a short id, and
/// which, is the same for the backend's whole life, and a counter is always
/// looked for in the table it was put in.
#[derive(Debug, Default)]
struct Names {
    ids: [OnceLock<Box<str>>; SHORT_NAMES],
    /// Held while a namespace is given a place, so two threads seeing a new
    /// namespace at once give it one place, not two.
    adding: Mutex<()>,
}

/// How many namespaces get a short id: four bits of a short counter's tag.
const SHORT_NAMES: usize = 16;

/// The longest key a short counter holds: fifteen bytes, beside its
/// one-byte tag, in one 16-byte word.
const SHORT_KEY: usize = 15;

/// What [`Names::find`] found for a namespace.
enum Place<'a> {
    Given(u8),
    /// The first free place, and its id.
    Free(u8, &'a OnceLock<Box<str>>),
    /// Every place is given to another namespace.
    Full,
}

impl Names {
    /// `namespace`'s short id, given now if it is new and a place is free.
    #[inline(always)]
    fn id(&self, namespace: &str) -> Option<u8> {
        match self.find(namespace) {
            Place::Given(id) => Some(id),
            Place::Free(..) => self.add(namespace),
            Place::Full => None,
        }
    }

    /// The namespace's place, or the first free one: places are given in
    /// order and never taken back, so none is given past a free one.
    #[inline(always)]
    fn find(&self, namespace: &str) -> Place<'_> {
        for (id, slot) in (0u8..).zip(&self.ids) {
            match slot.get() {
                Some(name) if eq_short(name.as_bytes(), namespace.as_bytes()) => {
                    return Place::Given(id);
                }
                Some(_) => {}
                None => return Place::Free(id, slot),
            }
        }
        Place::Full
    }

    /// Gives `namespace` the first free place, unless another thread has
    /// given it one meanwhile. A namespace longer than a key may be is held
    /// hashed, in a long slot, and never gets a place.
    #[cold]
    #[inline(never)]
    fn add(&self, namespace: &str) -> Option<u8> {
        if namespace.len() > MAX_KEY_LEN {
            return None;
        }
        let _adding = self.adding.lock().unwrap_or_else(PoisonError::into_inner);
        match self.find(namespace) {
            Place::Given(id) => Some(id),
            Place::Free(id, slot) => {
                // Only ever set here, under the lock.
                let _ = slot.set(namespace.into());
                Some(id)
            }
            Place::Full => None,
        }
    }
}

/// The clock a [`MemoryBackend`] reads on every hit.
#[derive(Debug, Clone, Copy)]
enum Clock {
    /// The processor's time-stamp counter through [`quanta`], calibrated
    /// against the OS's monotonic clock: about half the cost of
    /// [`std::time::Instant::now`] (the default). The backend reads the
    /// counter itself and scales only the difference from its epoch, so a
    /// hit pays neither quanta's thread-local override check nor a
    /// `Duration`'s division.
    Quanta {
        clock: &'static quanta::Clock,
        /// The counter's raw value when the backend was made.
        epoch: u64,
    },
    /// tokio's clock: `tokio::time::pause` and `tokio::time::advance`
    /// move the windows, so tests need not sleep.
    Tokio(Instant),
}

/// One calibrated clock for every backend of the process: calibrating takes
/// a while, so it is done once, when the first backend is built.
fn tsc_clock() -> &'static quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

impl Clock {
    fn quanta() -> Self {
        let clock = tsc_clock();
        Self::Quanta {
            clock,
            epoch: clock.raw(),
        }
    }

    fn tokio() -> Self {
        Self::Tokio(Instant::now())
    }

    /// Nanoseconds since this clock was made (0 for a reading before it).
    #[inline(always)]
    fn now(&self) -> u64 {
        match *self {
            Self::Quanta { clock, epoch } => clock.delta_as_nanos(epoch, clock.raw()),
            Self::Tokio(epoch) => nanos(Instant::now().saturating_duration_since(epoch)),
        }
    }
}

#[derive(Debug)]
struct Shard {
    /// Counters with a short id (see [`Names`] and [`SHORT_KEY`]).
    short: HashTable<ShortEntry>,
    /// Every other counter.
    long: HashTable<LongEntry>,
    /// The most live counters this shard holds: its exact share of
    /// `max_keys`.
    cap: usize,
    /// Sweep when the table reaches this length.
    sweep_at: usize,
    /// No entry expires before this (nanoseconds since the epoch).
    min_deadline: u64,
}

/// A counter's window: its count and when it closes.
#[derive(Debug)]
struct Cell {
    /// Incremented under the shard's read lock (a hit on a live counter);
    /// every other change, and `deadline`, under its write lock.
    count: AtomicU64,
    /// Nanoseconds since the backend's epoch.
    deadline: u64,
}

/// A counter with a short id: 32 bytes, aligned to 32, so two share a
/// cache line and none straddles two. Over 100k keys the table is half the
/// size it would be with 64-byte slots, and the difference decides how
/// often a hit waits on memory.
#[derive(Debug)]
#[repr(align(32))]
struct ShortEntry {
    /// The tag (the namespace's short id, then the key's length, four bits
    /// each) in the low byte, then the key, zero-padded.
    id: u128,
    cell: Cell,
}

/// Any other counter: 64 bytes, aligned to 64, so the table holds each
/// entry in one cache line: a hit on a key that is not in cache misses
/// once for its entry, not twice.
#[derive(Debug)]
#[repr(align(64))]
struct LongEntry {
    id: StoredId,
    cell: Cell,
}

const _: () = assert!(
    std::mem::size_of::<ShortEntry>() == 32 && std::mem::size_of::<LongEntry>() == 64,
    "a short entry is half a cache line, a long one a whole line"
);

/// The most bytes of an id held inline: namespace and key together up to
/// 38 bytes (a layer's name and an IP address fit).
const INLINE_ID: usize = 40;

/// A counter's identity as stored. Which form an id takes depends only on
/// its namespace's and key's lengths, so two ids of different forms are
/// never equal.
#[derive(Debug)]
enum StoredId {
    /// `[namespace length][key length][key][namespace]`, zero-padded to
    /// [`INLINE_ID`] bytes: the lengths make the padding unambiguous, so
    /// two ids are equal exactly when their arrays are, and a lookup
    /// compares and hashes a fixed 40 bytes.
    Inline([u8; INLINE_ID]),
    /// `[namespace length][namespace][key]`, for longer ids.
    Heap(Box<[u8]>),
}

/// A counter's identity as a lookup sees it: a short id, in one word; the
/// inline form built on the stack; or the two parts of a longer id,
/// borrowed.
#[derive(Clone, Copy)]
enum Id<'a> {
    /// [`ShortEntry::id`]'s form. Its tag makes it unambiguous: the
    /// namespace's place in [`Names`] names the namespace, and the length
    /// tells the key from its zero padding.
    Short(ShortId<'a>),
    /// The inline form, and the parts it was built from (hashed as they
    /// are: see [`hash_parts`]).
    Inline {
        id: &'a [u8; INLINE_ID],
        namespace: &'a [u8],
        key: &'a [u8],
    },
    Parts {
        namespace: &'a [u8],
        key: &'a [u8],
    },
}

impl<'a> Id<'a> {
    /// A short id when the key has at most [`SHORT_KEY`] bytes and `names`
    /// has (or now gives) the namespace a place; otherwise a long id:
    /// `hashed` holds the namespace's hashed form if it is longer than a
    /// key may be (a layer's name never is), and `inline`, all zeros,
    /// receives the inline form.
    #[inline(always)]
    fn new(
        names: &Names,
        namespace: &'a str,
        key: &'a Key,
        hashed: &'a mut Option<Key>,
        inline: &'a mut [u8; INLINE_ID],
    ) -> Self {
        let len = key.as_bytes().len();
        if len <= SHORT_KEY
            && let Some(name) = names.id(namespace)
        {
            let padded = key.padded()[..16].try_into().expect("16 bytes");
            let tag = (name << 4) | len as u8;
            let key = key.as_bytes();
            return Self::Short(ShortId { padded, tag, key });
        }
        let namespace = if namespace.len() <= MAX_KEY_LEN {
            namespace.as_bytes()
        } else {
            hashed.insert(Key::new(namespace)).as_bytes()
        };
        let padded = key.padded();
        let key = key.as_bytes();
        let (n, k) = (namespace.len(), key.len());
        if 2 + n + k > INLINE_ID {
            return Self::Parts { namespace, key };
        }
        let id = inline;
        // Both lengths are at most MAX_KEY_LEN + 1, well within a byte.
        id[0] = n as u8;
        id[1] = k as u8;
        // A fixed-size copy of the key and its zero padding, then the
        // namespace over the padding, in fixed-size pieces.
        id[2..].copy_from_slice(&padded[..INLINE_ID - 2]);
        copy_short(&mut id[2 + k..2 + k + n], namespace);
        Self::Inline { id, namespace, key }
    }

    /// Whether a long entry is this counter's (never, for a short id).
    #[inline(always)]
    fn matches(&self, entry: &LongEntry) -> bool {
        match (self, &entry.id) {
            (Self::Inline { id, .. }, StoredId::Inline(other)) => inline_eq(id, other),
            (Self::Parts { namespace, key }, StoredId::Heap(other)) => {
                let (other_namespace, other_key) = split(other);
                key == &other_key && namespace == &other_namespace
            }
            _ => false,
        }
    }

    #[inline(always)]
    fn hash(&self, hasher: &DefaultHashBuilder) -> u64 {
        match self {
            Self::Short(short) => hash_short(hasher, short.tag, short.key),
            Self::Inline { namespace, key, .. } | Self::Parts { namespace, key } => {
                hash_parts(hasher, namespace, key)
            }
        }
    }

    /// The stored form of a long id.
    fn to_owned(self) -> StoredId {
        match self {
            Self::Short(_) => unreachable!("a short id is stored as its word"),
            Self::Inline { id, .. } => StoredId::Inline(*id),
            Self::Parts { namespace, key } => {
                let mut id = Vec::with_capacity(1 + namespace.len() + key.len());
                id.push(namespace.len() as u8);
                id.extend_from_slice(namespace);
                id.extend_from_slice(key);
                StoredId::Heap(id.into())
            }
        }
    }
}

/// A short id as a lookup sees it: the parts of [`ShortEntry::id`].
#[derive(Clone, Copy)]
struct ShortId<'a> {
    /// The key's first 16 bytes: past its length they are zeros (see
    /// `Key::padded`).
    padded: &'a [u8; 16],
    /// The id's low byte: the namespace's place in [`Names`], then the
    /// key's length.
    tag: u8,
    /// The key, hashed as it is (see [`hash_short`]).
    key: &'a [u8],
}

impl ShortId<'_> {
    /// The id's word: the tag, then the key's first 15 bytes (the shift
    /// drops the 16th, a zero). Built where an entry is compared, not
    /// before: the key's bytes were written a moment ago a few at a time,
    /// and a processor that cannot forward those small stores into this one
    /// wide load (AMD's Zen 4, for one) makes it wait until they reach the
    /// cache. Built up front, the hash and the lock waited behind it (about
    /// 48 ns a hit over 100k keys, against 31 ns built here).
    #[inline(always)]
    fn word(&self) -> u128 {
        (u128::from_le_bytes(*self.padded) << 8) | u128::from(self.tag)
    }
}

/// `a == b` for the few bytes of a namespace, in fixed-size (possibly
/// overlapping) pieces rather than a call to `memcmp`, the way
/// [`copy_short`] copies them: every piece compares bytes at the same place
/// in both.
#[inline(always)]
fn eq_short(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if b.len() != n {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    let half = |s: &[u8], at: usize| u32::from_ne_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if word(a, at) != word(b, at) {
                return false;
            }
            at += 8;
        }
        word(a, n - 8) == word(b, n - 8)
    } else if n >= 4 {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        n == 0 || (a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1])
    }
}

/// `to.copy_from_slice(from)` for the few bytes of a namespace, in
/// fixed-size (possibly overlapping) pieces rather than a call to `memcpy`:
/// every piece writes bytes of `from` at their own place, so the overlaps
/// write the same bytes twice.
#[inline(always)]
fn copy_short(to: &mut [u8], from: &[u8]) {
    let n = from.len();
    debug_assert_eq!(to.len(), n);
    if n >= 16 {
        let mut at = 0;
        while at + 8 < n {
            to[at..at + 8].copy_from_slice(&from[at..at + 8]);
            at += 8;
        }
        to[n - 8..].copy_from_slice(&from[n - 8..]);
    } else if n >= 8 {
        to[..8].copy_from_slice(&from[..8]);
        to[n - 8..].copy_from_slice(&from[n - 8..]);
    } else if n >= 4 {
        to[..4].copy_from_slice(&from[..4]);
        to[n - 4..].copy_from_slice(&from[n - 4..]);
    } else if n > 0 {
        to[0] = from[0];
        to[n / 2] = from[n / 2];
        to[n - 1] = from[n - 1];
    }
}

/// A long id's namespace and key.
fn split(id: &[u8]) -> (&[u8], &[u8]) {
    let len = usize::from(id[0]);
    (&id[1..=len], &id[1 + len..])
}

/// Whether two inline ids are equal: five word comparisons, without a
/// call to `memcmp`.
#[inline(always)]
fn inline_eq(a: &[u8; INLINE_ID], b: &[u8; INLINE_ID]) -> bool {
    let word = |id: &[u8; INLINE_ID], i: usize| {
        u64::from_ne_bytes(id[8 * i..8 * i + 8].try_into().expect("8 bytes"))
    };
    (0..INLINE_ID / 8).fold(0, |diff, i| diff | (word(a, i) ^ word(b, i))) == 0
}

/// The hash of a short id, from its tag and its key as they are: hashing
/// the id's word instead would wait for that word (see [`ShortId::word`])
/// before the lookup could start.
#[inline(always)]
fn hash_short(hasher: &DefaultHashBuilder, tag: u8, key: &[u8]) -> u64 {
    let mut state = hasher.build_hasher();
    state.write_u8(tag);
    state.write(key);
    state.finish()
}

/// [`hash_short`] of a stored short id.
fn short_entry_hash(hasher: &DefaultHashBuilder, entry: &ShortEntry) -> u64 {
    let tag = entry.id as u8;
    let key = (entry.id >> 8).to_le_bytes();
    hash_short(hasher, tag, &key[..usize::from(tag & 0xf)])
}

/// The hash of a long counter's identity, whichever form it is stored in. It
/// reads the namespace and the key where they already are: hashing an
/// inline id just built on the stack would read back, in words, bytes that
/// were written a few at a time a moment before, and a processor that
/// cannot forward those small stores into the wider loads (AMD's Zen 4, for
/// one) stalls on each such load.
#[inline(always)]
fn hash_parts(hasher: &DefaultHashBuilder, namespace: &[u8], key: &[u8]) -> u64 {
    // No separator between the two: foldhash turns its state by each
    // write's length before mixing the bytes in, so the same bytes split
    // at another place hash differently.
    let mut state = hasher.build_hasher();
    state.write(namespace);
    state.write(key);
    state.finish()
}

/// Builds a [`MemoryBackend`] with a key cap and shard count of your choice.
///
/// ```
/// use tower_pinned_window::backend::MemoryBackend;
///
/// let store = MemoryBackend::builder().max_keys(10_000).shards(4).build();
/// assert_eq!(store.max_keys(), 10_000);
/// assert_eq!(store.shards(), 4);
/// // A small cap is not cut into slivers: 1,000 keys make one shard.
/// assert_eq!(MemoryBackend::builder().max_keys(1_000).build().shards(), 1);
/// ```
#[derive(Debug, Clone)]
#[must_use]
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
    /// The most live keys held at once (default [`DEFAULT_MAX_KEYS`]); new
    /// keys past it are refused with [`BackendError::AtCapacity`] until old
    /// windows close. See [`MemoryBackend`] for what is guaranteed about
    /// refusing before the cap.
    ///
    /// # Panics
    /// When `max_keys` is zero. Use [`try_max_keys`](Self::try_max_keys) for a
    /// value read from configuration.
    #[track_caller]
    pub fn max_keys(self, max_keys: usize) -> Self {
        match self.try_max_keys(max_keys) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`max_keys`](Self::max_keys), for a value known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] for zero.
    pub fn try_max_keys(mut self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        self.max_keys = max_keys;
        Ok(self)
    }

    /// How many independently locked shards, rounded up to a power of two
    /// (default: four per core, 16 to 256). This is the most the backend
    /// uses: it uses fewer when [`max_keys`](Self::max_keys) would give a
    /// shard fewer than 1,024 keys (one shard below 2,048 keys), and
    /// [`MemoryBackend::shards`] says how many it has.
    ///
    /// # Panics
    /// When `shards` is zero or above [`MAX_SHARDS`]. Use
    /// [`try_shards`](Self::try_shards) for a value read from configuration.
    #[track_caller]
    pub fn shards(self, shards: usize) -> Self {
        match self.try_shards(shards) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`shards`](Self::shards), for a value known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::InvalidShards`] for zero or more than [`MAX_SHARDS`].
    pub fn try_shards(mut self, shards: usize) -> Result<Self, ConfigError> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(ConfigError::InvalidShards(shards));
        }
        self.shards = shards.next_power_of_two();
        Ok(self)
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
        // As many shards as asked, but no shard under MIN_KEYS_PER_SHARD
        // (a power of two, and at least one).
        let fit = (self.max_keys / MIN_KEYS_PER_SHARD).max(1);
        let fit = if fit.is_power_of_two() {
            fit
        } else {
            fit.next_power_of_two() / 2
        };
        let shards = self.shards.min(fit);
        // The exact split: the first `extra` shards hold one key more.
        let (share, extra) = (self.max_keys / shards, self.max_keys % shards);
        MemoryBackend {
            inner: Arc::new(Inner {
                hasher: DefaultHashBuilder::default(),
                shards: (0..shards)
                    .map(|i| {
                        RwLock::new(Shard {
                            short: HashTable::new(),
                            long: HashTable::new(),
                            cap: share + usize::from(i < extra),
                            sweep_at: MIN_SWEEP_LEN,
                            min_deadline: u64::MAX,
                        })
                    })
                    .collect(),
                shard_bits: shards.trailing_zeros(),
                max_keys: self.max_keys,
                clock: if self.tokio_clock {
                    Clock::tokio()
                } else {
                    Clock::quanta()
                },
                names: Names::default(),
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
        self.inner.shards.iter().map(|s| read(s).len()).sum()
    }

    /// Whether no counter is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most live keys this backend holds: exactly what
    /// [`max_keys`](MemoryBackendBuilder::max_keys) was given.
    pub fn max_keys(&self) -> usize {
        self.inner.max_keys
    }

    /// How many shards the backend has (see
    /// [`shards`](MemoryBackendBuilder::shards)).
    pub fn shards(&self) -> usize {
        self.inner.shards.len()
    }

    fn now(&self) -> u64 {
        self.inner.clock.now()
    }

    /// The hash of `id` and its shard.
    #[inline(always)]
    fn locate(&self, id: &Id<'_>) -> (u64, &RwLock<Shard>) {
        let hash = id.hash(&self.inner.hasher);
        (
            hash,
            &self.inner.shards[shard_index(hash, self.inner.shard_bits)],
        )
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
    fn count_at(&self, now: u64, namespace: &str, key: &Key, window: Window) -> Option<Counted> {
        let (mut hashed, mut inline) = (None, [0; INLINE_ID]);
        let id = Id::new(&self.inner.names, namespace, key, &mut hashed, &mut inline);
        let (hash, lock) = self.locate(&id);
        // A live counter takes the hit under the read lock, so hits on a
        // shard (and on one key) from several threads don't wait for each
        // other: the deadline can't change while the lock is held, and the
        // count is one atomic increment.
        let live = {
            let shard = read(lock);
            match shard.find(hash, &id) {
                Some(cell) if cell.deadline > now => Some(cell.take_hit()),
                _ => None,
            }
        };
        match live {
            Some(counted) => Some(counted),
            None => self.open_or_count(now, id, hash, lock, window),
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
        lock: &RwLock<Shard>,
        window: Window,
    ) -> Option<Counted> {
        // The deadline of a window this hit opens, from the same `now`; it
        // is only ever written into a counter this hit creates or restarts,
        // and only computed then. Window::MAX is 3.2e18 ns, so the product
        // cannot overflow.
        let opened = || now.saturating_add(window.as_millis() * 1_000_000);
        let mut shard = write(lock);
        if let Some(cell) = shard.find_mut(hash, &id) {
            if cell.deadline > now {
                return Some(cell.take_hit());
            }
            // The old window closed: this hit opens a new one.
            let deadline = opened();
            *cell.count.get_mut() = 1;
            cell.deadline = deadline;
            shard.min_deadline = shard.min_deadline.min(deadline);
            return Some(Counted::first(deadline));
        }
        let len = shard.len();
        if len >= shard.sweep_at || len >= shard.cap {
            shard.sweep(now, &self.inner.hasher);
            if shard.len() >= shard.cap {
                return None;
            }
        }
        let deadline = opened();
        shard.min_deadline = shard.min_deadline.min(deadline);
        let cell = Cell {
            count: AtomicU64::new(1),
            deadline,
        };
        shard.insert(hash, id, cell, &self.inner.hasher);
        Some(Counted::first(deadline))
    }

    fn peek_at(&self, now: u64, namespace: &str, key: &Key) -> Option<Hit> {
        let (mut hashed, mut inline) = (None, [0; INLINE_ID]);
        let id = Id::new(&self.inner.names, namespace, key, &mut hashed, &mut inline);
        let (hash, lock) = self.locate(&id);
        read(lock)
            .find(hash, &id)
            .filter(|e| e.deadline > now)
            .map(|e| Hit {
                count: e.count.load(Ordering::Relaxed),
                reset: Duration::from_nanos(e.deadline - now),
                deadline: None,
            })
    }

    /// The refund itself, at time `now`: one less on the counter, if it is
    /// still the window that closes at `deadline` and above zero.
    fn refund_at(&self, now: u64, namespace: &str, key: &Key, deadline: u64) -> bool {
        let (mut hashed, mut inline) = (None, [0; INLINE_ID]);
        let id = Id::new(&self.inner.names, namespace, key, &mut hashed, &mut inline);
        let (hash, lock) = self.locate(&id);
        let mut shard = write(lock);
        match shard.find_mut(hash, &id) {
            // An expired entry not yet swept has the same deadline: the
            // window closed, so it is left alone like a missing one.
            Some(cell)
                if cell.deadline == deadline
                    && deadline > now
                    && cell.count.load(Ordering::Relaxed) > 0 =>
            {
                *cell.count.get_mut() -= 1;
                true
            }
            _ => false,
        }
    }

    fn remove_at(&self, now: u64, namespace: &str, key: &Key) -> bool {
        let (mut hashed, mut inline) = (None, [0; INLINE_ID]);
        let id = Id::new(&self.inner.names, namespace, key, &mut hashed, &mut inline);
        let (hash, lock) = self.locate(&id);
        write(lock)
            .remove(hash, &id)
            .is_some_and(|cell| cell.deadline > now)
    }
}

impl Shard {
    /// Counters held, live or expired.
    fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }

    /// The counter `id` names, live or expired, in the table its form
    /// goes to.
    #[inline(always)]
    fn find(&self, hash: u64, id: &Id<'_>) -> Option<&Cell> {
        match id {
            Id::Short(short) => self
                .short
                .find(hash, |e| e.id == short.word())
                .map(|e| &e.cell),
            _ => self.long.find(hash, |e| id.matches(e)).map(|e| &e.cell),
        }
    }

    fn find_mut(&mut self, hash: u64, id: &Id<'_>) -> Option<&mut Cell> {
        match id {
            Id::Short(short) => self
                .short
                .find_mut(hash, |e| e.id == short.word())
                .map(|e| &mut e.cell),
            _ => self
                .long
                .find_mut(hash, |e| id.matches(e))
                .map(|e| &mut e.cell),
        }
    }

    fn remove(&mut self, hash: u64, id: &Id<'_>) -> Option<Cell> {
        match id {
            Id::Short(short) => self
                .short
                .find_entry(hash, |e| e.id == short.word())
                .ok()
                .map(|e| e.remove().0.cell),
            _ => self
                .long
                .find_entry(hash, |e| id.matches(e))
                .ok()
                .map(|e| e.remove().0.cell),
        }
    }

    /// A new counter, which `find` did not find.
    fn insert(&mut self, hash: u64, id: Id<'_>, cell: Cell, hasher: &DefaultHashBuilder) {
        match id {
            Id::Short(short) => {
                let id = short.word();
                self.short
                    .insert_unique(hash, ShortEntry { id, cell }, |e| {
                        short_entry_hash(hasher, e)
                    });
            }
            _ => {
                let entry = LongEntry {
                    id: id.to_owned(),
                    cell,
                };
                self.long
                    .insert_unique(hash, entry, |e| long_hash(hasher, e));
            }
        }
    }

    /// Every counter held, live or expired.
    #[cfg(test)]
    fn cells(&self) -> impl Iterator<Item = &Cell> {
        let short = self.short.iter().map(|e| &e.cell);
        short.chain(self.long.iter().map(|e| &e.cell))
    }

    /// Drop expired counters, unless none can have expired yet (O(1)).
    fn sweep(&mut self, now: u64, hasher: &DefaultHashBuilder) {
        if self.min_deadline > now {
            self.sweep_at = self.sweep_at.max(self.len().saturating_mul(2));
            return;
        }
        let mut min_deadline = u64::MAX;
        let mut live = |cell: &Cell| {
            let live = cell.deadline > now;
            if live {
                min_deadline = min_deadline.min(cell.deadline);
            }
            live
        };
        self.short.retain(|e| live(&e.cell));
        self.long.retain(|e| live(&e.cell));
        self.min_deadline = min_deadline;
        let short = self.short.len();
        if short < self.short.capacity() / 4 {
            self.short
                .shrink_to(short * 2, |e| short_entry_hash(hasher, e));
        }
        let long = self.long.len();
        if long < self.long.capacity() / 4 {
            self.long.shrink_to(long * 2, |e| long_hash(hasher, e));
        }
        self.sweep_at = self.len().saturating_mul(2).max(MIN_SWEEP_LEN);
    }
}

fn long_hash(hasher: &DefaultHashBuilder, entry: &LongEntry) -> u64 {
    match &entry.id {
        StoredId::Inline(id) => {
            let (n, k) = (usize::from(id[0]), usize::from(id[1]));
            hash_parts(hasher, &id[2 + k..2 + k + n], &id[2..2 + k])
        }
        StoredId::Heap(id) => {
            let (namespace, key) = split(id);
            hash_parts(hasher, namespace, key)
        }
    }
}

/// Whole nanoseconds, saturating (without the u128 division of `as_nanos`).
fn nanos(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(duration.subsec_nanos()))
}

/// The shard of `hash` among `1 << bits`: bits 40 and up (at most 16 of
/// them, below bit 57). The hash table inside a shard reads the low bits
/// (where a key goes) and the top 7 (the tag it compares before the key),
/// so the shard's bits take entropy from neither: were the shard read from
/// the top bits, every key of a shard would share most of its tag, and a
/// lookup would compare several keys where it should compare one.
#[inline(always)]
pub(crate) fn shard_index(hash: u64, bits: u32) -> usize {
    ((hash >> 40) & ((1 << bits) - 1)) as usize
}

// A panic while holding a lock cannot leave a half-written counter (every
// write is a single field store), so the data is still sound.
fn read(shard: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    shard
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(shard: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    shard
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Cell {
    /// One more hit on this live counter (`deadline > now`), under either
    /// lock: the count goes up by one atomically, saturating (a count never
    /// wraps to a small number).
    #[inline(always)]
    fn take_hit(&self) -> Counted {
        let count = match self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
        {
            Ok(old) => NonZeroU64::MIN.saturating_add(old),
            Err(_) => NonZeroU64::MAX,
        };
        Counted {
            count,
            deadline: self.deadline,
        }
    }
}

/// A counter after a hit: two words, so that a function returns it in
/// registers (`None` for a refused new counter fits in the same two).
#[derive(Debug, Clone, Copy)]
struct Counted {
    count: NonZeroU64,
    /// Nanoseconds since the backend's epoch.
    deadline: u64,
}

impl Counted {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    fn window(ms: u64) -> Window {
        Window::new(Duration::from_millis(ms)).unwrap()
    }

    /// A hit without its deadline, to compare count and reset.
    fn seen(hit: Hit) -> (u64, Duration) {
        (hit.count, hit.reset)
    }

    #[test]
    fn the_window_stays_pinned_to_the_first_hit() {
        let store = MemoryBackend::new();
        let key = Key::new("alice");
        let w = window(15 * 60 * 1000);
        let min = 60 * 1000 * MS;
        let at = |t: u64| store.hit_at(t, "login", &key, w).unwrap();
        assert_eq!(seen(at(0)), (1, Duration::from_secs(900)));
        assert_eq!(
            seen(at(14 * min)),
            (2, Duration::from_secs(60)),
            "the 14-minute knock does not move the window"
        );
        assert_eq!(at(15 * min - 1).count, 3, "still inside the first window");
        assert_eq!(
            seen(at(15 * min + MS)),
            (1, Duration::from_secs(900)),
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
    fn adversarial_pairs_count_apart() {
        let store = MemoryBackend::new();
        let long = Key::new([b'h'; MAX_KEY_LEN + 1]);
        // More namespaces than get a short id, so some pairs land in each
        // table.
        let more: Vec<String> = (0..SHORT_NAMES).map(|i| format!("a{i}")).collect();
        let names = ["a", "a:b", "api", "api:1/3600000ms", "api:v2", ""]
            .into_iter()
            .chain(more.iter().map(String::as_str));
        let names: Vec<&str> = names.collect();
        let keys = [
            Key::new([0u8; SHORT_KEY - 1]),
            Key::new([0u8; SHORT_KEY]),
            Key::new([0u8; SHORT_KEY + 1]),
            Key::new("a\0"),
            Key::new("a"),
            Key::new("255.255.255.255"),
            Key::new("255.255.255.2550"),
            Key::new("b:c"),
            Key::new("c"),
            Key::new(":c"),
            Key::new("1/3600000ms:v"),
            Key::new("v2:v"),
            Key::new("v"),
            Key::new(""),
            Key::new("{v}"),
            Key::new([0u8]),
            Key::new(&long.as_bytes()[..MAX_KEY_LEN]),
            Key::new(long.as_bytes()),
            long.clone(),
        ];
        for name in &names {
            for key in &keys {
                let hit = store.hit_at(0, name, key, window(1000)).unwrap();
                assert_eq!(hit.count, 1, "{name:?} {key:?} met another counter");
            }
        }
        assert_eq!(store.len(), names.len() * keys.len());
        let (short, long) = store.inner.shards.iter().fold((0, 0), |(s, l), shard| {
            let shard = read(shard);
            (s + shard.short.len(), l + shard.long.len())
        });
        assert!(short > 0 && long > 0, "{short} short, {long} long");
    }

    #[test]
    fn eq_short_compares_every_byte() {
        for n in 0..=MAX_KEY_LEN {
            let a: Vec<u8> = (0..n as u8).collect();
            assert!(eq_short(&a, &a.clone()), "{n} bytes equal");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x80;
                assert!(!eq_short(&a, &b), "{n} bytes, byte {at} differs");
            }
            assert!(
                !eq_short(&a, &[a.as_slice(), &[0]].concat()),
                "{n} and one more"
            );
        }
    }

    #[test]
    fn a_namespace_first_seen_by_several_threads_at_once_is_one_counter() {
        for round in 0..20 {
            let store = MemoryBackend::new();
            let threads = 4;
            let barrier = std::sync::Barrier::new(threads);
            std::thread::scope(|scope| {
                for i in 0..threads {
                    let (store, barrier) = (&store, &barrier);
                    scope.spawn(move || {
                        // Each thread first sees its own namespace, then
                        // all of them race on the shared one.
                        store
                            .hit_at(0, &format!("own{i}"), &Key::new("k"), window(1000))
                            .unwrap();
                        barrier.wait();
                        store
                            .hit_at(0, "shared", &Key::new("k"), window(1000))
                            .unwrap();
                    });
                }
            });
            let shared = store
                .peek_at(0, "shared", &Key::new("k"))
                .map(|hit| hit.count);
            assert_eq!(shared, Some(threads as u64), "round {round}");
            assert_eq!(store.len(), threads + 1, "round {round}");
        }
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
                reset: Duration::from_millis(998),
                deadline: None,
            }),
            "a peek counts nothing, so it names no window to refund"
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
        let store = MemoryBackend::builder().max_keys(100).shards(1).build();
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

    /// Live counters held now (the table may also hold expired ones).
    fn live(store: &MemoryBackend, now: u64) -> usize {
        store
            .inner
            .shards
            .iter()
            .map(|s| read(s).cells().filter(|e| e.deadline > now).count())
            .sum()
    }

    #[test]
    fn max_keys_is_never_exceeded_under_a_flood() {
        let cases = [
            ("17, default shards", MemoryBackend::builder().max_keys(17)),
            (
                "1000, default shards",
                MemoryBackend::builder().max_keys(1000),
            ),
            (
                "1000 asked for 64 shards",
                MemoryBackend::builder().max_keys(1000).shards(64),
            ),
            (
                "5000 over 4 shards",
                MemoryBackend::builder().max_keys(5000).shards(4),
            ),
            (
                "4099 over 4 shards",
                MemoryBackend::builder().max_keys(4099).shards(4),
            ),
            (
                "one shard",
                MemoryBackend::builder().max_keys(300).shards(1),
            ),
        ];
        for (name, builder) in cases {
            let store = builder.build();
            let n = store.max_keys();
            let caps: usize = store.inner.shards.iter().map(|s| read(s).cap).sum();
            assert_eq!(caps, n, "{name}: the shards' caps add up to max_keys");
            let mut held = 0;
            let mut first_refusal = None;
            for i in 0..(20 * n).max(5_000) {
                match store.hit_at(0, "n", &Key::display(i), window(60_000)) {
                    Ok(_) => held += 1,
                    Err(BackendError::AtCapacity) => {
                        first_refusal.get_or_insert(held);
                    }
                    Err(err) => panic!("{name}: {err}"),
                }
                if i % 512 == 0 {
                    assert!(
                        live(&store, 0) <= n,
                        "{name}: {} > {n} after key {i}",
                        live(&store, 0)
                    );
                }
            }
            assert!(live(&store, 0) <= n, "{name}: {} > {n}", live(&store, 0));
            assert_eq!(held, store.len(), "{name}");
            assert!(held <= n, "{name}: held {held} of {n}");
            if store.shards() == 1 {
                assert_eq!(first_refusal, Some(n), "{name}: one shard holds exactly n");
                assert_eq!(held, n, "{name}");
            }
        }
    }

    #[test]
    fn small_caps_get_fewer_shards_never_more_than_asked() {
        let cases: &[(usize, usize, usize)] = &[
            // (max_keys, shards asked, shards used)
            (1, 16, 1),
            (17, 16, 1),
            (1000, 16, 1),
            (2047, 16, 1),
            (2048, 16, 2),
            (5000, 16, 4),
            (1_000_000, 16, 16),
            (1_000_000, 3, 4),
            (1_000_000, 1, 1),
        ];
        for &(max_keys, asked, used) in cases {
            let store = MemoryBackend::builder()
                .max_keys(max_keys)
                .shards(asked)
                .build();
            assert_eq!(store.shards(), used, "max_keys {max_keys}, shards({asked})");
            assert_eq!(store.max_keys(), max_keys);
        }
    }

    #[test]
    fn bad_builder_values_are_errors_or_panics_never_changed() {
        assert_eq!(
            MemoryBackend::builder().try_max_keys(0).err(),
            Some(ConfigError::ZeroCapacity)
        );
        assert_eq!(
            MemoryBackend::builder().try_shards(0).err(),
            Some(ConfigError::InvalidShards(0))
        );
        assert_eq!(
            MemoryBackend::builder().try_shards(MAX_SHARDS + 1).err(),
            Some(ConfigError::InvalidShards(MAX_SHARDS + 1))
        );
        assert!(MemoryBackend::builder().try_shards(MAX_SHARDS).is_ok());
        for (name, result) in [
            (
                "max_keys(0)",
                std::panic::catch_unwind(|| MemoryBackend::builder().max_keys(0)),
            ),
            (
                "shards(0)",
                std::panic::catch_unwind(|| MemoryBackend::builder().shards(0)),
            ),
        ] {
            let message = result.expect_err(name);
            let message = message.downcast_ref::<String>().expect(name);
            assert!(message.contains("must be"), "{name}: {message}");
        }
    }

    #[test]
    fn a_refund_takes_back_one_hit_of_its_own_window_only() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let w = window(1000);
        let refund = |now, hit: Hit| store.refund_at(now, "n", &key, hit.deadline.unwrap().get());

        let first = store.hit_at(0, "n", &key, w).unwrap();
        let second = store.hit_at(MS, "n", &key, w).unwrap();
        assert_eq!(first.deadline, second.deadline, "one window, one deadline");
        assert!(refund(2 * MS, second));
        assert_eq!(store.peek_at(2 * MS, "n", &key).unwrap().count, 1);
        assert!(refund(3 * MS, first));
        assert_eq!(store.peek_at(3 * MS, "n", &key).unwrap().count, 0);
        assert!(!refund(4 * MS, first), "never below zero");
        assert_eq!(store.peek_at(4 * MS, "n", &key).unwrap().count, 0);
        let again = store.hit_at(5 * MS, "n", &key, w).unwrap();
        assert_eq!(
            (again.count, again.deadline),
            (1, first.deadline),
            "same window"
        );

        // The window closes: a refund of its hit does nothing, and creates
        // nothing.
        assert!(!refund(1000 * MS, again));
        assert_eq!(store.peek_at(1000 * MS, "n", &key), None);
        // A new window opens; the old window's hit never touches it.
        let fresh = store.hit_at(1500 * MS, "n", &key, w).unwrap();
        assert_eq!(fresh.count, 1);
        assert_ne!(fresh.deadline, again.deadline);
        assert!(!refund(1501 * MS, again), "an old window's hit");
        assert_eq!(store.peek_at(1501 * MS, "n", &key).unwrap().count, 1);
        assert!(refund(1502 * MS, fresh));

        // No counter, no refund, and none created.
        let other = Key::new("never hit");
        assert!(!store.refund_at(0, "n", &other, fresh.deadline.unwrap().get()));
        assert_eq!(store.peek_at(0, "n", &other), None);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_refund_after_the_window_closed_leaves_nothing() {
        let store = MemoryBackend::builder().shards(1).build();
        let key = Key::new("k");
        let hit = store.hit_at(0, "n", &key, window(10)).unwrap();
        // The expired counter is swept by a later sweep...
        for i in 0..200u64 {
            store
                .hit_at(20 * MS, "sweep", &Key::display(i), window(10))
                .unwrap();
        }
        assert_eq!(store.peek_at(20 * MS, "n", &key), None);
        // ...and the late refund creates nothing.
        assert!(!store.refund_at(20 * MS, "n", &key, hit.deadline.unwrap().get()));
        assert_eq!(store.peek_at(20 * MS, "n", &key), None);
        let counted = store.hit_at(21 * MS, "n", &key, window(10)).unwrap();
        assert_eq!(
            counted.count, 1,
            "a fresh window, not one made by the refund"
        );
    }

    #[test]
    fn hits_answer_refunds_through_the_trait() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let quota = Quota::with_window(std::num::NonZeroU64::MIN, window(60_000));
        let counters = [Counter {
            namespace: "n",
            quota,
        }];
        let hit = store.hit_all(&key, &counters).into_inner().unwrap()[0];
        assert!(store.refund("n", &key, &hit).into_inner().unwrap());
        let uncounted = Hit {
            deadline: None,
            ..hit
        };
        store.hit_all(&key, &counters).into_inner().unwrap();
        assert!(
            !store.refund("n", &key, &uncounted).into_inner().unwrap(),
            "a hit the store did not count is never refunded"
        );
        assert_eq!(store.peek_at(store.now(), "n", &key).unwrap().count, 1);
    }

    #[test]
    fn concurrent_hits_take_every_count_once_in_each_window() {
        // Four threads, one key, a clock that moves through five windows of
        // 1 ms: each window's counts are exactly 1..=n, with no count given
        // twice or skipped, whether a hit took the read lock's increment or
        // opened the window under the write lock.
        let store = MemoryBackend::builder().shards(1).build();
        let key = Key::new("k");
        let w = window(1);
        let seen: Vec<Vec<(u64, u64)>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4u64)
                .map(|thread| {
                    let (store, key) = (&store, &key);
                    scope.spawn(move || {
                        (0..20_000u64)
                            .map(|i| {
                                // Windows open at 0, 1, 2, 3 and 4 ms.
                                let now = (i / 4_000) * MS + thread;
                                let hit = store.hit_at(now, "race", key, w).unwrap();
                                (hit.deadline.unwrap().get(), hit.count)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut by_window = std::collections::BTreeMap::<u64, Vec<u64>>::new();
        for (deadline, count) in seen.into_iter().flatten() {
            by_window.entry(deadline).or_default().push(count);
        }
        let total: usize = by_window.values().map(Vec::len).sum();
        assert_eq!(total, 80_000);
        for (deadline, mut counts) in by_window {
            counts.sort_unstable();
            let n = counts.len() as u64;
            assert!(
                counts.iter().copied().eq(1..=n),
                "window closing at {deadline}: counts are not exactly 1..={n}"
            );
        }
    }

    #[test]
    fn concurrent_hits_and_refunds_never_keep_more_than_the_limit() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let store = MemoryBackend::new();
        let limit = 25u64;
        let quota =
            Quota::with_window(std::num::NonZeroU64::new(limit).unwrap(), window(3_600_000));
        let kept = AtomicU64::new(0);
        let refunded = AtomicU64::new(0);
        let hits = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (store, kept, refunded, hits) = (&store, &kept, &refunded, &hits);
                scope.spawn(move || {
                    let key = Key::new("shared");
                    let counters = [Counter {
                        namespace: "race",
                        quota,
                    }];
                    for i in 0..2_000u64 {
                        let hit = store.hit_all(&key, &counters).into_inner().unwrap()[0];
                        hits.fetch_add(1, Ordering::Relaxed);
                        // One admitted hit in three is kept (its request
                        // "failed"); every other hit, denied ones included,
                        // is taken back.
                        if hit.count <= limit && (thread + i) % 3 == 0 {
                            kept.fetch_add(1, Ordering::Relaxed);
                        } else if store.refund("race", &key, &hit).into_inner().unwrap() {
                            refunded.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let count = store
            .peek_at(store.now(), "race", &Key::new("shared"))
            .unwrap()
            .count;
        let (kept, refunded, hits) = (kept.into_inner(), refunded.into_inner(), hits.into_inner());
        assert!(
            kept <= limit,
            "kept {kept} admitted hits past the limit of {limit}"
        );
        assert_eq!(refunded, hits - kept, "every hit not kept was taken back");
        assert_eq!(count, kept, "the counter holds exactly the kept hits");
        assert_eq!(kept, limit, "the budget was spent in full");
    }

    /// The reference model: a map from key to (count, deadline) where only a
    /// hit that finds no live counter sets the deadline.
    #[derive(Default)]
    struct Model<K = u8>(std::collections::HashMap<K, (u64, u64)>);

    impl<K: std::hash::Hash + Eq> Model<K> {
        fn hit(&mut self, now: u64, key: K, window_ns: u64) -> Hit {
            let entry = self.0.entry(key).or_insert((0, 0));
            if entry.1 <= now {
                *entry = (0, now + window_ns);
            }
            entry.0 += 1;
            Hit {
                count: entry.0,
                reset: Duration::from_nanos(entry.1 - now),
                deadline: NonZeroU64::new(entry.1),
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

        /// Counters of up to 20 namespaces (more than get a short id) and
        /// keys of zeros and ones around the short form's 15 bytes, where a
        /// key and the same key with a zero more differ only by their
        /// length: every (namespace, key) pair keeps its own count, in
        /// whichever table it lands.
        #[test]
        fn short_and_long_counters_match_the_reference_model(
            steps in proptest::collection::vec(
                (0u64..3_000_000, 0u8..20, 13usize..18, 0u8..3),
                1..400,
            ),
        ) {
            let store = MemoryBackend::builder().shards(2).build();
            let mut model = Model::default();
            let w = window(5);
            let mut now = 0;
            for (advance, name, len, fill) in steps {
                now += advance;
                let namespace = format!("n{name}");
                // Zeros, ones, or zeros ending in a one: few enough keys
                // that they are hit again, after the tables have grown.
                let mut key = vec![u8::from(fill == 1); len];
                key[len - 1] |= u8::from(fill == 2);
                let got = store.hit_at(now, &namespace, &Key::new(&key), w).unwrap();
                prop_assert_eq!(got, model.hit(now, (name, key), 5 * MS));
            }
        }
    }
}
