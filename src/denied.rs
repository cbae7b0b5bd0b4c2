//! The keys denied most: a bounded top-N of denied keys per layer, kept in
//! process memory, shown only as keyed digests.
//!
//! Turn it on with [`RateLimitLayer::top_denied`](crate::RateLimitLayer::top_denied)
//! and read it through the handle
//! [`RateLimitLayer::denied_keys`](crate::RateLimitLayer::denied_keys)
//! gives:
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, body::Body, http::{HeaderName, Request}, routing::get};
//! use tower::ServiceExt;
//! use tower_pinned_window::denied::TopDenied;
//! use tower_pinned_window::key::Key;
//! use tower_pinned_window::{Quota, RateLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let quota = Quota::new(1, Duration::from_secs(60)).unwrap();
//! let layer = RateLimitLayer::new("api", quota)
//!     .key(HeaderName::from_static("x-api-key"))
//!     .top_denied(TopDenied::new(100).unwrap());
//! let denied = layer.denied_keys().expect("turned on above");
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//!
//! for _ in 0..3 {
//!     let request = Request::get("/").header("x-api-key", "sk_live_abc").body(Body::empty());
//!     app.clone().oneshot(request.unwrap()).await.unwrap();
//! }
//! let top = denied.top(10);
//! assert_eq!(top.len(), 1);
//! assert_eq!(top[0].denied, 2, "the first request passed");
//! // Only the digest is shown; the application can compute it for a key it knows.
//! assert_eq!(top[0].digest, denied.digest(&Key::new("sk_live_abc")));
//! assert!(!top[0].digest.contains("sk_live"));
//! assert_eq!(denied.get(&Key::new("sk_live_abc")).unwrap().denied, 2);
//! # }
//! ```
//!
//! # What is counted
//!
//! Each request a quota of the layer denies (a 429 or `RESOURCE_EXHAUSTED`,
//! a lockout's and a local deny cache's included), once, after the
//! decision; in [shadow mode](crate::RateLimitLayer::shadow), each request
//! that would have been denied. Not counted: requests passed, requests a
//! full [in-flight cap](crate::RateLimitLayer::in_flight) refused, and
//! answers to store failures. Under the outbound
//! [`BudgetLayer::top_denied`](crate::outbound::BudgetLayer::top_denied),
//! each call its budget refuses
//! ([`BudgetError::Exhausted`](crate::outbound::BudgetError::Exhausted)).
//! Nothing is sent to the store: the table lives
//! in this process, one per layer (the layer's clones and services share
//! it; a second `top_denied` call makes a new one), and starts empty at
//! each start-up.
//!
//! # The algorithm, and what its numbers mean
//!
//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005): a table of
//! `capacity` counters. A denied key in the table adds 1 to its counter;
//! a key not in it takes the place of the key with the smallest count,
//! inheriting that count plus 1, and the inherited part is its
//! [`error`](DeniedKey::error). So for every key shown,
//! `denied - error <= its true denials <= denied`, and every key denied
//! more than `1 / capacity` of all denials is in the table. A key that
//! entered while the table had room and was never evicted has `error` 0
//! and an exact count.
//!
//! # Memory, and a flood of distinct keys
//!
//! The table is allocated when the layer is configured, at its full size,
//! and never grows: a flood of any number of distinct denied keys evicts,
//! it does not allocate. About 135 bytes per counter (a 16-byte digest and
//! two counts, 32 bytes; the heap's 8; the index's buckets, reserved at
//! twice the capacity so that it never grows, about 86; with the `metrics`
//! feature, 8 to rank the counts in): 1,000 counters hold 134,032 bytes (126,032 without `metrics`),
//! after any number of distinct keys. A denial costs one HMAC-SHA256 of the key, computed outside the
//! lock, then a short critical section (a hash-table lookup and a heap
//! step); an allowed request never touches the table.
//!
//! # Digests
//!
//! A digest is the first 16 bytes of the HMAC-SHA256 of the key's bytes
//! ([`Key::as_bytes`]), as 32 lowercase hex digits. Without the secret it
//! cannot be reversed, nor recomputed from a guess (an IPv4 address, a
//! leaked API key's prefix). By default each table has a secret of its own
//! from the OS's random source, so digests change at each start-up and
//! differ between instances; [`TopDenied::with_secret`] gives them a secret
//! of yours, so the same key has the same digest across restarts and on
//! every instance (merge the tops of a fleet by digest). Keep that secret
//! as you keep [`PrivateKeys`](crate::backend::PrivateKeys)'s: anyone who
//! holds it can test guesses against the digests. Guide:
//! [`docs/metrics.md#the-keys-denied-most`](crate::guide::metrics#the-keys-denied-most).

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::backend::MIN_SECRET_LEN;
use crate::error::ConfigError;
use crate::key::Key;
use crate::metrics::TopDeniedMetrics;

