//! The circuit breaker: after repeated failures the backend answers
//! [`BackendError::CircuitOpen`](crate::backend::BackendError::CircuitOpen)
//! at once for a cool-down, then lets one probe through.
//!
//! It wraps the connection ([`Guarded`]), so every command the backend sends
//! goes through it, whatever path sends it. On a Cluster connection there is
//! one breaker per range of [`SLOTS_PER_RANGE`] consecutive slots, so a
//! failing master opens only the breakers of its own slots and the healthy
//! masters' keys go on as before; on any other connection there is one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionLike;
use ::redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

/// Consecutive failures that open a breaker, unless configured otherwise.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;

/// How long an open breaker answers at once before it lets a probe through,
/// unless configured otherwise.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_millis(500);

/// Consecutive Cluster slots that share one breaker (128 breakers for the
/// 16384 slots). A master's slots are ranges of consecutive slots, so all
/// but the ranges that straddle two masters belong to one master.
pub const SLOTS_PER_RANGE: u16 = 128;

const CLUSTER_SLOTS: u16 = 16_384;

/// The detail of the error an open breaker answers with.
const OPEN: &str = "tower-pinned-window: circuit open after repeated failures";

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

/// Whether `err` is what an open breaker answers.
pub(crate) fn is_open(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Client && err.detail() == Some(OPEN)
}

fn open_error() -> RedisError {
    RedisError::from((ErrorKind::Client, "circuit open", OPEN.to_owned()))
}

/// Whether `err` says the store is down or unreachable (rather than that a
/// command was wrong, or a script missing, which a healthy server answers).
fn is_outage(err: &RedisError) -> bool {
    match err.kind() {
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
        ),
        ErrorKind::Client | ErrorKind::UnexpectedReturnType | ErrorKind::InvalidClientConfig => {
            false
        }
        _ => true,
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
}

/// How a call got past its breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Closed,
    Probe,
}

/// The breakers of one backend.
#[derive(Debug)]
pub(crate) struct Breakers {
    config: BreakerConfig,
    origin: Instant,
    /// One, or one per slot range on a Cluster.
    breakers: Box<[Breaker]>,
}

impl Breakers {
    pub(crate) fn new(config: BreakerConfig, per_slot_range: bool) -> Self {
        let count = if per_slot_range {
            usize::from(CLUSTER_SLOTS / SLOTS_PER_RANGE)
        } else {
            1
        };
        Self {
            config,
            origin: Instant::now(),
            breakers: (0..count).map(|_| Breaker::default()).collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// The breaker `cmd` goes through: by the slot of its first key on a
    /// Cluster, the one breaker otherwise.
    fn index(&self, cmd: &Cmd) -> usize {
        if self.breakers.len() == 1 {
            return 0;
        }
        let mut args = cmd.args_iter();
        let name = match args.next() {
            Some(Arg::Simple(name)) => name.to_ascii_uppercase(),
            _ => return 0,
        };
        // EVAL/EVALSHA script numkeys key ...; every other command this
        // crate sends names its key first.
        let skip = if name == b"EVALSHA" || name == b"EVAL" {
            2
        } else {
            0
        };
        match args.nth(skip) {
            Some(Arg::Simple(key)) => usize::from(slot(key) / SLOTS_PER_RANGE),
            _ => 0,
        }
    }

    /// `Some` when a call may go out now.
    fn admit(&self, index: usize) -> Option<Pass> {
        let breaker = &self.breakers[index];
        let until = breaker.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Pass::Closed);
        }
        if self.now_ms() < until {
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
            breaker.probing.store(false, Ordering::Release);
            tracing::info!(
                breaker = index,
                "rate-limit backend answered again: circuit closed"
            );
        }
    }

