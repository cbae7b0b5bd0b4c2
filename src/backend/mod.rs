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
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;

pub use memory::{DEFAULT_MAX_KEYS, MemoryBackend, MemoryBackendBuilder};

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use smallvec::SmallVec;
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

/// One counter a request is charged to: the namespace (the layer's name, or
/// the name of one of its extra quotas) and the quota whose window a new
/// counter gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter<'a> {
    /// Names the counter together with the key.
    pub namespace: &'a str,
    /// The counter's quota: its window is the lifetime of a new counter; its
    /// limit is a hint a backend may use (the Redis backend's deny cache).
    pub quota: Quota,
}

/// The outcome of one [`Backend::hit_all`]: a [`Hit`] per counter, in order.
/// Inline for up to two counters.
pub type Hits = SmallVec<[Hit; 2]>;

/// A counter store that keeps the [contract](self#the-contract).
///
/// Implementations hold their state behind an `Arc`, so clones share it.
pub trait Backend: Clone + Send + Sync + 'static {
    /// What [`hit_all`](Backend::hit_all) returns (`Unpin`: box it if need
    /// be). The in-memory backend answers with an already completed future,
    /// so a hit costs no allocation; the layer polls it once as soon as it is
    /// made and decides there and then when it is ready.
    type Future: Future<Output = Result<Hits, BackendError>> + Unpin + Send + 'static;

    /// Count one hit on `key` in each of `counters`, each in one atomic step;
    /// a new counter's window is its quota's window, an existing counter's
    /// window is left as it is. Every counter is hit, whatever the others
    /// say. A backend that can reach all of them in one round trip does.
    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future;

    /// [`hit_all`](Backend::hit_all) for one counter.
    fn hit(&self, namespace: &str, key: &Key, quota: Quota) -> FirstHit<Self::Future> {
        FirstHit(self.hit_all(key, &[Counter { namespace, quota }]))
    }

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

/// The future of [`Backend::hit`]: the one [`Hit`] of a one-counter
/// [`hit_all`](Backend::hit_all).
#[derive(Debug)]
pub struct FirstHit<F>(F);

impl<F> Future for FirstHit<F>
where
    F: Future<Output = Result<Hits, BackendError>> + Unpin,
{
    type Output = Result<Hit, BackendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|hits| {
            hits.and_then(|hits| {
                hits.first().copied().ok_or(BackendError::Unavailable(
                    "the backend answered no hit".into(),
                ))
            })
        })
    }
}