/// The largest table [`TopDenied::new`] takes: 65,536 counters (about
/// 9 MB).
pub const MAX_TOP_DENIED: usize = 1 << 16;

/// The bytes of a digest kept in the table.
const DIGEST_LEN: usize = 16;

/// A digest as the table keeps it.
type Digest = [u8; DIGEST_LEN];

/// The settings of a table of the keys denied most: its size, and the
/// secret of its digests. Give it to
/// [`RateLimitLayer::top_denied`](crate::RateLimitLayer::top_denied).
///
/// ```
/// use tower_pinned_window::ConfigError;
/// use tower_pinned_window::denied::{MAX_TOP_DENIED, TopDenied};
///
/// assert!(TopDenied::new(1_000).is_ok());
/// assert_eq!(TopDenied::new(0).unwrap_err(), ConfigError::InvalidTopDenied(0));
/// assert!(TopDenied::new(MAX_TOP_DENIED + 1).is_err());
/// // In an application, read the secret from a secret store.
/// assert!(TopDenied::with_secret(1_000, [7u8; 32]).is_ok());
/// assert_eq!(TopDenied::with_secret(1_000, b"short").unwrap_err(), ConfigError::SecretTooShort(5));
/// ```
#[derive(Clone)]
#[must_use]
pub struct TopDenied {
    capacity: NonZeroUsize,
    /// The HMAC with the user's secret absorbed; `None` for a random one
    /// per table.
    mac: Option<Hmac<Sha256>>,
}

impl TopDenied {
    /// A table of `capacity` counters (1 to [`MAX_TOP_DENIED`]), whose
    /// digests are keyed by a random secret of its own. A table of
    /// `capacity` counters finds every key denied more than `1 / capacity`
    /// of all the layer's denials; ten times the N you want to show is a
    /// good size.
    ///
    /// # Errors
    /// [`ConfigError::InvalidTopDenied`] for 0 or more than
    /// [`MAX_TOP_DENIED`].
    pub fn new(capacity: usize) -> Result<Self, ConfigError> {
        let capacity = NonZeroUsize::new(capacity)
            .filter(|c| c.get() <= MAX_TOP_DENIED)
            .ok_or(ConfigError::InvalidTopDenied(capacity))?;
        Ok(Self {
            capacity,
            mac: None,
        })
    }

    /// Like [`new`](Self::new), with digests keyed by `secret` (at least
    /// [`MIN_SECRET_LEN`] random bytes): the same key has the same digest
    /// across restarts and on every instance with that secret.
    ///
    /// # Errors
    /// [`ConfigError::InvalidTopDenied`] as for [`new`](Self::new);
    /// [`ConfigError::SecretTooShort`] for a secret shorter than
    /// [`MIN_SECRET_LEN`] bytes.
    pub fn with_secret(capacity: usize, secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let mut this = Self::new(capacity)?;
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ConfigError::SecretTooShort(secret.len()));
        }
        this.mac = Some(Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"));
        Ok(this)
    }

    /// The number of counters.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// A new, empty table with these settings, for the layer `limiter`.
    pub(crate) fn table(&self, limiter: &str) -> DeniedKeys {
        let mac = self.mac.clone().unwrap_or_else(random_mac);
        let capacity = self.capacity.get();
        DeniedKeys(Arc::new(Shared {
            mac,
            table: Mutex::new(Table::new(capacity)),
            capacity,
            limiter: limiter.into(),
        }))
    }
}

impl fmt::Debug for TopDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("TopDenied")
            .field("capacity", &self.capacity)
            .field("own_secret", &self.mac.is_some())
            .finish()
    }
}

