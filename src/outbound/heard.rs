//! What this process heard from a budget's provider, per key: when each
//! closed key opens again, and the highest count known of each counter in
//! its window (see [`heed`](super::heed), which writes it, and the
//! admission step, which reads the closures).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Hit;
use crate::budget::log::LogGate;
use crate::key::Key;

/// Past this many keys, the keys whose closure or window is over are
/// dropped from this process's memory of them.
const PRUNE_AT: usize = 1024;

/// What this process heard from a budget's provider, per key.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    /// Keys closed in this process; read first, so a call finds that none
    /// is closed without a lock.
    closing: AtomicUsize,
    /// When each closed key opens again.
    closed: Mutex<HashMap<Key, Instant>>,
    /// The highest count this process knows of, per key and counter, in
    /// the window it was counted in.
    seen: Mutex<HashMap<Key, [Seen; 2]>>,
    /// Values a reader ignored.
    pub(crate) ignored: LogGate,
    /// Writes the store refused.
    pub(crate) unwritten: LogGate,
}

/// The highest count known of one counter in one window.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// The window's identity, as the store names it ([`Hit::deadline`]);
    /// 0 when unknown.
    window: u64,
    count: u64,
    /// When what is known stops holding.
    ends: Option<Instant>,
}

impl Heard {
    /// How long `key` stays closed in this process from now; `None` when
    /// it is open.
    #[inline]
    pub(crate) fn closed_for(&self, key: &Key) -> Option<Duration> {
        if self.closing.load(Ordering::Acquire) == 0 {
            return None;
        }
        let until = *lock(&self.closed).get(key)?;
        // The clock is read only for a key that was closed.
        let now = Instant::now();
        (until > now).then(|| until - now)
    }

    /// Each key closed in this process, with how long it stays closed
    /// from now (a snapshot, for the operator's service).
    #[cfg(feature = "operator")]
    pub(crate) fn closed_keys(&self) -> Vec<(Key, Duration)> {
        if self.closing.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        lock(&self.closed)
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(key, until)| (key.clone(), *until - now))
            .collect()
    }

    /// Close `key` in this process until `until`, unless it is closed
    /// until later.
    pub(crate) fn close(&self, key: &Key, until: Instant, now: Instant) {
        let mut closed = lock(&self.closed);
        if closed.len() >= PRUNE_AT {
            closed.retain(|_, ends| *ends > now);
        }
        let ends = closed.entry(key.clone()).or_insert(until);
        *ends = (*ends).max(until);
        self.closing.store(closed.len(), Ordering::Release);
    }

    /// Whether a count of `target` on counter `at` of `key` is news: above
    /// what this process knows, after taking in the call's `own` hit.
    /// When it is, it becomes what is known.
    pub(crate) fn rises(
        &self,
        key: &Key,
        at: usize,
        target: u64,
        own: Option<Hit>,
        now: Instant,
    ) -> bool {
        let mut seen = lock(&self.seen);
        if seen.len() >= PRUNE_AT {
            seen.retain(|_, counters| {
                counters
                    .iter()
                    .any(|seen| seen.ends.is_some_and(|ends| ends > now))
            });
        }
        let known = &mut seen.entry(key.clone()).or_default()[at];
        if known.ends.is_some_and(|ends| ends <= now) {
            *known = Seen::default();
        }
        if let Some(own) = own
            && let Some(window) = own.deadline
        {
            let window = window.get();
            if window > known.window {
                *known = Seen {
                    window,
                    count: own.count,
                    ends: Some(now + own.reset),
                };
            } else if window == known.window {
                known.count = known.count.max(own.count);
            }
        }
        if target <= known.count {
            return false;
        }
        known.count = target;
        true
    }
}

impl Heard {
    /// A raise to `target` of counter `at` of `key` did not reach the
    /// store: what is known of it is forgotten, so that the provider's
    /// next word is news again.
    pub(crate) fn forget(&self, key: &Key, at: usize, target: u64) {
        if let Some(counters) = lock(&self.seen).get_mut(key)
            && counters[at].count == target
        {
            counters[at] = Seen::default();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
