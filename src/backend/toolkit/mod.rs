//! What a store author needs beyond the [contract](super): the parts the
//! crate's own remote stores (`tower-pinned-window-redis`,
//! `tower-pinned-window-postgres`) are built on, public so that a store of
//! your own gets the same ones.
//!
//! A [`Backend`](super::Backend) needs none of it: the in-memory backend and
//! [`PrivateKeys`](super::PrivateKeys) use none. A store across the network
//! usually wants:
//!
//! - [`storage_key`]: one byte string per (counter, key) pair, for stores
//!   whose keys are byte strings, escaped so that two different pairs never
//!   share a key whatever bytes a client sends, with the markers of a
//!   counter's lockout and reset beside it;
//! - [`Denials`]: a local table of counters the store has denied, until
//!   the store said the denial ends, so that a client hammering a key it is
//!   denied on costs no round trip;
//! - [`BackendFuture`]: one future for every call of a remote store, which
//!   is answered at once (a denial [`Denials`] remembers), waits in a batch
//!   for the call that carries it (answered through its [`Reply`], with no
//!   allocation per request), or makes its own call;
//! - [`refused_count`]: the count the contract has a spend that did not fit
//!   report.
//!
//! The layer records the metrics of every backend around its call (latency,
//! errors, and an answer given at once with a denial, which it counts as
//! the deny cache's), so a store of your own gets them without a line.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use tower_pinned_window::backend::toolkit::{Denials, Denied, storage_key};
//! use tower_pinned_window::key::Key;
//!
//! let key = Key::new("203.0.113.7");
//! assert_eq!(storage_key::encode(b"tpw:", "api", &key), b"tpw:api{203.0.113.7}");
//!
//! // The store denied the counter at a limit of 100, for 10 s from now:
//! // asked again under that limit, the cache answers for it.
//! let denials = Denials::new(1024, Duration::from_secs(1));
//! let now = Instant::now();
//! let at_limit = Denied::AtLimit { limit: 100 };
//! denials.remember("api", key.as_bytes(), now, Duration::from_secs(10), at_limit, false);
//! assert!(denials.hit("api", key.as_bytes(), 100, now).is_some());
//! assert!(denials.hit("api", b"198.51.100.1", 100, now).is_none());
//! // Under a raised limit, the store is asked.
//! assert!(denials.hit("api", key.as_bytes(), 200, now).is_none());
//! ```

mod deny_cache;
mod future;
mod slots;
pub mod storage_key;

pub use deny_cache::{Denials, Denied};
pub use future::BackendFuture;
pub use slots::{ARENA_SLOTS, Reply};

/// The count a counter that does not fit reports in a spend of `need`
/// (its cost, at least 1): `count`, or the larger of `count` and `limit`
/// when it is `locked` out, plus `need`, saturating (see
/// [costs, lockouts and amends](super#costs-lockouts-and-amends)). Above
/// `limit` whenever `need` is at least 1, which is how the layer tells a
/// counter that did not fit.
///
/// ```
/// use tower_pinned_window::backend::toolkit::refused_count;
///
/// assert_eq!(refused_count(4, 5, false, 2), 6);
/// assert_eq!(refused_count(1, 5, true, 1), 6);
/// assert_eq!(refused_count(u64::MAX, 5, false, 1), u64::MAX);
/// ```
#[inline]
#[must_use]
pub fn refused_count(count: u64, limit: u64, locked: bool, need: u64) -> u64 {
    let stands = if locked { count.max(limit) } else { count };
    stands.saturating_add(need)
}
