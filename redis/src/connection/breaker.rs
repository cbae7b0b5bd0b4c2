//! The circuit breaker: after repeated failures the backend answers
//! [`BackendError::CircuitOpen`](tower_pinned_window::backend::BackendError::CircuitOpen)
//! at once, and lets one probe through at a time: the first
//! [`BREAKER_FIRST_PROBE`] after it opened, then twice as long after each
//! probe that failed, up to the configured cool-down. A short fault (a
//! stalled master) is thus over soon after it ends, and a long outage gets
//! a probe only every cool-down.
//!
//! Two signals from outside let a probe through sooner: a Sentinel
//! connection that has connected to a master since the breaker opened (a
//! failover found the new one), and, on a Cluster, `CLUSTER INFO` turning
//! from `cluster_state:fail` back to `ok` (read in the background while a
//! breaker is open). A Cluster's refusal (`CLUSTERDOWN`, `TRYAGAIN`,
//! `MASTERDOWN`) is the Cluster's state, not its master's failure: it
//! counts neither way, and reaches the caller as
//! [`BackendError::ClusterDown`](tower_pinned_window::backend::BackendError::ClusterDown).
//!
//! Every command reaches its breaker through the connection wrapper
//! ([`Guarded`](super::guarded::Guarded)), which picks the breaker from
//! the key the command is for; the Cluster's state is read by the Cluster
//! watcher ([`cluster_watch`](super::cluster_watch)), and failures are
//! told apart by [`classify`](super::classify).
//!
//! On a Cluster connection there is one breaker per master: the breaker
//! learns which master serves each slot from `CLUSTER SLOTS` (its
//! [`SlotMap`], read on the first command, then at most every
//! [`MAP_REFRESH`](super::slot_map::MAP_REFRESH)), and until it knows, there
//! is one per range of [`SLOTS_PER_RANGE`] consecutive slots. A failing
//! master opens only its own breaker, and the healthy masters' keys go on as
//! before. On any other connection there is one breaker.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::redis::{RedisError, Value};

use super::classify::{is_cluster_state, is_outage};
use super::slot::{CLUSTER_SLOTS, key_slot};
use super::slot_map::{MAX_NODES, SlotMap};

/// Consecutive failures that open a breaker, unless configured otherwise.
///
/// # Examples
///
/// The defaults, set again by hand (see
/// [`RedisBackendBuilder::breaker`](crate::RedisBackendBuilder::breaker)):
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_pinned_window_redis::{
///     DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES, RedisBackend,
/// };
/// use tower_pinned_window_redis::redis::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let connection = client.get_multiplexed_async_connection().await?;
/// let backend = RedisBackend::builder(connection)
///     .breaker(DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_COOLDOWN)
///     .build();
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;

/// The longest an open breaker answers at once before it lets a probe
/// through, unless configured otherwise: the first probe goes 25 ms
/// after it opened, and each probe that fails
/// doubles the wait, up to this. Example: [`DEFAULT_BREAKER_FAILURES`]'s.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_millis(500);

/// How long an open breaker waits before its first probe (or the cool-down,
/// when that is shorter). Each probe that fails doubles the wait, up to the
/// cool-down; a probe that succeeds closes the breaker and the next opening
/// starts from this again. A Redis frozen for 300 ms (`DEBUG SLEEP 0.3`)
/// is thus served again a probe's wait after it wakes, not a whole
/// cool-down.
pub(crate) const BREAKER_FIRST_PROBE: Duration = Duration::from_millis(25);

/// Consecutive Cluster slots that share one breaker until the backend knows
/// which master serves them (128 breakers for the 16384 slots). A master's
/// slots are ranges of consecutive slots, so all but the ranges that
/// straddle two masters belong to one master. See
/// [`RedisBackendBuilder::breaker`](crate::RedisBackendBuilder::breaker)
/// for the breaker's settings.
pub(crate) const SLOTS_PER_RANGE: u16 = 128;

/// A call dropped before it was answered counts as a failure only when it
/// had waited at least this long: the layer's timeout ran out on a store
/// that is slow or gone. A call dropped sooner was given up by its request
/// (the client went away, an HTTP/2 stream was reset), which says nothing
/// about the store, so it counts neither way; otherwise clients that
/// cancel their requests could open the breaker of a healthy store.
pub(crate) const BREAKER_SLOW_CALL: Duration = Duration::from_millis(10);

/// The breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BreakerConfig {
    pub(crate) failures: u32,
    pub(crate) cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: DEFAULT_BREAKER_FAILURES,
            cooldown: DEFAULT_BREAKER_COOLDOWN,
        }
    }
}

