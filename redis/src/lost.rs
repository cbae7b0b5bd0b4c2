//! Spends whose reply was lost: the connection dropped after the call was
//! sent, or the call's future was dropped (the layer's timeout) while it
//! was in flight. Their requests failed, but the script may have run and
//! counted them.
//!
//! Every spend call names a marker beside its first counter (in its hash
//! slot), and the spend script writes its answers there, with a lifetime of
//! [`MARKER_LIFETIME`], in the same atomic step as the spends. When a
//! call's reply is lost, a task on the runtime takes the marker
//! (`GETDEL`) once Redis answers again: when there is one, the call ran,
//! and each request it admitted is refunded what it spent on each of its
//! counters (its cost, or the first counter's own amount), only in the
//! window it was counted in, never below zero (the
//! amend script, as [`Amend::Refund`](tower_pinned_window::backend::Amend::Refund)).
//! When there is none, the call did not run, or its marker expired before
//! Redis answered again (the spends stay counted: the safe side). The
//! marker is taken at most once and the refunds are sent at most once, so
//! nothing is given back twice; a refund whose own reply is lost is not
//! sent again (the spends may stay counted).

use std::borrow::Borrow;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{RedisError, RedisResult};
use smallvec::SmallVec;

use super::amends::AmendWork;
use super::coalesce::Work;
use super::connection::acks::is_not_acknowledged;
use super::connection::guarded::Guarded;
use super::hits::StoredKey;
use super::reply::{Spent, parse_spend_marker};
use tower_pinned_window::backend::{Amend, Hits, Spend};

/// How long a spend call's marker lives: a reply lost longer ago than this
/// (Redis unreachable all that time) is not given back.
pub(super) const MARKER_LIFETIME: Duration = Duration::from_secs(5);

/// The spend script's last argument when the call names a marker: the word
/// and the marker's lifetime in milliseconds.
pub(super) const MARKER_ARG: &str = "marker 5000";

/// What a marker's key adds to the counter's it is beside (then 32 hex
/// digits): never a counter's key, which ends with `}`.
const MARKER_SUFFIX: &[u8] = b":lost:";

/// The first wait before the marker is read again, after an attempt that
/// failed (Redis still unreachable); doubled after each, at most
/// [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(25);
const MAX_WAIT: Duration = Duration::from_millis(800);

/// A new marker's key, beside `counter`: its key, [`MARKER_SUFFIX`], and an
/// id no other call of any process uses (a random number drawn once per
/// process, and this process's count of calls).
pub(super) fn marker_key(counter: &[u8]) -> StoredKey {
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hasher.write_u32(std::process::id());
        hasher.finish()
    });
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let mut key = StoredKey::new();
    key.extend_from_slice(counter);
    key.extend_from_slice(MARKER_SUFFIX);
    for n in [process, call] {
        for shift in (0..16).rev() {
            key.push(b"0123456789abcdef"[((n >> (4 * shift)) & 0xf) as usize]);
        }
    }
    key
}

/// What the give-back reads of a spend a call carried: its counters'
/// storage keys, and the spend (what it adds to each:
/// [`Spend::cost_of`]).
pub(super) trait Carried {
    fn counters(&self) -> &[StoredKey];
    fn spend(&self) -> Spend;
}

/// Whether `spend` adds nothing to any of its `n` counters: then there is
/// nothing to give back.
fn spends_nothing(spend: Spend, n: usize) -> bool {
    (0..n).all(|i| spend.cost_of(i) == 0)
}

/// Whether a call that failed with `err` may have run with its reply lost:
/// its connection failed after it was sent (an I/O error that is not a
/// refused connection). A reply from Redis (an error it answered,
/// `NOSCRIPT`, `CROSSSLOT`) and an open breaker's refusal say it did not
/// run; a write `WAIT` did not see acknowledged was answered, and what the
/// master counted stays (the replica-acknowledged mode's rule).
pub(super) fn may_have_run(err: &RedisError) -> bool {
    (err.is_io_error() || err.is_connection_dropped())
        && !err.is_connection_refusal()
        && !is_not_acknowledged(err)
}

/// Armed while a spend call is in flight: dropped armed (its reply lost, or
/// its future dropped before the reply), it starts the give-back of the
/// call's spends on the runtime.
pub(super) struct InFlight<'a, C, W, B>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Carried,
    B: Borrow<W>,
{
    connection: &'a Guarded<C>,
    works: &'a [B],
    marker: &'a [u8],
    armed: bool,
    carried: PhantomData<fn() -> W>,
}

impl<'a, C, W, B> InFlight<'a, C, W, B>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Carried,
    B: Borrow<W>,
{
    /// A call of `works` on `connection`, naming `marker`.
    pub(super) fn new(connection: &'a Guarded<C>, works: &'a [B], marker: &'a [u8]) -> Self {
        Self {
            connection,
            works,
            marker,
            armed: true,
            carried: PhantomData,
        }
    }

    /// The call is over, and what it did is known: `reply` came back, or
    /// its error says it never ran.
    pub(super) fn landed<T>(mut self, reply: &RedisResult<T>) {
        if let Err(err) = reply
            && may_have_run(err)
        {
            return;
        }
        self.armed = false;
    }
}

