//! Where counters live, behind one contract.
//!
//! # The contract
//!
//! [`Backend::hit`] increments a key's counter and returns the new count and
//! the time left in the key's window, **in one atomic step**: no other hit on
//! the same key, on this process or another, can observe or interleave with a
//! half-done increment.
//!
//! **The lifetime is attached only when the counter is created** (or found
//! without one, which only older code or a crash between two commands can
//! leave behind), **and an existing lifetime is never extended or shortened.**
//! Hits never move a window: it closes a fixed [`Window`](crate::Window) after the hit that
//! opened it, however often the key knocks in between.
//!
//! A counter that does not hold an integer is corrupt state: `hit` fails with
//! [`BackendError::Corrupt`] and leaves the stored value as it is, never
//! resetting it (a reset would hand out free attempts).
//!
//! Backends here: [`MemoryBackend`] (the embedded default) and, with the
//! `redis` feature, a Redis and Redis Cluster backend.

mod memory;
#[cfg(feature = "redis")]
pub mod redis;

pub use memory::{DEFAULT_MAX_KEYS, MemoryBackend, MemoryBackendBuilder};

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::key::Key;
use crate::quota::Quota;

/// The outcome of one [`Backend::hit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// The counter after this hit: 1 for the hit that opened the window.
    pub count: u64,
    /// Time left until the window closes and the counter is gone.
    pub reset: Duration,
}

/// A backend could not answer. Which of these a request sees decides its fate:
/// see [`FailurePolicy`](crate::FailurePolicy).
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The store could not be reached or refused the command.
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// The store did not answer within the layer's timeout.
    TimedOut,
    /// The store is full of live counters and will not evict one
    /// (see [`MemoryBackendBuilder::max_keys`]).
    AtCapacity,
    /// The stored counter is not an integer (or the key holds another type).
    /// The value was left untouched for inspection. Requests on this key are
    /// stopped whatever the failure policy says.
    Corrupt {
        /// The storage key holding the bad value.
        key: String,
        /// What was found there.
        detail: String,
    },
}

impl BackendError {
    /// Whether this is corrupt state rather than an outage.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::Corrupt { .. })
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(err) => write!(f, "rate-limit backend unavailable: {err}"),
            Self::TimedOut => f.write_str("rate-limit backend timed out"),
            Self::AtCapacity => f.write_str("rate-limit backend is at its key capacity"),
            Self::Corrupt { key, detail } => {
                write!(
                    f,
                    "corrupt rate-limit counter at {key:?}: {detail} (left untouched)"
                )
            }
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(err) => Some(&**err),
            _ => None,
        }
    }
}

/// A counter store that keeps the [contract](self#the-contract).
///
/// `namespace` is the layer's name; together with `key` it names one counter.
/// Implementations hold their state behind an `Arc`, so clones share it.
pub trait Backend: Clone + Send + Sync + 'static {
    /// What [`hit`](Backend::hit) returns (`Unpin`: box it if need be). The
    /// in-memory backend answers with an already completed future, so a hit
    /// costs no allocation; the layer polls it once as soon as it is made and
    /// decides there and then when it is ready.
    type Future: Future<Output = Result<Hit, BackendError>> + Unpin + Send + 'static;

    /// Count one hit on `key` in one atomic step; a new counter's window is
    /// `quota`'s window, an existing counter's window is left as it is.
    ///
    /// `quota`'s limit is a hint a backend may use (the Redis backend's local
    /// deny cache does); the layer makes the decision from the count.
    fn hit(&self, namespace: &str, key: &Key, quota: Quota) -> Self::Future;

    /// The counter as it stands, without counting; `None` when there is no
    /// live counter.
    fn peek(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Hit>, BackendError>> + Send;

    /// Delete the counter ("unblock this client"); `true` when one existed.
    fn reset(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send;
}