/// One breaker.
#[derive(Debug, Default)]
struct Breaker {
    /// Consecutive failures while closed.
    failures: AtomicU32,
    /// Milliseconds since the origin (plus one) until which the breaker is
    /// open; 0 while closed.
    open_until: AtomicU64,
    /// A probe is out.
    probing: AtomicBool,
    /// Probes failed in a row since the breaker opened: the wait before the
    /// next is [`BREAKER_FIRST_PROBE`] doubled that many times, at most the
    /// cool-down.
    failed_probes: AtomicU32,
    /// The connection's count of masters found ([`Breakers::found`]) when
    /// the breaker opened or its last probe failed.
    found_at: AtomicU64,
}

impl Breaker {
    /// Open until `until` (a probe's answer), unless a call let through
    /// before it opened has closed it meanwhile: an answer that came back
    /// since says more than the probe's.
    fn reopen(&self, until: u64) {
        let _ = self
            .open_until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open != 0).then_some(until)
            });
    }
}

/// How a call got past its breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    Closed,
    Probe,
}

/// The breakers of one backend.
#[derive(Debug)]
pub(crate) struct Breakers {
    config: BreakerConfig,
    origin: Instant,
    /// One; or on a Cluster, one per master (the first [`MAX_NODES`], in
    /// the order of the slot map's masters) and then one per slot range.
    breakers: Box<[Breaker]>,
    /// On a Cluster: which master serves each slot.
    map: Option<SlotMap>,
    /// On a Sentinel connection: how many times it has connected to a
    /// master. A breaker opened before the last one lets a probe through
    /// at once: the failover it waited out is over.
    found: Option<Arc<AtomicU64>>,
    /// On a Cluster: `CLUSTER INFO` is being watched in the background
    /// (while a breaker is open).
    watching: AtomicBool,
    /// On a Cluster: slots that moved off a master whose breaker is open,
    /// `(slot, former, new)`, not yet followed by the Cluster client.
    unfollowed: Mutex<Vec<(u16, usize, usize)>>,
}

impl Breakers {
    /// The breakers of a backend; `found` is a Sentinel connection's count
    /// of masters found (see [`Breakers::found`]).
    pub(crate) fn new(config: BreakerConfig, cluster: bool, found: Option<Arc<AtomicU64>>) -> Self {
        let count = if cluster {
            MAX_NODES + usize::from(CLUSTER_SLOTS / SLOTS_PER_RANGE)
        } else {
            1
        };
        Self {
            config,
            origin: Instant::now(),
            breakers: (0..count).map(|_| Breaker::default()).collect(),
            map: cluster.then(SlotMap::new),
            found,
            watching: AtomicBool::new(false),
            unfollowed: Mutex::new(Vec::new()),
        }
    }

    /// Whether these are the breakers of a Cluster connection (one per
    /// master, with a slot map).
    pub(super) fn is_cluster(&self) -> bool {
        self.map.is_some()
    }

