//! A backend of your own, written from scratch, that passes the whole
//! suite: counters in a `HashMap` behind a `Mutex`, with nothing but the
//! standard library. Copy it as the start of yours.
//!
//! Each call takes the lock once, so each is one atomic step, as the
//! [contract] asks; a store shared between processes does the same with
//! its own atomic step (a script, a transaction). What the contract asks of
//! a window, and how this map keeps it:
//!
//! - a counter's lifetime is set when its window opens and never changed:
//!   the window's deadline is stored beside the count, and a hit only adds
//!   to the count;
//! - a refund or an amend applies only to the window its hit names by its
//!   deadline, while that window lives; it never creates a counter, and never
//!   takes a count below zero;
//! - a window opened right after a reset must not be taken for the one the
//!   reset removed, even when both close in the same nanosecond: the map
//!   remembers the last removed deadline and opens such a window a
//!   nanosecond earlier (as the crate's `MemoryBackend` does);
//! - a spend is all or nothing over its counters, and a lockout is pinned to
//!   the first denial, beside the counter, so that it outlives the window.
//!
//! The map holds counts, never text, so it has no corrupt counter to report
//! and no audit: those scenarios are not applicable. Its test reads what it
//! stores ([`Ability::ReadStored`](crate::Ability::ReadStored)), so the
//! scenarios on the stored lifetime run too.
//!
//! ```
//! use std::collections::HashMap;
//! use std::future::{Ready, ready};
//! use std::num::NonZeroU64;
//! use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
//! use std::time::{Duration, Instant};
//!
//! use tower_pinned_window::Quota;
//! use tower_pinned_window::backend::{Amend, Backend, BackendError, Counter, Hit, Hits, Spend, Spending};
//! use tower_pinned_window::key::Key;
//!
//! /// Counters in a map behind one lock. Clones share the map.
//! #[derive(Clone, Debug)]
//! pub struct MapBackend {
//!     state: Arc<Mutex<State>>,
//!     /// The clock's zero: deadlines are nanoseconds since then.
//!     epoch: Instant,
//! }
//!
//! #[derive(Debug, Default)]
//! struct State {
//!     entries: HashMap<(String, Key), Entry>,
//!     /// The deadline of the last live window a reset or a clear removed.
//!     removed: u64,
//!     /// The size at which closed entries are next dropped.
//!     sweep_at: usize,
//! }
//!
//! /// One counter and its lockout. A closed window or an ended lockout is
//! /// dropped when the entry is read, as if it were not there.
//! #[derive(Debug, Default, Clone, Copy)]
//! struct Entry {
//!     /// The live window: its count and its deadline.
//!     window: Option<(u64, u64)>,
//!     /// The end of a lockout.
//!     locked_until: Option<u64>,
//! }
//!
//! impl Entry {
//!     fn expire(&mut self, now: u64) {
//!         self.window = self.window.filter(|&(_, deadline)| deadline > now);
//!         self.locked_until = self.locked_until.filter(|&end| end > now);
//!     }
//! }
//!
//! impl State {
//!     /// The entry of `namespace` and `key` as it stands at `now`.
//!     fn entry(&mut self, now: u64, namespace: &str, key: &Key) -> &mut Entry {
//!         let entry = self
//!             .entries
//!             .entry((namespace.to_owned(), key.clone()))
//!             .or_default();
//!         entry.expire(now);
//!         entry
//!     }
//!
//!     /// The deadline of a window of `quota` opened at `now`.
//!     fn open(&self, now: u64, quota: Quota) -> u64 {
//!         let deadline = now.saturating_add(nanos(quota.window().as_duration()));
//!         if deadline == self.removed {
//!             deadline - 1
//!         } else {
//!             deadline
//!         }
//!     }
//! }
//!
//! fn nanos(duration: Duration) -> u64 {
//!     u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
//! }
//!
//! impl Default for MapBackend {
//!     fn default() -> Self {
//!         Self::new()
//!     }
//! }
//!
//! impl MapBackend {
//!     /// An empty map.
//!     pub fn new() -> Self {
//!         Self {
//!             state: Arc::default(),
//!             epoch: Instant::now(),
//!         }
//!     }
//!
//!     /// The time and the map, locked; now and then, closed entries are
//!     /// dropped (amortised: when the map has doubled since the last time).
//!     fn lock(&self) -> (u64, MutexGuard<'_, State>) {
//!         let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
//!         let now = nanos(self.epoch.elapsed());
//!         if state.entries.len() >= state.sweep_at {
//!             state.entries.retain(|_, entry| {
//!                 entry.expire(now);
//!                 entry.window.is_some() || entry.locked_until.is_some()
//!             });
//!             state.sweep_at = (2 * state.entries.len()).max(1024);
//!         }
//!         (now, state)
//!     }
//!
//!     /// The count and deadline stored for `namespace` and `key`, for tests.
//!     pub fn stored(&self, namespace: &str, key: &Key) -> Option<(u64, u64)> {
//!         let (now, mut state) = self.lock();
//!         state.entry(now, namespace, key).window
//!     }
//! }
//!
//! impl Backend for MapBackend {
//!     type Future = Ready<Result<Hits, BackendError>>;
//!     type Refund = Ready<Result<bool, BackendError>>;
//!
//!     fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future {
//!         let (now, mut state) = self.lock();
//!         let hits = counters.iter().map(|counter| {
//!             let opened = state.open(now, counter.quota);
//!             let entry = state.entry(now, counter.namespace, key);
//!             let (count, deadline) = entry.window.get_or_insert((0, opened));
//!             *count = count.saturating_add(1);
//!             Hit {
//!                 count: *count,
//!                 reset: Duration::from_nanos(*deadline - now),
//!                 deadline: NonZeroU64::new(*deadline),
//!             }
//!         });
//!         ready(Ok(hits.collect()))
//!     }
//!
//!     fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund {
//!         self.amend(namespace, key, hit, Amend::Refund(1))
//!     }
//!
//!     async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
//!         let (now, mut state) = self.lock();
//!         let window = state.entry(now, namespace, key).window;
//!         Ok(window.map(|(count, deadline)| Hit {
//!             count,
//!             reset: Duration::from_nanos(deadline - now),
//!             deadline: None,
//!         }))
//!     }
//!
//!     async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
//!         let (now, mut state) = self.lock();
//!         let entry = state.entry(now, namespace, key);
//!         let (window, lock) = (entry.window.take(), entry.locked_until.take());
//!         if let Some((_, deadline)) = window {
//!             state.removed = deadline;
//!         }
//!         Ok(window.is_some() || lock.is_some())
//!     }
//! }
//!
//! impl Spending for MapBackend {
//!     fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Self::Future {
//!         let (now, mut state) = self.lock();
//!         let found: Vec<Entry> = counters
//!             .iter()
//!             .map(|c| *state.entry(now, c.namespace, key))
//!             .collect();
//!         // Each counter's cost: the first's own unit when the spend has one.
//!         let need = |i: usize| spend.cost_of(i).max(1);
//!         let count = |entry: &Entry| entry.window.map_or(0, |(count, _)| count);
//!         let fits = |i: usize, counter: &Counter<'_>, entry: &Entry| {
//!             entry.locked_until.is_none()
//!                 && count(entry)
//!                     .checked_add(need(i))
//!                     .is_some_and(|n| n <= counter.quota.limit())
//!         };
//!         let all_fit = (0..counters.len()).all(|i| fits(i, &counters[i], &found[i]));
//!         let mut hits = Hits::with_capacity(counters.len());
//!         for (i, (counter, found)) in counters.iter().zip(&found).enumerate() {
//!             let cost = spend.cost_of(i);
//!             // Time left until `end`, or a whole window when there is none.
//!             let left = |end: Option<u64>| {
//!                 Duration::from_nanos(
//!                     end.map_or(nanos(counter.quota.window().as_duration()), |end| end - now),
//!                 )
//!             };
//!             let window_end = found.window.map(|(_, deadline)| deadline);
//!             hits.push(if !all_fit && fits(i, counter, found) {
//!                 // It fits, another counter does not: nothing is spent.
//!                 Hit {
//!                     count: count(found).saturating_add(cost),
//!                     reset: left(window_end),
//!                     deadline: None,
//!                 }
//!             } else if !all_fit {
//!                 // It does not fit: locked from this first denial, if asked.
//!                 let mut until = found.locked_until;
//!                 if let (None, Some(block)) = (until, spend.block) {
//!                     let end = now.saturating_add(nanos(block.as_duration()));
//!                     state.entry(now, counter.namespace, key).locked_until = Some(end);
//!                     until = Some(end);
//!                 }
//!                 // What stands in its way (at least the limit when
//!                 // locked out), plus what it asked for.
//!                 let stands = match until {
//!                     Some(_) => count(found).max(counter.quota.limit()),
//!                     None => count(found),
//!                 };
//!                 Hit {
//!                     count: stands.saturating_add(need(i)),
//!                     reset: left(until.or(window_end)),
//!                     deadline: None,
//!                 }
//!             } else if found.window.is_some() || cost > 0 || spend.open {
//!                 // Every counter fits: add the cost, opening the window if need be.
//!                 let opened = state.open(now, counter.quota);
//!                 let entry = state.entry(now, counter.namespace, key);
//!                 let (count, deadline) = entry.window.get_or_insert((0, opened));
//!                 *count = count.saturating_add(cost);
//!                 Hit {
//!                     count: *count,
//!                     reset: Duration::from_nanos(*deadline - now),
//!                     deadline: NonZeroU64::new(*deadline),
//!                 }
//!             } else {
//!                 // A check (cost 0) on no counter creates nothing.
//!                 Hit {
//!                     count: 0,
//!                     reset: left(None),
//!                     deadline: None,
//!                 }
//!             });
//!         }
//!         ready(Ok(hits))
//!     }
//!
//!     fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Self::Refund {
//!         let Some(deadline) = hit.deadline.map(NonZeroU64::get) else {
//!             return ready(Ok(false)); // Nothing was counted for this hit.
//!         };
//!         let (now, mut state) = self.lock();
//!         let entry = state.entry(now, namespace, key);
//!         // Only the window the hit was counted in, while it lives.
//!         let Some((count, _)) = entry.window.as_mut().filter(|(_, d)| *d == deadline) else {
//!             return ready(Ok(false));
//!         };
//!         let changed = match amend {
//!             Amend::Refund(n) => {
//!                 let taken = n.min(*count);
//!                 *count -= taken;
//!                 taken > 0
//!             }
//!             Amend::Charge(n) => {
//!                 *count = count.saturating_add(n);
//!                 n > 0
//!             }
//!             Amend::Clear => {
//!                 entry.window = None;
//!                 state.removed = deadline;
//!                 true
//!             }
//!             // An amend this backend does not know changes nothing.
//!             _ => false,
//!         };
//!         ready(Ok(changed))
//!     }
//! }
//!
//! // The test, in your crate a `#[test]`: the whole suite against it.
//! use tower_pinned_window_testkit::{self as testkit, Ability, Store, Stored};
//!
//! /// A new, empty map for each scenario.
//! struct Maps;
//!
//! impl Store for Maps {
//!     type Backend = MapBackend;
//!
//!     async fn fresh(&self) -> MapBackend {
//!         MapBackend::new()
//!     }
//!
//!     fn abilities(&self) -> &'static [Ability] {
//!         &[Ability::ReadStored]
//!     }
//!
//!     async fn stored(&self, backend: &MapBackend, namespace: &str, key: &Key) -> Option<Stored> {
//!         Some(match backend.stored(namespace, key) {
//!             Some((count, deadline)) => Stored::Value {
//!                 value: count.to_string(),
//!                 expiry: Some(deadline),
//!             },
//!             None => Stored::Absent,
//!         })
//!     }
//! }
//!
//! fn main() {
//!     let runtime = tokio::runtime::Builder::new_multi_thread()
//!         .worker_threads(2)
//!         .enable_all()
//!         .build()
//!         .unwrap();
//!     // A broken promise panics, naming its scenario.
//!     let report = runtime.block_on(testkit::run_all(&Maps));
//!     // Every scenario is accounted for: it passed, or it is not applicable.
//!     let mut seen: Vec<&str> = report
//!         .passed
//!         .iter()
//!         .chain(&report.not_applicable)
//!         .copied()
//!         .collect();
//!     let mut all: Vec<&str> = testkit::scenarios::<Maps>()
//!         .iter()
//!         .map(|s| s.name)
//!         .collect();
//!     seen.sort_unstable();
//!     all.sort_unstable();
//!     assert_eq!(seen, all);
//!     // Not applicable: what needs a corrupt counter or an audit.
//!     assert_eq!(
//!         report.not_applicable,
//!         [
//!             "corrupt_counters_fail_and_are_left_as_they_are",
//!             "the_audit_finds_nothing_after_the_contract",
//!             "the_audit_reports_corrupt_counters",
//!         ]
//!     );
//!     assert_eq!(report.passed.len(), all.len() - 3);
//! }
//! ```
//!
//! [contract]: tower_pinned_window::backend#the-contract