/// An HMAC under a secret of 32 bytes from the OS's random source: std's
/// [`RandomState`] is seeded from it (once per thread, then stepped), and
/// its SipHash, keyed so, turns four counters into the secret.
fn random_mac() -> Hmac<Sha256> {
    let state = RandomState::new();
    let mut secret = [0u8; 32];
    for (i, chunk) in secret.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&state.hash_one(i as u64).to_le_bytes());
    }
    Hmac::new_from_slice(&secret).expect("HMAC takes a key of any length")
}

/// A key among the keys denied most, as [`DeniedKeys::top`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DeniedKey {
    /// The key's digest: 32 lowercase hex digits
    /// ([`DeniedKeys::digest`]), never the key.
    pub digest: String,
    /// Its denials counted: at least its true denials.
    pub denied: u64,
    /// How many of `denied` it may not have had: what it inherited when
    /// it took an evicted key's place (0 when it never did, and then
    /// `denied` is exact).
    pub error: u64,
}

/// The keys a layer denied most: a handle on its table, from
/// [`RateLimitLayer::denied_keys`](crate::RateLimitLayer::denied_keys).
///
/// Cheap to clone (an [`Arc`]), `Send` and `Sync`: hand it to an
/// operator's route or a metrics task. Reading takes the table's lock
/// for a copy of its counters, so read it now and then (a dashboard's
/// refresh), not per request. See the [module docs](self) for an example
/// and what the numbers mean.
#[derive(Clone)]
pub struct DeniedKeys(Arc<Shared>);

struct Shared {
    mac: Hmac<Sha256>,
    table: Mutex<Table>,
    capacity: usize,
    limiter: Arc<str>,
}

impl DeniedKeys {
    /// The (at most) `n` keys denied most, most denied first (ties: the
    /// smaller error, then the digest).
    #[must_use]
    pub fn top(&self, n: usize) -> Vec<DeniedKey> {
        let mut slots = self.lock().slots.clone();
        slots.sort_unstable_by(|a, b| {
            (b.count, a.error, a.digest).cmp(&(a.count, b.error, b.digest))
        });
        slots.truncate(n);
        slots.iter().map(Slot::shown).collect()
    }

    /// The key in the table, if it is there: "is this client among the
    /// keys denied most?"
    #[must_use]
    pub fn get(&self, key: &Key) -> Option<DeniedKey> {
        let digest = self.digest_of(key);
        let table = self.lock();
        let slot = *table.index.get(&digest)?;
        Some(table.slots[slot as usize].shown())
    }

    /// The digest the table shows for `key`: 32 lowercase hex digits.
    #[must_use]
    pub fn digest(&self, key: &Key) -> String {
        hex(&self.digest_of(key))
    }

    /// All the denials the table has counted since the layer was built,
    /// of every key (the table's keys' `denied` add up to it, while no
    /// key has been evicted).
    #[must_use]
    pub fn denials(&self) -> u64 {
        self.lock().denials
    }

    /// The number of counters, as [`TopDenied::new`] was given.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.0.capacity
    }

    /// Counts a denial of `key`.
    pub(crate) fn record(&self, key: &Key) {
        let digest = self.digest_of(key);
        let mut table = self.lock();
        table.record(digest);
        if table.metrics.due() {
            table.publish(&self.0.limiter);
        }
    }

    /// The bytes the table holds on the heap (its counters, heap and
    /// index, at their reserved size).
    #[cfg(test)]
    pub(crate) fn bytes_held(&self) -> usize {
        self.lock().bytes_held()
    }

    fn digest_of(&self, key: &Key) -> Digest {
        let mut mac = self.0.mac.clone();
        mac.update(key.as_bytes());
        let full = mac.finalize().into_bytes();
        let mut digest = [0u8; DIGEST_LEN];
        digest.copy_from_slice(&full[..DIGEST_LEN]);
        digest
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while the lock is held; if something did, the
        // counts are still whole.
        self.0
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for DeniedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeniedKeys")
            .field("limiter", &self.0.limiter)
            .field("capacity", &self.0.capacity)
            .finish_non_exhaustive()
    }
}