    /// Take the watcher's turn ([`watch_cluster`](super::cluster_watch::watch_cluster)):
    /// `false` when one is running already.
    pub(super) fn start_watching(&self) -> bool {
        self.watching
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The watcher stopped (or could not start): the next may.
    pub(super) fn stop_watching(&self) {
        self.watching.store(false, Ordering::Release);
    }

    /// The connection's count of masters found, or 0 when it keeps none.
    fn found(&self) -> u64 {
        self.found
            .as_ref()
            .map_or(0, |found| found.load(Ordering::Acquire))
    }

    /// How long a breaker waits before its next probe, in milliseconds,
    /// after `failed` probes failed in a row: [`BREAKER_FIRST_PROBE`]
    /// doubled that many times, at most the cool-down, at least 1.
    fn wait(&self, failed: u32) -> u64 {
        let cooldown = u64::try_from(self.config.cooldown.as_millis()).unwrap_or(u64::MAX);
        let first = u64::try_from(BREAKER_FIRST_PROBE.as_millis()).unwrap_or(u64::MAX);
        first
            .saturating_mul(1 << failed.min(32))
            .min(cooldown)
            .max(1)
    }

    /// Whether any breaker is open.
    pub(super) fn any_open(&self) -> bool {
        self.breakers
            .iter()
            .any(|breaker| breaker.open_until.load(Ordering::Acquire) != 0)
    }

    /// The Cluster is whole again: every open breaker lets a probe through
    /// now, its wait back to [`BREAKER_FIRST_PROBE`]. When `first` (the
    /// first `ok` after `fail`), the slot map is read again on the next
    /// command (a replica may serve a failed master's slots now).
    pub(super) fn cluster_ok_again(&self, first: bool) {
        let now = self.now_ms();
        for breaker in &self.breakers {
            let until = breaker.open_until.load(Ordering::Acquire);
            if until > now {
                breaker.failed_probes.store(0, Ordering::Relaxed);
                let _ = breaker.open_until.compare_exchange(
                    until,
                    now,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
        if first {
            self.map_not_asked();
            tracing::info!("redis cluster state ok again: open breakers probe now");
        }
    }

    /// The breaker of `slot` on a Cluster: its master's, or its range's.
    fn for_slot(&self, map: &SlotMap, slot: u16) -> usize {
        map.master(slot)
            .unwrap_or_else(|| MAX_NODES + usize::from(slot / SLOTS_PER_RANGE))
    }

    /// What a log line calls breaker `index`.
    pub(super) fn name(&self, index: usize) -> String {
        let Some(map) = &self.map else {
            return "redis".into();
        };
        if index >= MAX_NODES {
            let start = (index - MAX_NODES) * usize::from(SLOTS_PER_RANGE);
            return format!("slots {start}-{}", start + usize::from(SLOTS_PER_RANGE) - 1);
        }
        map.address(index)
            .unwrap_or_else(|| format!("master {index}"))
    }

    /// Whether the slot map is due to be read (and now taken to be read).
    pub(super) fn map_due(&self) -> bool {
        self.map.as_ref().is_some_and(|map| map.due(self.now_ms()))
    }

    /// The slot map could not be asked for after all: due again.
    pub(super) fn map_not_asked(&self) {
        if let Some(map) = &self.map {
            map.not_asked();
        }
    }

    /// The time to ask for the slot map at, for [`map`](Self::map).
    pub(super) fn map_asked(&self) -> u64 {
        self.now_ms()
    }

    /// Take in a `CLUSTER SLOTS` reply to a question asked at `asked`
    /// ([`map_asked`](Self::map_asked)), from whichever read asked it (the
    /// periodic one or the Cluster watcher's). Slots that moved off a
    /// master whose breaker is open are kept, one per (former, new) master
    /// pair, for the watcher to make the Cluster client follow
    /// ([`unfollowed`](Self::unfollowed)): a read that found the move and
    /// dropped it would leave the client's map pointing at the silent
    /// master, with no later reply showing a change. See [`SlotMap::take`]:
    /// an answer to an older question than the last taken changes nothing.
    pub(super) fn map(&self, reply: &Value, asked: u64) {
        let Some(map) = &self.map else {
            return;
        };
        let moved = map.take(reply, asked);
        if moved.is_empty() {
            return;
        }
        let mut unfollowed = self.unfollowed.lock().unwrap_or_else(|e| e.into_inner());
        for (slot, from, to) in moved {
            if !self.is_open(from) {
                continue;
            }
            tracing::info!(
                from = %self.name(from),
                to = %self.name(to),
                "redis cluster: a silent master's slots have a new master; reading the slot map again"
            );
            unfollowed.retain(|&(_, f, t)| (f, t) != (from, to));
            unfollowed.push((slot, from, to));
        }
    }

    /// The moves off silent masters not yet followed by the Cluster client
    /// (see [`map`](Self::map)), taken out: the watcher puts back those it
    /// could not follow yet ([`unfollowed_again`](Self::unfollowed_again)).
    pub(super) fn unfollowed(&self) -> Vec<(u16, usize, usize)> {
        std::mem::take(&mut *self.unfollowed.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Moves the watcher could not follow yet: kept for its next round,
    /// unless a newer move of the same pair came in meanwhile.
    pub(super) fn unfollowed_again(&self, moves: Vec<(u16, usize, usize)>) {
        let mut unfollowed = self.unfollowed.lock().unwrap_or_else(|e| e.into_inner());
        for (slot, from, to) in moves {
            if !unfollowed.iter().any(|&(_, f, t)| (f, t) == (from, to)) {
                unfollowed.push((slot, from, to));
            }
        }
    }

    /// Whether breaker `index` is open now.
    pub(super) fn is_open(&self, index: usize) -> bool {
        self.breakers
            .get(index)
            .is_some_and(|breaker| breaker.open_until.load(Ordering::Acquire) != 0)
    }

    /// A master to ask about `slot` that serves neither it nor `from`, and
    /// whose breaker is closed: it answers `MOVED` (see the Cluster watcher,
    /// [`cluster_watch`](super::cluster_watch)).
    pub(super) fn bystander(&self, from: usize, to: usize) -> Option<String> {
        let map = self.map.as_ref()?;
        (0..MAX_NODES)
            .filter(|&index| index != from && index != to && !self.is_open(index))
            .find_map(|index| map.address(index))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// The breaker of the commands on `key`: by its slot on a Cluster (the
    /// slot is computed only there), the one breaker otherwise.
    pub(super) fn for_key(&self, key: &[u8]) -> usize {
        match &self.map {
            Some(map) => self.for_slot(map, key_slot(key)),
            None => 0,
        }
    }

    /// `Some` when a call may go out now.
    pub(super) fn admit(&self, index: usize) -> Option<Pass> {
        let breaker = &self.breakers[index];
        let until = breaker.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Pass::Closed);
        }
        if self.now_ms() < until
            && self.found.as_ref().is_none_or(|found| {
                found.load(Ordering::Acquire) == breaker.found_at.load(Ordering::Acquire)
            })
        {
            return None;
        }
        breaker
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then_some(Pass::Probe)
    }

    fn succeeded(&self, index: usize) {
        let breaker = &self.breakers[index];
        breaker.failures.store(0, Ordering::Relaxed);
        if breaker.open_until.swap(0, Ordering::AcqRel) != 0 {
            breaker.failed_probes.store(0, Ordering::Relaxed);
            breaker.probing.store(false, Ordering::Release);
            tracing::info!(
                breaker = %self.name(index),
                "rate-limit backend answered again: circuit closed"
            );
        }
    }

    /// A call given up by its request before the store could be slow: a
    /// probe's turn passes to the next call; nothing is counted.
    fn abandoned(&self, index: usize, pass: Pass) {
        if pass == Pass::Probe {
            self.breakers[index].probing.store(false, Ordering::Release);
        }
    }

    /// The Cluster refused the call ([`is_cluster_state`]): nothing is
    /// counted. A probe so answered learnt nothing about its master: the
    /// next goes after [`BREAKER_FIRST_PROBE`] (or the cool-down, when
    /// shorter), and the wait does not grow.
    fn refused(&self, index: usize, pass: Pass) {
        if pass == Pass::Probe {
            let breaker = &self.breakers[index];
            breaker.reopen(self.now_ms().saturating_add(self.wait(0)));
            breaker.probing.store(false, Ordering::Release);
        }
    }

    fn failed(&self, index: usize, pass: Pass) {
        let breaker = &self.breakers[index];
        match pass {
            Pass::Probe => {
                let failed = breaker.failed_probes.fetch_add(1, Ordering::Relaxed) + 1;
                let until = self.now_ms().saturating_add(self.wait(failed));
                breaker.found_at.store(self.found(), Ordering::Release);
                breaker.reopen(until);
                breaker.probing.store(false, Ordering::Release);
                tracing::debug!(breaker = %self.name(index), "probe failed: circuit stays open");
            }
            Pass::Closed => {
                let until = self.now_ms().saturating_add(self.wait(0));
                let failures = breaker.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= self.config.failures
                    && breaker
                        .open_until
                        .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    breaker.failed_probes.store(0, Ordering::Relaxed);
                    breaker.found_at.store(self.found(), Ordering::Release);
                    tracing::warn!(
                        breaker = %self.name(index),
                        failures,
                        cooldown = ?self.config.cooldown,
                        "rate-limit backend failed repeatedly: circuit open, answering at once until a probe succeeds"
                    );
                }
            }
        }
    }
}

/// Settles a call with its breaker: a success closes it, a failure counts,
/// and a call dropped before it answered counts as a failure when it had
/// waited [`BREAKER_SLOW_CALL`] (the layer's timeout ran out), and not at all
/// when it was dropped sooner (its request was given up).
pub(super) struct Settle {
    breakers: Arc<Breakers>,
    index: usize,
    pass: Pass,
    sent: Instant,
    settled: bool,
}

impl Settle {
    /// A call on breaker `index`, when it may go out now (`None`: the
    /// breaker is open and answers at once).
    pub(super) fn admit(breakers: &Arc<Breakers>, index: usize) -> Option<Self> {
        breakers.admit(index).map(|pass| Settle {
            breakers: Arc::clone(breakers),
            index,
            pass,
            sent: Instant::now(),
            settled: false,
        })
    }

    /// Settle with the call's `result`.
    pub(super) fn result<T>(mut self, result: &Result<T, RedisError>) {
        self.settled = true;
        match result {
            Ok(_) => self.breakers.succeeded(self.index),
            Err(err) if is_cluster_state(err) => self.breakers.refused(self.index, self.pass),
            Err(err) if is_outage(err) => self.breakers.failed(self.index, self.pass),
            Err(_) => self.breakers.succeeded(self.index),
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self.sent.elapsed() >= BREAKER_SLOW_CALL {
            self.breakers.failed(self.index, self.pass);
        } else {
            self.breakers.abandoned(self.index, self.pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use ::redis::{ErrorKind, ServerErrorKind};

    use super::*;
    use crate::connection::classify::{open_error, unavailable};
    use tower_pinned_window::backend::BackendError;

    #[test]
    fn a_breaker_opens_after_repeated_failures_then_probes_once() {
        let config = BreakerConfig {
            failures: 3,
            cooldown: Duration::from_millis(30),
        };
        let breakers = Breakers::new(config, false, None);
        for _ in 0..2 {
            assert_eq!(breakers.admit(0), Some(Pass::Closed));
            breakers.failed(0, Pass::Closed);
        }
        breakers.succeeded(0);
        for _ in 0..3 {
            assert_eq!(breakers.admit(0), Some(Pass::Closed));
            breakers.failed(0, Pass::Closed);
        }
        assert_eq!(breakers.admit(0), None, "open after 3 in a row");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breakers.admit(0), Some(Pass::Probe), "one probe");
        assert_eq!(breakers.admit(0), None, "only one");
        breakers.failed(0, Pass::Probe);
        assert_eq!(breakers.admit(0), None, "open again");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breakers.admit(0), Some(Pass::Probe));
        breakers.succeeded(0);
        assert_eq!(breakers.admit(0), Some(Pass::Closed), "closed");
    }

    #[test]
    fn probes_start_soon_and_back_off_while_they_fail() {
        let breakers = Breakers::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_millis(200),
            },
            false,
            None,
        );
        let first = u64::try_from(BREAKER_FIRST_PROBE.as_millis()).unwrap();
        assert_eq!(breakers.wait(0), first, "the first probe comes soon");
        assert_eq!(breakers.wait(1), 2 * first, "doubled after a failed probe");
        assert_eq!(breakers.wait(40), 200, "never past the cool-down");
        breakers.failed(0, Pass::Closed);
        assert_eq!(breakers.admit(0), None);
        std::thread::sleep(BREAKER_FIRST_PROBE + Duration::from_millis(5));
        assert_eq!(breakers.admit(0), Some(Pass::Probe));
        breakers.failed(0, Pass::Probe);
        std::thread::sleep(BREAKER_FIRST_PROBE + Duration::from_millis(5));
        assert_eq!(
            breakers.admit(0),
            None,
            "the second wait is twice the first"
        );
        std::thread::sleep(BREAKER_FIRST_PROBE);
        assert_eq!(breakers.admit(0), Some(Pass::Probe));
        breakers.succeeded(0);
        assert_eq!(breakers.admit(0), Some(Pass::Closed));
        breakers.failed(0, Pass::Closed);
        std::thread::sleep(BREAKER_FIRST_PROBE + Duration::from_millis(5));
        assert_eq!(
            breakers.admit(0),
            Some(Pass::Probe),
            "a breaker that closed starts from the first wait again"
        );
    }

    #[test]
    fn a_cluster_refusal_counts_neither_way() {
        let breakers = Breakers::new(
            BreakerConfig {
                failures: 2,
                cooldown: Duration::from_secs(60),
            },
            true,
            None,
        );
        let down = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ClusterDown),
            "The cluster is down",
        ));
        assert!(is_cluster_state(&down) && !is_outage(&down));
        let moved = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Moved),
            "MOVED",
            "2983 127.0.0.1:7000".to_owned(),
        ));
        assert!(
            is_outage(&moved) && !is_cluster_state(&moved),
            "a redirection the client could not follow is its master's failure"
        );
        for _ in 0..100 {
            breakers.refused(0, Pass::Closed);
        }
        assert_eq!(
            breakers.admit(0),
            Some(Pass::Closed),
            "CLUSTERDOWN opens nothing"
        );
        breakers.failed(0, Pass::Closed);
        breakers.failed(0, Pass::Closed);
        assert_eq!(breakers.admit(0), None, "open");
        breakers.breakers[0]
            .failed_probes
            .store(5, Ordering::Relaxed);
        breakers.cluster_ok_again(true);
        assert_eq!(
            breakers.admit(0),
            Some(Pass::Probe),
            "the Cluster is ok: probe now"
        );
        breakers.refused(0, Pass::Probe);
        assert_eq!(breakers.admit(0), None, "a refused probe waits");
        std::thread::sleep(BREAKER_FIRST_PROBE + Duration::from_millis(5));
        assert_eq!(breakers.admit(0), Some(Pass::Probe), "only the first wait");
    }

    /// A server's error of `kind`, as a Cluster node answers it.
    fn server(kind: ServerErrorKind, code: &'static str, detail: &str) -> RedisError {
        RedisError::from((ErrorKind::Server(kind), code, detail.to_owned()))
    }

    #[test]
    fn masterdown_is_a_refusal_like_clusterdown_and_opens_nothing() {
        let refusals = [
            server(
                ServerErrorKind::ClusterDown,
                "CLUSTERDOWN",
                "The cluster is down",
            ),
            server(
                ServerErrorKind::TryAgain,
                "TRYAGAIN",
                "Multiple keys request during rehashing of slot",
            ),
            server(
                ServerErrorKind::MasterDown,
                "MASTERDOWN",
                "Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            ),
        ];
        let breakers = Arc::new(Breakers::new(
            BreakerConfig {
                failures: 2,
                cooldown: Duration::from_secs(60),
            },
            true,
            None,
        ));
        let settle = |err: &RedisError| {
            Settle {
                breakers: Arc::clone(&breakers),
                index: 0,
                pass: Pass::Closed,
                sent: Instant::now(),
                settled: false,
            }
            .result::<Value>(&Err(err.clone()));
        };
        for err in &refusals {
            assert!(is_cluster_state(err), "{err}: a refusal");
            assert!(!is_outage(err), "{err}: not an outage");
            for _ in 0..10 {
                settle(err);
            }
            assert_eq!(
                breakers.admit(0),
                Some(Pass::Closed),
                "{err}: ten in a row open no breaker"
            );
            match unavailable(err.clone()) {
                BackendError::ClusterDown(detail) => assert_eq!(
                    detail.to_string(),
                    err.to_string(),
                    "the node's answer is kept"
                ),
                other => panic!("{err}: reported as {other:?}"),
            }
        }
        let loading = server(ServerErrorKind::BusyLoading, "LOADING", "loading");
        assert!(is_outage(&loading) && !is_cluster_state(&loading));
        assert!(matches!(
            unavailable(loading.clone()),
            BackendError::Unavailable(_)
        ));
        assert!(matches!(
            unavailable(open_error()),
            BackendError::CircuitOpen
        ));
        assert!(matches!(
            unavailable(RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut
            ))),
            BackendError::TimedOut
        ));
        settle(&loading);
        settle(&loading);
        assert_eq!(breakers.admit(0), None, "two outages open it");
    }

    #[test]
    fn a_master_found_lets_a_probe_through_at_once() {
        let found = Arc::new(AtomicU64::new(1));
        let breakers = Breakers::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_secs(60),
            },
            false,
            Some(Arc::clone(&found)),
        );
        breakers.failed(0, Pass::Closed);
        std::thread::sleep(BREAKER_FIRST_PROBE + Duration::from_millis(5));
        assert_eq!(breakers.admit(0), Some(Pass::Probe));
        breakers.failed(0, Pass::Probe);
        assert_eq!(breakers.admit(0), None, "no new master: wait");
        found.fetch_add(1, Ordering::AcqRel);
        assert_eq!(breakers.admit(0), Some(Pass::Probe), "a new master: probe");
        assert_eq!(breakers.admit(0), None, "one probe");
        breakers.failed(0, Pass::Probe);
        assert_eq!(breakers.admit(0), None, "it failed too: wait again");
    }

    #[test]
    fn a_call_dropped_at_once_counts_neither_way_and_a_slow_one_fails() {
        let breakers = Arc::new(Breakers::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_millis(30),
            },
            false,
            None,
        ));
        let settle = |pass, waited: Duration| Settle {
            breakers: Arc::clone(&breakers),
            index: 0,
            pass,
            sent: Instant::now().checked_sub(waited).unwrap(),
            settled: false,
        };
        for _ in 0..100 {
            drop(settle(Pass::Closed, Duration::ZERO));
        }
        assert_eq!(breakers.admit(0), Some(Pass::Closed), "clients gone");
        drop(settle(Pass::Closed, BREAKER_SLOW_CALL));
        assert_eq!(breakers.admit(0), None, "a timeout is a failure");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(breakers.admit(0), Some(Pass::Probe));
        drop(settle(Pass::Probe, Duration::ZERO));
        assert_eq!(
            breakers.admit(0),
            Some(Pass::Probe),
            "a probe given up by its client passes the turn on"
        );
        drop(settle(Pass::Probe, BREAKER_SLOW_CALL));
        assert_eq!(breakers.admit(0), None, "a probe that timed out fails");
    }

    #[test]
    fn cluster_breakers_go_by_master_once_the_slot_map_is_known() {
        let breakers = Breakers::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_secs(60),
            },
            true,
            None,
        );
        // slot("a") = 15495, slot("b") = 3300, slot("c") = 7365.
        let (a, b, c): (&[u8], &[u8], &[u8]) = (b"tpw:n{a}", b"tpw:n{b}", b"tpw:n{c}");
        assert_eq!(
            breakers.for_key(a),
            MAX_NODES + usize::from(key_slot(b"a") / SLOTS_PER_RANGE),
            "by slot range until the map is known"
        );
        assert_ne!(breakers.for_key(a), breakers.for_key(b));

        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"10.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start: i64, end: i64, port: i64| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                node(port),
                node(port + 1000),
            ])
        };
        breakers.map(
            &Value::Array(vec![
                range(0, 5460, 7000),
                range(5461, 10922, 7001),
                range(10923, 16383, 7002),
            ]),
            1,
        );
        let (ia, ib, ic) = (
            breakers.for_key(a),
            breakers.for_key(b),
            breakers.for_key(c),
        );
        assert!(ia < MAX_NODES && ib < MAX_NODES && ic < MAX_NODES);
        assert_eq!(breakers.name(ia), "10.0.0.1:7002");
        assert_eq!(breakers.name(ib), "10.0.0.1:7000");
        assert_eq!(breakers.name(ic), "10.0.0.1:7001");
        // slot("foo") = 12182: the same master as a.
        assert_eq!(
            breakers.for_key(b"tpw:n{foo}"),
            ia,
            "one breaker per master"
        );
        breakers.failed(ia, Pass::Closed);
        assert_eq!(breakers.admit(ia), None, "a's master is open");
        assert_eq!(breakers.admit(ib), Some(Pass::Closed), "the others are not");
        assert_eq!(breakers.admit(ic), Some(Pass::Closed));

        // A replica took over a's slots: they get a breaker of their own,
        // and the move off an open breaker is kept for the watcher to make
        // the Cluster client follow, whichever read found it.
        assert!(breakers.unfollowed().is_empty());
        breakers.map(&Value::Array(vec![range(10923, 16383, 7003)]), 3);
        let promoted = breakers.for_key(a);
        assert_ne!(promoted, ia);
        assert_eq!(breakers.name(promoted), "10.0.0.1:7003");
        assert_eq!(breakers.admit(promoted), Some(Pass::Closed));
        let unfollowed = breakers.unfollowed();
        assert_eq!(unfollowed, vec![(10923, ia, promoted)]);
        assert!(breakers.unfollowed().is_empty(), "taken out");
        breakers.unfollowed_again(unfollowed);
        assert_eq!(
            breakers.unfollowed(),
            vec![(10923, ia, promoted)],
            "put back until followed"
        );

        // The old master wakes and answers a question asked before the
        // promotion was read, with the map it had then: it changes nothing.
        breakers.map(&Value::Array(vec![range(10923, 16383, 7002)]), 2);
        assert_eq!(
            breakers.for_key(a),
            promoted,
            "an older answer is older news"
        );
        // A newer answer is taken in, whatever it says; a move off a
        // closed breaker has nothing to follow.
        breakers.map(&Value::Array(vec![range(10923, 16383, 7002)]), 4);
        assert_eq!(breakers.for_key(a), ia);
        assert!(breakers.unfollowed().is_empty());
    }
}