    fn failed(&self, index: usize, pass: Pass) {
        let breaker = &self.breakers[index];
        let until = self
            .now_ms()
            .saturating_add(u64::try_from(self.config.cooldown.as_millis()).unwrap_or(u64::MAX));
        match pass {
            Pass::Probe => {
                breaker.open_until.store(until, Ordering::Release);
                breaker.probing.store(false, Ordering::Release);
                tracing::debug!(breaker = index, "probe failed: circuit stays open");
            }
            Pass::Closed => {
                let failures = breaker.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= self.config.failures
                    && breaker
                        .open_until
                        .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    tracing::warn!(
                        breaker = index,
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
/// and a call dropped before it answered (the layer's timeout ran out)
/// counts as a failure.
struct Settle {
    breakers: Arc<Breakers>,
    index: usize,
    pass: Pass,
    settled: bool,
}

impl Settle {
    fn result<T>(mut self, result: &Result<T, RedisError>) {
        self.settled = true;
        match result {
            Ok(_) => self.breakers.succeeded(self.index),
            Err(err) if is_outage(err) => self.breakers.failed(self.index, self.pass),
            Err(_) => self.breakers.succeeded(self.index),
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if !self.settled {
            self.breakers.failed(self.index, self.pass);
        }
    }
}

/// A connection behind the backend's breakers.
#[derive(Clone)]
pub(crate) struct Guarded<C> {
    pub(crate) inner: C,
    /// `None` when the breaker is off.
    pub(crate) breakers: Option<Arc<Breakers>>,
}

impl<C> Guarded<C> {
    fn settle(&self, index: usize) -> Result<Option<Settle>, RedisError> {
        let Some(breakers) = &self.breakers else {
            return Ok(None);
        };
        match breakers.admit(index) {
            Some(pass) => Ok(Some(Settle {
                breakers: Arc::clone(breakers),
                index,
                pass,
                settled: false,
            })),
            None => Err(open_error()),
        }
    }

    fn index(&self, cmd: Option<&Cmd>) -> usize {
        match (&self.breakers, cmd) {
            (Some(breakers), Some(cmd)) => breakers.index(cmd),
            _ => 0,
        }
    }
}

impl<C> ConnectionLike for Guarded<C>
where
    C: ConnectionLike + Send,
{
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let settle = match self.settle(self.index(Some(cmd))) {
            Ok(settle) => settle,
            Err(err) => return Box::pin(std::future::ready(Err(err))),
        };
        let call = self.inner.req_packed_command(cmd);
        Box::pin(async move {
            let result = call.await;
            if let Some(settle) = settle {
                settle.result(&result);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let settle = match self.settle(self.index(pipeline.cmd_iter().next())) {
            Ok(settle) => settle,
            Err(err) => return Box::pin(std::future::ready(Err(err))),
        };
        let call = self.inner.req_packed_commands(pipeline, offset, count);
        Box::pin(async move {
            let result = call.await;
            if let Some(settle) = settle {
                settle.result(&result);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// The Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the
/// whole key when it has none, modulo 16384.
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % CLUSTER_SLOTS
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"tpw:api{k}"), slot(b"k"));
    }

    #[test]
    fn a_breaker_opens_after_repeated_failures_then_probes_once() {
        let config = BreakerConfig {
            failures: 3,
            cooldown: Duration::from_millis(30),
        };
        let breakers = Breakers::new(config, false);
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
    fn slot_ranges_open_alone() {
        let breakers = Breakers::new(
            BreakerConfig {
                failures: 1,
                cooldown: Duration::from_secs(60),
            },
            true,
        );
        let mut evalsha = ::redis::cmd("EVALSHA");
        evalsha.arg("sha").arg(1).arg("tpw:n{a}").arg(5);
        let mut other = ::redis::cmd("DEL");
        other.arg("tpw:n{b}");
        let (a, b) = (breakers.index(&evalsha), breakers.index(&other));
        assert_eq!(a, usize::from(slot(b"a") / SLOTS_PER_RANGE));
        assert_eq!(b, usize::from(slot(b"b") / SLOTS_PER_RANGE));
        assert_ne!(a, b);
        breakers.failed(a, Pass::Closed);
        assert_eq!(breakers.admit(a), None);
        assert_eq!(breakers.admit(b), Some(Pass::Closed));
    }

    #[test]
    fn only_outages_count() {
        assert!(is_outage(&RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_outage(&RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoScript),
            "no script"
        ))));
        assert!(is_open(&open_error()));
        assert!(!is_outage(&open_error()));
    }
}