/// 32 lowercase hex digits.
fn hex(digest: &Digest) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(2 * DIGEST_LEN);
    for byte in digest {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    text
}

/// A counter.
#[derive(Clone, Copy)]
struct Slot {
    digest: Digest,
    count: u64,
    error: u64,
}

impl Slot {
    fn shown(&self) -> DeniedKey {
        DeniedKey {
            digest: hex(&self.digest),
            denied: self.count,
            error: self.error,
        }
    }
}

/// The Space-Saving table: the counters, a min-heap of them by count (its
/// root is the one a new key evicts), and an index from digest to
/// counter. Every part is allocated at its full size when the table is
/// made; nothing grows after.
struct Table {
    capacity: usize,
    slots: Vec<Slot>,
    /// Counter indices, a min-heap by count.
    heap: Vec<u32>,
    /// `at[slot]`: the place of counter `slot` in `heap`.
    at: Vec<u32>,
    /// Reserved at twice the capacity, so that an insert after a removal
    /// rehashes in place and never allocates.
    index: HashMap<Digest, u32, RandomState>,
    denials: u64,
    /// The metrics' room to rank the counts in, reserved at the capacity
    /// (empty without the feature).
    scratch: Vec<u64>,
    /// The gauges of the top ranks' counts (feature `metrics`).
    metrics: TopDeniedMetrics,
}

impl Table {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            slots: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            at: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(2 * capacity, RandomState::new()),
            denials: 0,
            scratch: Vec::with_capacity(if TopDeniedMetrics::RECORDS {
                capacity
            } else {
                0
            }),
            metrics: Default::default(),
        }
    }

    /// Sets the rank gauges to the counts, largest first, in the room
    /// reserved for them.
    fn publish(&mut self, limiter: &str) {
        self.scratch.clear();
        self.scratch
            .extend(self.slots.iter().map(|slot| slot.count));
        self.scratch.sort_unstable_by(|a, b| b.cmp(a));
        self.metrics.publish(limiter, self.capacity, &self.scratch);
    }

    fn record(&mut self, digest: Digest) {
        self.denials += 1;
        if let Some(&slot) = self.index.get(&digest) {
            let slot = slot as usize;
            self.slots[slot].count = self.slots[slot].count.saturating_add(1);
            self.sift_down(self.at[slot] as usize);
            return;
        }
        if self.slots.len() < self.capacity {
            let slot = self.slots.len() as u32;
            self.slots.push(Slot {
                digest,
                count: 1,
                error: 0,
            });
            self.heap.push(slot);
            self.at.push(slot);
            self.index.insert(digest, slot);
            self.sift_up(slot as usize);
            return;
        }
        // Full: the smallest counter goes to the new key, which inherits
        // its count as its error.
        let slot = self.heap[0];
        let evicted = &mut self.slots[slot as usize];
        let least = evicted.count;
        let old = std::mem::replace(&mut evicted.digest, digest);
        evicted.count = least.saturating_add(1);
        evicted.error = least;
        self.index.remove(&old);
        self.index.insert(digest, slot);
        self.sift_down(0);
    }

    fn count_at(&self, place: usize) -> u64 {
        self.slots[self.heap[place] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.at[self.heap[a] as usize] = a as u32;
        self.at[self.heap[b] as usize] = b as u32;
    }

    fn sift_up(&mut self, mut place: usize) {
        while place > 0 {
            let parent = (place - 1) / 2;
            if self.count_at(parent) <= self.count_at(place) {
                break;
            }
            self.swap(parent, place);
            place = parent;
        }
    }

    fn sift_down(&mut self, mut place: usize) {
        let len = self.heap.len();
        loop {
            let left = 2 * place + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.count_at(right) < self.count_at(left) {
                right
            } else {
                left
            };
            if self.count_at(place) <= self.count_at(child) {
                break;
            }
            self.swap(place, child);
            place = child;
        }
    }

    #[cfg(test)]
    fn bytes_held(&self) -> usize {
        use std::mem::size_of;
        self.slots.capacity() * size_of::<Slot>()
            + (self.heap.capacity() + self.at.capacity()) * size_of::<u32>()
            + self.index.allocation_size()
            + self.scratch.capacity() * size_of::<u64>()
    }
}

#[cfg(test)]
mod tests;
