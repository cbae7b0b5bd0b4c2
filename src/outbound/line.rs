//! The calls of this process that wait for a budget: one line per budget
//! key, served in arrival order.
//!
//! While the budget is spent, one call of a line, its head, asks the store
//! (once the window ends); the others sleep. When the store admits the
//! head and says how much room is left, the head lets the calls behind it
//! that fit in that room ask at once, together (a wave), so a line is
//! served as fast as a process whose calls find room on their own. The
//! next head is chosen only once the wave has its answers: a call of the
//! wave that the store turned away (another process took the room) goes
//! back to its place at the front.
//!
//! A call joins a line only once the budget turned it away, or when others
//! of its key already wait here: a call that finds room never touches the
//! line, so a budget with room costs one store call and no lock beyond a
//! counter's read.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::key::Key;
use crate::quota::Quota;

use super::stored::Quotas;

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
struct Line {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The calls waiting for their turn, in arrival order.
    queue: VecDeque<Arc<Ticket>>,
    /// A call is the head: it asks the store, or sleeps until the budget
    /// returns.
    head: bool,
    /// Calls of the last wave that have no answer yet.
    wave: usize,
    /// What the calls in the line cost together.
    queued: u64,
    /// When the store said the budget returns, from its last denial.
    opens_at: Option<Instant>,
    /// The quotas the store's last denial was made under (none: the line
    /// waits for something else, the provider's word or a slot). A limit
    /// held in the store raised above them lets the head ask before
    /// `opens_at`.
    under: Option<Quotas>,
    /// The next call's number: its place in arrival order.
    next: u64,
    /// How many times the store turned a call of the line away, or said
    /// when the budget returns: each is a window the line missed, and the
    /// calls in the queue judge again whether they can be served in time.
    missed: u64,
    /// What the line won: the cost (at least 1) of each call admitted
    /// through it.
    won: u64,
    /// The distinct store windows the line was turned away in; the first
    /// is the one that was spent when the line formed.
    windows: u64,
    /// When the window of the last one counted in `windows` ends, as the
    /// store said.
    window_ends: Option<Instant>,
    /// The budget's window: two denials whose ends are less than half of
    /// it apart come from one store window.
    window: Duration,
}

/// What a call of the line may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Ask the store, sleeping first until the budget returns when the
    /// store said when.
    Head,
    /// Ask the store at once: the head saw room for this call.
    Wave,
}

/// Why a waiting call woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Its turn came.
    Turn(Turn),
    /// The line missed a window (the store turned a call of it away): the
    /// call judges again whether it can still be served in time.
    Missed,
}

#[derive(Debug)]
struct Ticket {
    number: u64,
    cost: u64,
    wake: Notify,
    /// Set by the line when the call leaves the queue.
    turn: Mutex<Option<Turn>>,
    /// The line's `missed` when the call last judged its chances.
    seen: AtomicU64,
}

impl Lines {
    /// Whether calls of `key` wait here: a new call of that key then joins
    /// the line behind them rather than asking the store first.
    #[inline]
    pub(crate) fn busy(&self, key: &Key) -> bool {
        self.waiting.load(Ordering::Acquire) > 0 && lock(&self.lines).contains_key(key)
    }

    /// A place at the back of `key`'s line for a call of `cost`, or `None`
    /// when `max_waiters` calls already wait in this process. What the line
    /// costs ahead of it is returned with it.
    pub(crate) fn join(
        self: &Arc<Self>,
        key: &Key,
        cost: u64,
        max_waiters: usize,
        window: Duration,
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
        let (ticket, ahead) = {
            let mut state = lock(&line.state);
            state.window = window;
            let ticket = Arc::new(Ticket {
                number: state.next,
                cost,
                wake: Notify::new(),
                turn: Mutex::new(None),
                seen: AtomicU64::new(state.missed),
            });
            state.next += 1;
            let ahead = state.queued;
            state.queued = state.queued.saturating_add(cost);
            state.queue.push_back(Arc::clone(&ticket));
            (ticket, ahead)
        };
        Some((
            Place {
                lines: Arc::clone(self),
                key: key.clone(),
                line,
                ticket,
            },
            ahead,
        ))
    }

