//! The provider's word in memory: [`Heeding::close`] and
//! [`Heeding::raise`] for [`MemoryBackend`].
//!
//! Each step takes the write lock of its counter's shard, as a spend that
//! creates a counter or a lockout does (`spend.rs`), and a close then takes
//! the write lock of the lockout's shard, in the one order every spend
//! takes (counters, then lockouts): each step is one atomic step with every
//! spend and hit of the counter. A lockout is so only ever added or moved
//! under the write lock of its counter's shard, which the one-counter spend
//! relies on when it reads lockouts under the read lock.
//!
//! [`Heeding::close`]: crate::backend::Heeding::close
//! [`Heeding::raise`]: crate::backend::Heeding::raise

use std::num::NonZeroU64;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::MemoryBackend;
use crate::backend::expiring::Entry;
use crate::backend::expiring::id::{KeyBytes, Scratch};
use crate::backend::{BackendError, Counter, Hit};
use crate::key::Key;
use crate::quota::Window;

/// Nanoseconds in `window`: [`Window::MAX`] is 3.2e18 ns, so it never
/// overflows.
fn nanos(window: Window) -> u64 {
    window.as_millis() * 1_000_000
}

impl MemoryBackend {
    /// [`Heeding::close`](crate::backend::Heeding::close) at time `now`:
    /// the time left of the lockout after the step. A new lockout refused
    /// because its shard is full of live ones is
    /// [`BackendError::AtCapacity`], and nothing changes.
    pub(super) fn close_at(
        &self,
        now: u64,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> Result<Duration, BackendError> {
        let inner = &*self.inner;
        let (table, locks) = (&inner.table, &inner.locks);
        let mut scratch = Scratch::new();
        let id = table.id(namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        // The counter's shard first, then its lockout's: the spends' order.
        // The counter itself is not touched; its lock keeps one-counter
        // spends (which read lockouts under the read lock) out of the step.
        let _counter = table.write(shard);
        let mut lock = locks.write(locks.shard_of(hash));
        let end = now.saturating_add(nanos(span));
        if let Some(mut entry) = lock.find(hash, &id) {
            let stands = entry.get().deadline();
            if stands > now && stands >= end {
                // Deadlines only extend.
                return Ok(Duration::from_nanos(stands - now));
            }
            // Live and ending sooner, or ended and not yet swept.
            entry.set_deadline(end);
            return Ok(Duration::from_nanos(end - now));
        }
        if !lock.has_room(now) {
            return Err(BackendError::AtCapacity);
        }
        lock.insert(hash, id, Entry::new(end, ()));
        Ok(Duration::from_nanos(end - now))
    }

    /// [`Heeding::raise`](crate::backend::Heeding::raise) at time `now`:
    /// the counter after the step. A new counter refused because its shard
    /// is full of live ones is [`BackendError::AtCapacity`], and nothing
    /// changes.
    pub(super) fn raise_at(
        &self,
        now: u64,
        key: &Key,
        counter: &Counter<'_>,
        count: u64,
        within: Window,
    ) -> Result<Hit, BackendError> {
        let table = &self.inner.table;
        let mut scratch = Scratch::new();
        let id = table.id(counter.namespace, KeyBytes::of(key), &mut scratch);
        let (hash, shard) = table.locate(&id);
        let target = count.min(counter.quota.limit());
        let lifetime = within.min(counter.quota.window());
        let mut slots = table.write(shard);
        let found = slots.find(hash, &id);
        if let Some(mut entry) = found {
            let deadline = entry.get().deadline();
            if deadline > now {
                // A live window keeps its deadline; the count never goes
                // down (a charge may have taken it past the limit).
                let stands = entry.value_mut().get_mut();
                *stands = (*stands).max(target);
                return Ok(Hit {
                    count: *stands,
                    reset: Duration::from_nanos(deadline - now),
                    deadline: NonZeroU64::new(deadline),
                });
            }
        }
        if count == 0 {
            // Nothing to raise, and nothing is created.
            return Ok(Hit {
                count: 0,
                reset: Duration::from_nanos(nanos(lifetime)),
                deadline: None,
            });
        }
        let deadline = self.opened(now, lifetime);
        match slots.find(hash, &id) {
            // A window that closed, not yet swept: a new one opens.
            Some(mut entry) => {
                *entry.value_mut().get_mut() = target;
                entry.set_deadline(deadline);
            }
            None => {
                if !slots.has_room(now) {
                    return Err(BackendError::AtCapacity);
                }
                slots.insert(hash, id, Entry::new(deadline, AtomicU64::new(target)));
            }
        }
        Ok(Hit {
            count: target,
            reset: Duration::from_nanos(deadline - now),
            deadline: NonZeroU64::new(deadline),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Amend, Spend};
    use crate::quota::Quota;

    const MS: u64 = 1_000_000;

    fn window(ms: u64) -> Window {
        Window::new(Duration::from_millis(ms)).unwrap()
    }

    fn counter(limit: u64, ms: u64) -> Counter<'static> {
        Counter {
            namespace: "n",
            quota: Quota::new(limit, Duration::from_millis(ms)).unwrap(),
            lowers: false,
        }
    }

    #[test]
    fn a_close_locks_spends_out_and_only_ever_extends() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let one = [counter(10, 1000)];
        assert_eq!(
            store.spend_at(0, &key, &one, Spend::cost(2)).unwrap()[0].count,
            2
        );
        assert_eq!(
            store.close_at(0, "n", &key, window(500)).unwrap(),
            Duration::from_millis(500)
        );
        let denied = store
            .spend_at(100 * MS, &key, &one, Spend::cost(1))
            .unwrap()[0];
        assert_eq!(denied.count, 10 + 1, "locked: the limit stands in its way");
        assert_eq!(
            (denied.reset, denied.deadline),
            (Duration::from_millis(400), None)
        );
        let fast = store
            .spend_one(100 * MS, &key, &one[0], Spend::cost(1))
            .unwrap();
        assert_eq!(fast, denied, "the one-counter spend reads it too");
        assert_eq!(
            store.peek_at(100 * MS, "n", &key).unwrap().count,
            2,
            "nothing spent"
        );
        // Shorter: left as it is. Longer: moved.
        assert_eq!(
            store.close_at(200 * MS, "n", &key, window(100)).unwrap(),
            Duration::from_millis(300)
        );
        assert_eq!(
            store.close_at(200 * MS, "n", &key, window(800)).unwrap(),
            Duration::from_millis(800)
        );
        let later = store
            .spend_at(600 * MS, &key, &one, Spend::cost(1))
            .unwrap()[0];
        assert_eq!(later.reset, Duration::from_millis(400));
        // Once it ends, a window closed meanwhile opens again.
        assert_eq!(
            store
                .spend_at(1000 * MS, &key, &one, Spend::cost(1))
                .unwrap()[0]
                .count,
            1
        );
        // An ended lockout, not yet swept, is replaced by the next close.
        assert_eq!(
            store.close_at(1100 * MS, "n", &key, window(50)).unwrap(),
            Duration::from_millis(50)
        );
        assert!(store.remove_at(1110 * MS, "n", &key), "a reset lifts it");
        assert_eq!(
            store
                .spend_at(1110 * MS, &key, &one, Spend::cost(1))
                .unwrap()[0]
                .count,
            1
        );
    }

    #[test]
    fn a_close_extends_a_spends_lockout_and_creates_no_counter() {
        let store = MemoryBackend::new().shards(1);
        let key = Key::new("k");
        let one = [counter(1, 1000)];
        let block = Spend::cost(1).block(window(200));
        assert_eq!(store.spend_at(0, &key, &one, block).unwrap()[0].count, 1);
        let locked = store.spend_at(0, &key, &one, block).unwrap()[0];
        assert_eq!(locked.reset, Duration::from_millis(200));
        assert_eq!(
            store.close_at(10 * MS, "n", &key, window(5000)).unwrap(),
            Duration::from_millis(5000)
        );
        let again = store.spend_at(20 * MS, &key, &one, block).unwrap()[0];
        assert_eq!(again.reset, Duration::from_millis(4990), "the close's end");
        // Another key: a lockout of its own, and no counter.
        let other = Key::new("other");
        store.close_at(0, "n", &other, window(100)).unwrap();
        assert!(store.peek_at(0, "n", &other).is_none());
        assert_eq!(store.len(), 1, "one counter, of `k`");
    }

    #[test]
    fn a_raise_keeps_the_window_never_lowers_and_stops_at_the_limit() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let c = counter(10, 1000);
        let spent = store.spend_at(0, &key, &[c], Spend::cost(3)).unwrap()[0];
        let raised = store.raise_at(100 * MS, &key, &c, 7, window(50)).unwrap();
        assert_eq!(raised.count, 7);
        assert_eq!(raised.deadline, spent.deadline, "the same window");
        assert_eq!(
            raised.reset,
            Duration::from_millis(900),
            "its deadline kept"
        );
        assert_eq!(
            store
                .raise_at(100 * MS, &key, &c, 5, window(50))
                .unwrap()
                .count,
            7
        );
        assert_eq!(
            store.raise_at(100 * MS, &key, &c, 0, window(50)).unwrap(),
            raised
        );
        assert_eq!(
            store
                .raise_at(100 * MS, &key, &c, 99, window(50))
                .unwrap()
                .count,
            10
        );
        // Its deadline names the window for an amend.
        assert!(store.amend_at(
            100 * MS,
            "n",
            &key,
            spent.deadline.unwrap().get(),
            Amend::Charge(2)
        ));
        assert_eq!(
            store
                .raise_at(100 * MS, &key, &c, 11, window(50))
                .unwrap()
                .count,
            12,
            "a charge past the limit stays"
        );
    }

    #[test]
    fn a_raise_creates_a_missing_counter_in_the_shorter_window() {
        let store = MemoryBackend::new();
        let key = Key::new("k");
        let c = counter(10, 1000);
        let zero = store.raise_at(0, &key, &c, 0, window(300)).unwrap();
        assert_eq!(
            zero,
            Hit {
                count: 0,
                reset: Duration::from_millis(300),
                deadline: None
            }
        );
        assert!(
            store.peek_at(0, "n", &key).is_none(),
            "a count of 0 creates nothing"
        );
        let made = store.raise_at(0, &key, &c, 40, window(300)).unwrap();
        assert_eq!((made.count, made.reset), (10, Duration::from_millis(300)));
        assert_eq!(made.deadline, NonZeroU64::new(300 * MS));
        let spend = store.spend_at(MS, &key, &[c], Spend::cost(0)).unwrap()[0];
        assert!(spend.count > 10, "full");
        // The provider's reset is later than the quota's window: the window.
        let other = Key::new("other");
        let made = store.raise_at(0, &other, &c, 4, window(5000)).unwrap();
        assert_eq!((made.count, made.reset), (4, Duration::from_millis(1000)));
        // A window that closed: a new one, from the raise.
        let again = store
            .raise_at(2000 * MS, &other, &c, 2, window(100))
            .unwrap();
        assert_eq!((again.count, again.reset), (2, Duration::from_millis(100)));
        // After a reset, a window opened in the same instant is another one.
        assert!(store.remove_at(2000 * MS, "n", &other));
        let fresh = store
            .raise_at(2000 * MS, &other, &c, 2, window(100))
            .unwrap();
        assert_ne!(fresh.deadline, again.deadline);
    }
}
