//! The calls of this process that wait for a budget: one line per budget
//! key, served in arrival order, with one call at a time (the line's head)
//! asking the store while the budget is spent.
//!
//! A call joins a line only once the budget turned it away, or when others
//! of its key already wait here: a call that finds room never touches the
//! line, so a budget with room costs one store call and no lock beyond a
//! counter's read.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::key::Key;
use crate::quota::Quota;

/// The lines of one layer (its clones and services share them).
#[derive(Debug, Default)]
pub(crate) struct Lines {
    /// Calls waiting across every line; read first, so a call finds out
    /// that nobody waits without a lock.
    waiting: AtomicUsize,
    lines: Mutex<HashMap<Key, Arc<Line>>>,
    /// Draws for the wake-up jitter.
    draws: AtomicU64,
    seed: RandomState,
}

/// One budget key's line.
#[derive(Debug, Default)]
pub(crate) struct Line {
    /// Held by the head; `tokio`'s lock hands it over in arrival order, and
    /// a waiter dropped while queued for it leaves the queue.
    turn: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// What the calls in the line cost together.
    queued: u64,
    /// When the store said the budget returns, from its last denial.
    opens_at: Option<Instant>,
}

impl Lines {
    /// Whether calls of `key` wait here: a new call of that key then joins
    /// the line behind them rather than asking the store first.
    #[inline]
    pub(crate) fn busy(&self, key: &Key) -> bool {
        self.waiting.load(Ordering::Acquire) > 0 && lock(&self.lines).contains_key(key)
    }

    /// A place in `key`'s line for a call of `cost`, or `None` when
    /// `max_waiters` calls already wait in this process. What the line
    /// costs ahead of it is returned with it.
    pub(crate) fn join(
        self: &Arc<Self>,
        key: &Key,
        cost: u64,
        max_waiters: usize,
    ) -> Option<(Place, u64)> {
        let mut waiting = self.waiting.load(Ordering::Relaxed);
        loop {
            if waiting >= max_waiters {
                return None;
            }
            match self.waiting.compare_exchange_weak(
                waiting,
                waiting + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => waiting = now,
            }
        }
        let line = Arc::clone(lock(&self.lines).entry(key.clone()).or_default());
        let ahead = {
            let mut state = lock(&line.state);
            let ahead = state.queued;
            state.queued = state.queued.saturating_add(cost);
            ahead
        };
        Some((
            Place {
                lines: Arc::clone(self),
                key: key.clone(),
                line,
                cost,
            },
            ahead,
        ))
    }

    /// A wake-up delay in `[0, max)`, different on each draw: the heads of
    /// one budget in different processes do not ask the store in the same
    /// instant when its window opens.
    pub(crate) fn jitter(&self, max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        let draw = self
            .seed
            .hash_one(self.draws.fetch_add(1, Ordering::Relaxed));
        Duration::from_nanos(draw % nanos)
    }
}

/// A call's place in its key's line; leaving it (dropped) takes the call
/// out, and the last one out removes the line.
#[derive(Debug)]
pub(crate) struct Place {
    lines: Arc<Lines>,
    key: Key,
    line: Arc<Line>,
    cost: u64,
}

impl Place {
    /// Waits for the call's turn at the head of the line.
    pub(crate) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.line.turn.lock().await
    }

    /// When the budget returns, as the store last said, if it is later
    /// than `now`.
    pub(crate) fn opens_at(&self, now: Instant) -> Option<Instant> {
        lock(&self.line.state).opens_at.filter(|at| *at > now)
    }

    /// The store said the budget returns at `at`.
    pub(crate) fn closed_until(&self, at: Instant) {
        lock(&self.line.state).opens_at = Some(at);
    }

    /// The earliest the budget can return for a call with `ahead` queued
    /// before it in this process, when the store said it is spent: the
    /// window that opens then serves `limit` of the line, the next one
    /// opens a window later, and so on. Other processes may take some of
    /// each window too, so this is a lower bound. `None` when the store has
    /// not said so, or its word has passed: there may be room now.
    pub(crate) fn earliest(&self, now: Instant, ahead: u64, quota: Quota) -> Option<Instant> {
        let opens_at = self.opens_at(now)?;
        // A call of cost 0 needs a unit of room, as a check does.
        let need = ahead.saturating_add(self.cost.max(1));
        let windows = (need - 1) / quota.limit().max(1);
        let windows = u32::try_from(windows).unwrap_or(u32::MAX);
        Some(opens_at + quota.window().as_duration().saturating_mul(windows))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.line.state);
            state.queued = state.queued.saturating_sub(self.cost);
        }
        {
            let mut lines = lock(&self.lines.lines);
            // Joiners clone the line under this lock: two owners (the map
            // and this place) means nobody else holds it.
            if Arc::strong_count(&self.line) == 2 {
                lines.remove(&self.key);
            }
        }
        self.lines.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Locks `mutex`; a panic elsewhere while it was held leaves counts that
/// are still consistent enough to go on with.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn a_line_holds_at_most_max_waiters_and_goes_when_its_last_call_leaves() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        assert!(!lines.busy(&key));
        let (first, ahead) = lines.join(&key, 3, 2).unwrap();
        assert_eq!(ahead, 0);
        assert!(lines.busy(&key));
        let (second, ahead) = lines.join(&key, 4, 2).unwrap();
        assert_eq!(ahead, 3);
        assert!(lines.join(&Key::new("other"), 1, 2).is_none(), "full");
        drop(first);
        assert!(lines.busy(&key));
        let (third, ahead) = lines.join(&key, 1, 2).unwrap();
        assert_eq!(ahead, 4, "what is still queued");
        drop((second, third));
        assert!(!lines.busy(&key));
        assert!(lock(&lines.lines).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_return_counts_a_window_per_budget_queued_ahead() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        let now = Instant::now();
        let (place, _) = lines.join(&key, 1, 10).unwrap();
        assert_eq!(
            place.earliest(now, 9, quota(5)),
            None,
            "no word from the store"
        );
        place.closed_until(now + Duration::from_secs(2));
        let opens = now + Duration::from_secs(2);
        assert_eq!(place.earliest(now, 0, quota(5)), Some(opens));
        assert_eq!(
            place.earliest(now, 4, quota(5)),
            Some(opens),
            "the 5th of 5"
        );
        assert_eq!(
            place.earliest(now, 5, quota(5)),
            Some(opens + Duration::from_secs(10)),
            "the 6th: the window after"
        );
        assert_eq!(
            place.earliest(now, 14, quota(5)),
            Some(opens + Duration::from_secs(20))
        );
        assert_eq!(place.opens_at(now + Duration::from_secs(3)), None, "passed");
    }

    #[test]
    fn jitter_stays_below_its_bound_and_varies() {
        let lines = Lines::default();
        let max = Duration::from_millis(5);
        let draws: Vec<_> = (0..64).map(|_| lines.jitter(max)).collect();
        assert!(draws.iter().all(|d| *d < max));
        assert!(draws.iter().any(|d| *d != draws[0]), "{draws:?}");
        assert_eq!(lines.jitter(Duration::ZERO), Duration::ZERO);
    }
}