    /// The calls waiting in each key's line, its head included (a
    /// snapshot, for the operator's service); keys with none are left out.
    #[cfg(feature = "operator")]
    pub(crate) fn waiting_by_key(&self) -> Vec<(Key, usize)> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        // The lines' lock, then each line's: no one holds a line's lock
        // while it waits for the lines' (`join` and `Drop` take them one
        // after the other), and no line is cloned, which `Drop` counts on.
        let lines = lock(&self.lines);
        lines
            .iter()
            .map(|(key, line)| {
                let state = lock(&line.state);
                (key.clone(), state.queue.len() + usize::from(state.head))
            })
            .filter(|(_, waiting)| *waiting > 0)
            .collect()
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
/// out, hands the head on, and the last one out removes the line.
#[derive(Debug)]
pub(crate) struct Place {
    lines: Arc<Lines>,
    key: Key,
    line: Arc<Line>,
    ticket: Arc<Ticket>,
}

impl Place {
    /// Waits for the call's turn (the head of the line, or a wave's), or
    /// for a window the line missed.
    pub(crate) async fn turn(&self) -> Wake {
        loop {
            {
                let mut state = lock(&self.line.state);
                if let Some(turn) = *lock(&self.ticket.turn) {
                    return Wake::Turn(turn);
                }
                if self.ticket.seen.swap(state.missed, Ordering::Relaxed) != state.missed {
                    return Wake::Missed;
                }
                let first = state
                    .queue
                    .front()
                    .is_some_and(|front| Arc::ptr_eq(front, &self.ticket));
                if first && !state.head && state.wave == 0 {
                    state.queue.pop_front();
                    state.head = true;
                    *lock(&self.ticket.turn) = Some(Turn::Head);
                    return Wake::Turn(Turn::Head);
                }
            }
            // A wake-up sent before this wait is kept for it.
            self.ticket.wake.notified().await;
        }
    }

    /// When the budget returns, as the store last said, if it is later
    /// than `now`.
    pub(crate) fn opens_at(&self, now: Instant) -> Option<Instant> {
        lock(&self.line.state).opens_at.filter(|at| *at > now)
    }

    /// The store said the budget returns at `at`.
    pub(crate) fn closed_until(&self, at: Instant) {
        missed(&mut lock(&self.line.state), at);
    }

    /// The store's last denial (just told with [`denied`](Self::denied) or
    /// [`closed_until`](Self::closed_until)) was made under `quotas`,
    /// whose window tells the line's store windows apart from now on.
    pub(crate) fn under(&self, quotas: Quotas) {
        let mut state = lock(&self.line.state);
        state.window = quotas.cost().window().as_duration();
        state.under = Some(quotas);
    }

    /// Whether `quotas` raise a limit above the one the store last turned
    /// the line away under: the budget may have room before the window
    /// ends.
    pub(crate) fn raised(&self, quotas: &Quotas) -> bool {
        lock(&self.line.state)
            .under
            .is_some_and(|under| quotas.raised_from(&under))
    }

    /// What the calls of the line ahead of this one cost together: the
    /// head's and a wave's, and those before it in the queue.
    pub(crate) fn ahead(&self) -> u64 {
        let state = lock(&self.line.state);
        let behind: u64 = state
            .queue
            .iter()
            .filter(|other| other.number > self.ticket.number)
            .map(|other| other.cost)
            .sum();
        state
            .queued
            .saturating_sub(behind)
            .saturating_sub(self.ticket.cost)
    }

    /// The store turned the call away until `at`. The head stays the head;
    /// a call of a wave goes back to its place in the line.
    pub(crate) fn denied(&self, at: Instant) {
        let mut state = lock(&self.line.state);
        missed(&mut state, at);
        let mut turn = lock(&self.ticket.turn);
        if *turn == Some(Turn::Wave) {
            *turn = None;
            let place = state
                .queue
                .iter()
                .position(|other| other.number > self.ticket.number)
                .unwrap_or(state.queue.len());
            state.queue.insert(place, Arc::clone(&self.ticket));
            drop(turn);
            state.wave -= 1;
            wake_next(&state);
        }
    }