impl<C, W, B> Drop for InFlight<'_, C, W, B>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Carried,
    B: Borrow<W>,
{
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                "a spend call's reply was lost outside a tokio runtime: its spends stay counted"
            );
            return;
        };
        let spends: Vec<(SmallVec<[StoredKey; 2]>, Spend)> = self
            .works
            .iter()
            .map(|w| {
                let w = w.borrow();
                (w.counters().iter().cloned().collect(), w.spend())
            })
            .collect();
        if spends
            .iter()
            .all(|(counters, spend)| spends_nothing(*spend, counters.len()))
        {
            return;
        }
        runtime.spawn(give_back(
            self.connection.clone(),
            StoredKey::from_slice(self.marker),
            spends,
        ));
    }
}

/// Takes the marker of a call whose reply was lost, once Redis answers,
/// and refunds each request the call admitted.
async fn give_back<C>(
    connection: Guarded<C>,
    marker: StoredKey,
    spends: Vec<(SmallVec<[StoredKey; 2]>, Spend)>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let started = tokio::time::Instant::now();
    let mut wait = FIRST_WAIT;
    let taken = loop {
        let mut con = connection.unguarded().clone();
        match ::redis::cmd("GETDEL")
            .arg(marker.as_slice())
            .query_async::<Option<Vec<u8>>>(&mut con)
            .await
        {
            Ok(taken) => break taken,
            Err(err) if started.elapsed() + wait < MARKER_LIFETIME => {
                tracing::debug!(error = %err, "the marker of a spend call whose reply was lost: Redis not answering yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_WAIT);
            }
            Err(err) => {
                tracing::warn!(error = %err, "a spend call's reply was lost and Redis did not answer before its marker expired: its spends stay counted");
                return;
            }
        }
    };
    let Some(packed) = taken else {
        // Not run (or the marker expired): nothing to give back.
        return;
    };
    let Some(spent) = parse_spend_marker(&packed, spends.iter().map(|(c, _)| c.len())) else {
        tracing::warn!("a spend call's marker could not be read: its spends stay counted");
        return;
    };
    let refunds: Vec<AmendWork> = spends
        .iter()
        .zip(spent)
        .flat_map(|((counters, spend), spent)| {
            let hits = match spent {
                Spent::Decided(hits) => hits,
                _ => SmallVec::new(),
            };
            counters
                .iter()
                .zip(hits)
                .enumerate()
                .filter_map(move |(i, (counter, (hit, _)))| {
                    let cost = spend.cost_of(i);
                    if cost == 0 {
                        return None;
                    }
                    Some(AmendWork {
                        counter: counter.clone(),
                        amend: Amend::Refund(cost),
                        deadline: hit.deadline?,
                        forget: None,
                    })
                })
        })
        .collect();
    send_refunds(&connection, refunds).await;
}

/// The spends of `unread` that were admitted, answered to waiters who were
/// gone (the layer's timeout): refunded, on a task of their own, once.
pub(super) fn give_back_unread<C, W>(connection: &Guarded<C>, unread: Vec<(W, Hits)>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Carried,
{
    let refunds: Vec<AmendWork> = unread
        .into_iter()
        .flat_map(|(work, hits)| {
            let spend = work.spend();
            let deadlines: SmallVec<[_; 2]> = (&hits).into_iter().map(|hit| hit.deadline).collect();
            let counters: SmallVec<[StoredKey; 2]> = work.counters().iter().cloned().collect();
            counters.into_iter().zip(deadlines).enumerate().filter_map(
                move |(i, (counter, deadline))| {
                    let cost = spend.cost_of(i);
                    if cost == 0 {
                        return None;
                    }
                    Some(AmendWork {
                        counter,
                        amend: Amend::Refund(cost),
                        deadline: deadline?,
                        forget: None,
                    })
                },
            )
        })
        .collect();
    if refunds.is_empty() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let connection = connection.clone();
        runtime.spawn(async move { send_refunds(&connection, refunds).await });
    }
}

/// One amend call of `refunds`, sent once.
async fn send_refunds<C>(connection: &Guarded<C>, refunds: Vec<AmendWork>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if refunds.is_empty() {
        return;
    }
    let n = refunds.len();
    match <AmendWork as Work>::run(connection, &refunds).await {
        Ok(_) => tracing::info!(
            refunds = n,
            "spends refused after Redis counted them (a reply lost, or its waiter gone): given back"
        ),
        Err(err) => tracing::warn!(
            error = %err,
            "spends refused after Redis counted them could not be given back (the refund's reply was lost too): they may stay counted"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_beside_their_counter_and_never_repeat() {
        let a = marker_key(b"tpw:x{k}");
        let b = marker_key(b"tpw:x{k}");
        assert_ne!(a, b);
        assert!(a.starts_with(b"tpw:x{k}:lost:"));
        assert_eq!(a.len(), b"tpw:x{k}".len() + MARKER_SUFFIX.len() + 32);
        assert_eq!(
            MARKER_ARG,
            format!("marker {}", MARKER_LIFETIME.as_millis())
        );
    }

    #[test]
    fn only_a_failed_connection_after_sending_may_have_run() {
        use std::io::ErrorKind::{ConnectionRefused, ConnectionReset, UnexpectedEof};
        for (kind, ran) in [
            (ConnectionReset, true),
            (UnexpectedEof, true),
            (ConnectionRefused, false),
        ] {
            let err = RedisError::from(std::io::Error::from(kind));
            assert_eq!(may_have_run(&err), ran, "{kind:?}");
        }
        let answered = RedisError::from((
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript),
            "no script",
        ));
        assert!(!may_have_run(&answered));
    }
}