    /// The store admitted the call with `room` left in its window: a head
    /// lets the calls behind it that fit in it ask at once, and the next
    /// head is chosen once they have their answers.
    pub(crate) fn admitted(&self, room: u64) {
        let mut state = lock(&self.line.state);
        state.won = state.won.saturating_add(self.ticket.cost.max(1));
        let turn = lock(&self.ticket.turn).take();
        match turn {
            Some(Turn::Head) => {
                state.head = false;
                state.opens_at = None;
                let mut room = room;
                while let Some(next) = state.queue.front() {
                    let need = next.cost.max(1);
                    if need > room {
                        break;
                    }
                    room -= need;
                    let next = state.queue.pop_front().expect("a front");
                    *lock(&next.turn) = Some(Turn::Wave);
                    next.wake.notify_one();
                    state.wave += 1;
                }
            }
            Some(Turn::Wave) => state.wave -= 1,
            None => {}
        }
        wake_next(&state);
    }

    /// The earliest the budget can return for a call with `ahead` queued
    /// before it in this process, when the store said it is spent: the
    /// window that opens then serves the line's share of it, the next one
    /// opens a window later, and so on. `None` when the store has not said
    /// so, or its word has passed: there may be room now.
    ///
    /// The share is `limit` (the whole window) until the line has been
    /// turned away in two store windows after the one that was spent when
    /// it formed: it has then had whole windows to win in. From then on it
    /// is what the line won in those windows, plus `limit` for one window
    /// more, per window counted so (at most `limit`): the whole window
    /// counts as one window seen, so a line that lost a few windows in a
    /// row (a window often goes whole to one process's wave) is not judged
    /// unable to win any. The share is what other processes left this one
    /// while its line waited, so a drop in their demand could serve the
    /// call sooner than this says.
    pub(crate) fn earliest(&self, now: Instant, ahead: u64, quota: Quota) -> Option<Instant> {
        let state = lock(&self.line.state);
        let opens_at = state.opens_at.filter(|at| *at > now)?;
        // A call of cost 0 needs a unit of room, as a check does.
        let need = ahead.saturating_add(self.ticket.cost.max(1));
        let limit = quota.limit().max(1);
        let window = quota.window().as_duration();
        // Whole windows the line could win in, and what it won in them,
        // with one window won whole beside them.
        let (won, whole) = match state.windows.checked_sub(1) {
            Some(whole) if whole >= 2 => (state.won.saturating_add(limit), whole + 1),
            _ => (limit, 1),
        };
        let windows = if won >= limit.saturating_mul(whole) {
            (need - 1) / limit
        } else {
            // ceil(need / (won / whole)) - 1, in integers; won >= limit > 0.
            let need = u128::from(need) * u128::from(whole);
            u64::try_from((need - 1) / u128::from(won)).unwrap_or(u64::MAX)
        };
        let windows = u32::try_from(windows).unwrap_or(u32::MAX);
        let later = window.saturating_mul(windows);
        // Past what the clock can say: as late as it can.
        Some(
            opens_at
                .checked_add(later)
                .or_else(|| opens_at.checked_add(Duration::from_secs(u64::from(u32::MAX))))
                .unwrap_or(opens_at),
        )
    }
}

/// The line missed a window: the store says the budget returns at `at`.
/// Every call in the queue wakes to judge again whether it can be served
/// in time.
///
/// A denial whose `at` is more than half a window after the last window
/// counted is a new store window (the calls of one wave turned away in one
/// window are all told about the same end).
fn missed(state: &mut State, at: Instant) {
    let new = state
        .window_ends
        .is_none_or(|ends| at.saturating_duration_since(ends) > state.window / 2);
    if new {
        state.windows += 1;
        state.window_ends = Some(at);
    }
    state.opens_at = Some(at);
    state.under = None;
    state.missed += 1;
    for ticket in &state.queue {
        ticket.wake.notify_one();
    }
}

/// Wakes the first call of the line when it may become the head.
fn wake_next(state: &State) {
    if !state.head
        && state.wave == 0
        && let Some(front) = state.queue.front()
    {
        front.wake.notify_one();
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.line.state);
            state.queued = state.queued.saturating_sub(self.ticket.cost);
            match lock(&self.ticket.turn).take() {
                Some(Turn::Head) => state.head = false,
                Some(Turn::Wave) => state.wave -= 1,
                None => state
                    .queue
                    .retain(|other| !Arc::ptr_eq(other, &self.ticket)),
            }
            wake_next(&state);
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

    const WINDOW: Duration = Duration::from_secs(10);

    fn quota(limit: u64) -> Quota {
        Quota::new(limit, WINDOW).unwrap()
    }

    #[test]
    fn a_line_holds_at_most_max_waiters_and_goes_when_its_last_call_leaves() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        assert!(!lines.busy(&key));
        let (first, ahead) = lines.join(&key, 3, 2, WINDOW).unwrap();
        assert_eq!(ahead, 0);
        assert!(lines.busy(&key));
        let (second, ahead) = lines.join(&key, 4, 2, WINDOW).unwrap();
        assert_eq!(ahead, 3);
        assert!(
            lines.join(&Key::new("other"), 1, 2, WINDOW).is_none(),
            "full"
        );
        drop(first);
        assert!(lines.busy(&key));
        let (third, ahead) = lines.join(&key, 1, 2, WINDOW).unwrap();
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
        let (place, _) = lines.join(&key, 1, 10, WINDOW).unwrap();
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

    /// The line counts what it won and the store windows it was turned
    /// away in (one per window, however many of its calls were): once it
    /// has had two whole windows, a call's windows are counted at the
    /// line's share of each (with one window won whole beside them), not
    /// at the whole limit.
    #[tokio::test(start_paused = true)]
    async fn the_earliest_return_counts_the_share_of_each_window_the_line_won() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let places: Vec<Place> = (0..8)
            .map(|_| lines.join(&key, 1, 10, WINDOW).unwrap().0)
            .collect();
        let place = &places[7];
        // The window that was spent when the line formed.
        places[0].closed_until(t0 + secs(10));
        places[1].denied(t0 + secs(10));
        assert_eq!(
            place.earliest(t0, 5, quota(4)),
            Some(t0 + secs(10) + secs(10)),
            "the whole limit: 6 need two windows"
        );
        // The first whole window: the line wins 2 of 4, then a wave's two
        // calls are turned away with the same end (one window, not two).
        places[0].admitted(0);
        places[1].admitted(0);
        places[2].denied(t0 + secs(20));
        places[3].denied(t0 + secs(20) + Duration::from_millis(3));
        let opens = t0 + secs(20) + Duration::from_millis(3);
        assert_eq!(
            place.earliest(t0, 5, quota(4)),
            Some(opens + secs(10)),
            "one whole window is not enough to judge a share by"
        );
        // The second whole window: 2 of 4 again.
        places[2].admitted(0);
        places[3].admitted(0);
        places[4].denied(t0 + secs(30));
        let opens = t0 + secs(30);
        assert_eq!(
            place.earliest(t0, 5, quota(4)),
            Some(opens + secs(20)),
            "(4 + 4) won in (2 + 1) windows: 6 need three windows"
        );
        assert_eq!(place.earliest(t0, 1, quota(4)), Some(opens));
        assert_eq!(place.earliest(t0, 2, quota(4)), Some(opens + secs(10)));
        // A share above the limit counts as the limit.
        assert_eq!(
            place.earliest(t0, 5, quota(1)),
            Some(opens + secs(50)),
            "at most the limit per window"
        );
        drop(places);

        // A line that wins nothing in its whole windows: a third of the
        // limit a window (the whole limit, once, over three windows).
        let places: Vec<Place> = (0..2)
            .map(|_| lines.join(&key, 1, 10, WINDOW).unwrap().0)
            .collect();
        let place = &places[1];
        places[0].closed_until(t0 + secs(10));
        places[0].closed_until(t0 + secs(20));
        assert_eq!(place.earliest(t0, 4, quota(4)), Some(t0 + secs(30)));
        places[0].closed_until(t0 + secs(30));
        assert_eq!(
            place.earliest(t0, 4, quota(4)),
            Some(t0 + secs(60)),
            "5 at 4 per 3 windows: the fourth window"
        );
        drop(places);

        // The figures start over with the next line.
        let (fresh, _) = lines.join(&key, 1, 10, WINDOW).unwrap();
        fresh.closed_until(t0 + secs(40));
        assert_eq!(fresh.earliest(t0, 0, quota(4)), Some(t0 + secs(40)));
    }

    /// The head's room lets the calls that fit ask together; the next head
    /// waits for their answers, and one turned away goes back to the front.
    #[tokio::test]
    async fn a_head_with_room_sends_a_wave_and_the_line_keeps_its_order() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        let places: Vec<Place> = (0..5)
            .map(|_| lines.join(&key, 1, 10, WINDOW).unwrap().0)
            .collect();
        let head = Wake::Turn(Turn::Head);
        let wave = Wake::Turn(Turn::Wave);
        assert_eq!(places[0].turn().await, head);
        places[0].admitted(2);
        assert_eq!(places[1].turn().await, wave);
        assert_eq!(places[2].turn().await, wave);
        let next = |n: usize| {
            let place = &places[n];
            async move {
                tokio::time::timeout(Duration::from_millis(20), place.turn())
                    .await
                    .ok()
            }
        };
        assert_eq!(next(3).await, None, "no head while the wave has no answers");
        places[1].admitted(1);
        assert_eq!(next(3).await, None);
        // Another process took the room: the wave's second call is turned
        // away, and goes back before the others, which judge their chances
        // again (a window missed) and wait on.
        places[2].denied(Instant::now() + Duration::from_secs(1));
        assert_eq!(next(3).await, Some(Wake::Missed));
        assert_eq!(next(4).await, Some(Wake::Missed));
        assert_eq!(next(3).await, None, "behind the call turned away");
        assert_eq!(places[2].turn().await, Wake::Missed);
        assert_eq!(places[2].turn().await, head);
        assert!(places[2].opens_at(Instant::now()).is_some());
        drop(places);
        assert!(!lines.busy(&key));
    }

    /// What is ahead of a call: the head's cost and the queue's before it.
    #[tokio::test]
    async fn a_call_counts_the_costs_ahead_of_it() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        let places: Vec<Place> = [2, 3, 5, 7]
            .into_iter()
            .map(|cost| lines.join(&key, cost, 10, WINDOW).unwrap().0)
            .collect();
        assert_eq!(places[0].turn().await, Wake::Turn(Turn::Head));
        let ahead: Vec<u64> = places.iter().map(Place::ahead).collect();
        assert_eq!(ahead, vec![0, 2, 5, 10]);
    }

    /// Under limits held in the store: a limit raised above the one the
    /// store turned the line away under may let the head ask before the
    /// window ends; a lower one, the same one, or a denial for another
    /// reason (the provider's word) never does. A new window length counts
    /// from the window the store said ends (its deadline never moves).
    #[tokio::test(start_paused = true)]
    async fn a_raised_limit_is_news_and_a_new_window_counts_from_the_next() {
        let lines = Arc::new(Lines::default());
        let key = Key::new("k");
        let now = Instant::now();
        let (place, _) = lines.join(&key, 1, 10, WINDOW).unwrap();
        let quotas = |limit, tokens: Option<u64>| Quotas {
            calls: quota(limit),
            tokens: tokens.map(quota),
        };
        assert!(!place.raised(&quotas(9, None)), "never turned away");
        place.denied(now + Duration::from_secs(2));
        place.under(quotas(5, Some(50)));
        assert!(place.raised(&quotas(6, Some(50))));
        assert!(place.raised(&quotas(5, Some(51))), "the tokens' raised");
        assert!(!place.raised(&quotas(5, Some(50))));
        assert!(!place.raised(&quotas(4, Some(40))), "lowered");
        // Closed by the provider's word: no limit opens it.
        place.denied(now + Duration::from_secs(3));
        assert!(!place.raised(&quotas(9, Some(90))));

        // The window shortened from 10 s to 1 s: the window the store
        // pinned still ends when it said, the next ones are a second.
        let opens = now + Duration::from_secs(3);
        let second = Quota::new(5, Duration::from_secs(1)).unwrap();
        assert_eq!(place.earliest(now, 4, second), Some(opens));
        assert_eq!(
            place.earliest(now, 12, second),
            Some(opens + Duration::from_secs(2)),
            "the 13th of 5 a second: two short windows after"
        );
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
