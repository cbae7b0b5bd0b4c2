//! Spends and amends in flight together, sent in one transaction.
//!
//! They are queued as hits are (`batch.rs`: up to `statements` senders, no
//! timer, a request whose caller has gone is not sent), on a queue of their
//! own. A sender takes the queue's requests (up to [`MAX_BATCH`]) into one
//! transaction of two round trips:
//!
//! 1. `BEGIN`, `spend_lock.sql` (every counter of the batch locked in one
//!    order, a missing one that a spend names created as a closed window)
//!    and `spend_read.sql` (the rows as they stand, with the database's
//!    clock and the reset markers the amends' deadlines meet), pipelined;
//! 2. the batch is decided here, request by request in the order they were
//!    queued, on the rows as the requests before left them; then
//!    `spend_write.sql` (every changed row at once) and `COMMIT`,
//!    pipelined.
//!
//! So a request on the same counters as another of its batch sees the other's
//! step, as if sent after it, and the rows stay locked from the read to the
//! commit: other batches, hit statements and other instances wait for them,
//! and the admitted costs never pass a limit. A transaction commits whole or
//! not at all, and none is ever sent again: a batch cut by a lost connection
//! counts each of its requests once or not at all, and fails them all.
//! When it was the `COMMIT`'s reply that was lost, the spends it may have
//! counted are given back once `txid_status` says it committed; so are the
//! admitted spends whose callers are gone when their batch commits
//! (`lost.rs`).
//! The connection of a failed batch is dropped, never handed out again in
//! the middle of a transaction.
//!
//! A row no spend may count (see [`classify`]) fails the spends that name it
//! with [`BackendError::Corrupt`], and is never written; the amends that
//! name it answer `false`, as they did one statement each. The rest of the
//! batch is decided as usual.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Object;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::batch::{Job, fail};
use super::db::Db;
use super::error::{pg_error, pool_error};
use super::lost;
use super::row::{WINDOW_BOUND_MS, deadline_id, describe};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::toolkit::refused_count;
use tower_pinned_window::backend::{Amend, BackendError, Hit, Hits, Spend};
use tower_pinned_window::key::Key;

/// The most requests one transaction carries.
pub(super) const MAX_BATCH: usize = 128;

/// A spend's answer: its hits, and what the local deny cache may learn from
/// them (one entry per counter).
pub(super) struct Spent {
    pub(super) hits: Hits,
    pub(super) cache: SmallVec<[Option<Cached>; 2]>,
}

/// A counter a spend was denied on, that every spend would be denied on
/// until a deadline (this long from when the database read its clock).
#[derive(Debug, Clone, Copy)]
pub(super) enum Cached {
    /// Its count is at its limit or over, until its window closes: a spend
    /// without a lockout under that limit (or a lower one) is denied, and so
    /// is a hit.
    Over(Duration, u64),
    /// It is locked out: every spend is denied.
    Locked(Duration),
}

/// One request of a batch: a spend, or an amend.
pub(super) enum Op {
    Spend {
        counters: Vec<(Box<str>, Quota)>,
        spend: Spend,
        reply: oneshot::Sender<Result<Spent, BackendError>>,
    },
    Amend {
        namespace: Box<str>,
        /// The window's `expires_at`, from the hit's deadline.
        expires_at: SystemTime,
        amend: Amend,
        reply: oneshot::Sender<Result<bool, BackendError>>,
    },
}

/// A request on one key, queued.
pub(super) struct Request {
    pub(super) key: Key,
    pub(super) op: Op,
}

impl Job for Request {
    const MAX_BATCH: usize = MAX_BATCH;

    fn is_closed(&self) -> bool {
        match &self.op {
            Op::Spend { reply, .. } => reply.is_closed(),
            Op::Amend { reply, .. } => reply.is_closed(),
        }
    }

    fn fail(self, err: BackendError) {
        match self.op {
            Op::Spend { reply, .. } => drop(reply.send(Err(err))),
            Op::Amend { reply, .. } => drop(reply.send(Err(err))),
        }
    }

    fn send(db: &Arc<Db>, batch: Vec<Self>) -> impl Future<Output = ()> + Send {
        send(db, batch)
    }
}

/// One counter's row as the batch sees it: as read, then as each request
/// of the batch leaves it.
struct Row {
    /// Why no spend may count it (found when read; then never written).
    corrupt: Option<String>,
    /// It was there when read.
    was: bool,
    /// It is there now (a clear of the batch may have deleted it).
    exists: bool,
    count: i64,
    expires_at: SystemTime,
    blocked_until: Option<SystemTime>,
    /// Deadlines reset markers name for this counter: read, or left by a
    /// clear of the batch.
    marked: SmallVec<[SystemTime; 1]>,
    /// A request of the batch changed it.
    dirty: bool,
}

impl Row {
    /// No row: a closed window, no lockout.
    fn missing() -> Self {
        Self {
            corrupt: None,
            was: false,
            exists: false,
            count: 0,
            expires_at: UNIX_EPOCH,
            blocked_until: None,
            marked: SmallVec::new(),
            dirty: false,
        }
    }
}

/// What a request of the batch gets, once the batch has committed.
enum Answer {
    Spent(Result<Spent, BackendError>),
    Amended(bool),
}

/// A counter as a spend finds it: its live count (0 when it has no live
/// window), its live window's end, its live lockout's end.
type Seen = (u64, Option<SystemTime>, Option<SystemTime>);

fn left(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

/// A row's count and `expires_at`, or why no spend may count it: a count
/// that is not one (NULL, negative, or one that cannot grow), no
/// `expires_at`, or one further away than [`Window::MAX`](tower_pinned_window::Window::MAX)
/// (or infinite).
pub(super) fn classify(
    count: Option<i64>,
    expires_at: Option<SystemTime>,
    now: SystemTime,
) -> Result<(i64, SystemTime), String> {
    let count = match count {
        Some(c) if (0..i64::MAX).contains(&c) => c,
        other => return Err(format!("count {other:?}")),
    };
    let Some(expires_at) = expires_at else {
        return Err("expires_at is NULL".to_owned());
    };
    if left(expires_at, now) > Duration::from_millis(WINDOW_BOUND_MS as u64) {
        return Err("expires_at past the bound (or infinity)".to_owned());
    }
    Ok((count, expires_at))
}

/// Polls `a`, then `b` (each sends its request on its first poll, in that
/// order: a pipeline), until both are done.
pub(super) async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut from_a, mut from_b) = (None, None);
    poll_fn(|cx| {
        if from_a.is_none()
            && let Poll::Ready(out) = a.as_mut().poll(cx)
        {
            from_a = Some(out);
        }
        if from_b.is_none()
            && let Poll::Ready(out) = b.as_mut().poll(cx)
        {
            from_b = Some(out);
        }
        if from_a.is_some() && from_b.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    match (from_a, from_b) {
        (Some(a), Some(b)) => (a, b),
        _ => unreachable!("both are done"),
    }
}

/// A connection in the middle of a transaction (a batch's, or a
/// `take_all`'s): unless [`release`](Self::release)d once it has ended, it
/// is dropped, never handed out again (a failed batch or step, or its task
/// cancelled).
pub(super) struct InTransaction(Option<Object>);

impl InTransaction {
    /// `client`, about to begin a transaction.
    pub(super) fn new(client: Object) -> Self {
        Self(Some(client))
    }

    /// The connection, while held.
    pub(super) fn client(&self) -> &Object {
        self.0.as_ref().expect("held until released or dropped")
    }

    /// Hand the connection back to the pool: its transaction has ended.
    pub(super) fn release(mut self) {
        drop(self.0.take());
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}

/// How a batch's transaction failed.
enum Failed {
    /// Nothing was committed.
    Before(BackendError),
    /// The `COMMIT` was sent and its reply lost (the connection failed):
    /// transaction `txid` may have committed `answers`.
    Lost {
        err: BackendError,
        txid: i64,
        answers: Vec<Answer>,
    },
}

impl From<BackendError> for Failed {
    fn from(err: BackendError) -> Self {
        Self::Before(err)
    }
}

/// One transaction for `batch`, and every request's answer. What the
/// spends of a batch whose `COMMIT` reply was lost spent, and what an
/// admitted spend whose caller has gone spent, is given back
/// ([`lost`]).
pub(super) async fn send(db: &Arc<Db>, mut batch: Vec<Request>) {
    let client = match db.pool.get().await {
        Ok(client) => client,
        Err(err) => return fail(batch, &pool_error(err)),
    };
    batch.retain(|request| !request.is_closed());
    if batch.is_empty() {
        return;
    }
    let client = InTransaction(Some(client));
    match transaction(db, client.0.as_ref().expect("held"), &batch).await {
        Ok(answers) => {
            client.release();
            let mut refunds = Vec::new();
            for (request, answer) in batch.into_iter().zip(answers) {
                match (request.op, answer) {
                    (
                        Op::Spend {
                            reply,
                            counters,
                            spend,
                        },
                        Answer::Spent(spent),
                    ) => {
                        if let Err(Ok(spent)) = reply.send(spent) {
                            // Its caller has gone (the layer's timeout): it
                            // was refused, and keeps no cost.
                            lost::refunds(
                                &mut refunds,
                                &request.key,
                                &counters,
                                spend,
                                &spent.hits,
                            );
                        }
                    }
                    (Op::Amend { reply, .. }, Answer::Amended(changed)) => {
                        drop(reply.send(Ok(changed)));
                    }
                    _ => unreachable!("one answer per request, in order"),
                }
            }
            give_back(db, None, refunds);
        }
        Err(Failed::Before(err)) => {
            drop(client);
            fail(batch, &err);
        }
        Err(Failed::Lost { err, txid, answers }) => {
            drop(client);
            let mut refunds = Vec::new();
            for (request, answer) in batch.iter().zip(&answers) {
                if let (
                    Op::Spend {
                        counters, spend, ..
                    },
                    Answer::Spent(Ok(spent)),
                ) = (&request.op, answer)
                {
                    lost::refunds(&mut refunds, &request.key, counters, *spend, &spent.hits);
                }
            }
            fail(batch, &err);
            give_back(db, Some(txid), refunds);
        }
    }
}

/// Gives `refunds` back, on a task of its own; first, when `txid` names a
/// transaction whose `COMMIT` reply was lost, only once it has committed.
fn give_back(db: &Arc<Db>, txid: Option<i64>, refunds: Vec<lost::Refund>) {
    if refunds.is_empty() {
        return;
    }
    tokio::spawn(settle(Arc::clone(db), txid, refunds));
}

async fn settle(db: Arc<Db>, txid: Option<i64>, refunds: Vec<lost::Refund>) {
    if let Some(txid) = txid
        && !lost::committed(&db, txid).await
    {
        return;
    }
    let n = refunds.len();
    let (requests, answers): (Vec<Request>, Vec<_>) = refunds
        .into_iter()
        .map(|refund| {
            let (reply, answer) = oneshot::channel();
            let request = Request {
                key: refund.key,
                op: Op::Amend {
                    namespace: refund.namespace,
                    expires_at: refund.expires_at,
                    amend: Amend::Refund(refund.cost),
                    reply,
                },
            };
            (request, answer)
        })
        .unzip();
    // Boxed: this runs in a task `send` spawns.
    Box::pin(send(&db, requests)).await;
    let mut failed = 0;
    for answer in answers {
        if !matches!(answer.await, Ok(Ok(_))) {
            failed += 1;
        }
    }
    if failed == 0 {
        tracing::info!(
            refunds = n,
            "spends refused after they were counted (a COMMIT's reply lost, or their caller gone): given back"
        );
    } else {
        tracing::warn!(
            refunds = n,
            failed,
            "spends refused after they were counted could not all be given back: they may stay counted"
        );
    }
}

/// The batch's transaction: lock and read, decide, write and commit.
async fn transaction<'a>(
    db: &Db,
    client: &Object,
    batch: &'a [Request],
) -> Result<Vec<Answer>, Failed> {
    // Each counter once, in the order first named.
    let mut index: HashMap<(&'a str, &'a [u8]), usize> = HashMap::with_capacity(batch.len());
    let (mut namespaces, mut keys, mut spends) = (Vec::new(), Vec::new(), Vec::<bool>::new());
    let mut deadlines = Vec::new();
    for request in batch {
        let key = request.key.as_bytes();
        let mut name = |namespace: &'a str, spend: bool| {
            let i = *index.entry((namespace, key)).or_insert_with(|| {
                namespaces.push(namespace);
                keys.push(key);
                spends.push(false);
                spends.len() - 1
            });
            spends[i] |= spend;
        };
        match &request.op {
            Op::Spend { counters, .. } => {
                for (namespace, _) in counters {
                    name(namespace, true);
                }
            }
            Op::Amend {
                namespace,
                expires_at,
                ..
            } => {
                name(namespace, false);
                deadlines.push(*expires_at);
            }
        }
    }
    let lock = client
        .prepare_cached(&db.sql.spend_lock)
        .await
        .map_err(pg_error)?;
    let read = client
        .prepare_cached(&db.sql.spend_read)
        .await
        .map_err(pg_error)?;
    let write = client
        .prepare_cached(&db.sql.spend_write)
        .await
        .map_err(pg_error)?;
    let (begun, (locked, read)) = both(
        client.batch_execute("BEGIN"),
        both(
            client.execute(&lock, &[&namespaces, &keys, &spends]),
            client.query(&read, &[&namespaces, &keys, &deadlines]),
        ),
    )
    .await;
    begun.map_err(pg_error)?;
    locked.map_err(pg_error)?;
    let read = read.map_err(pg_error)?;

    let mut rows: Vec<Row> = (0..namespaces.len()).map(|_| Row::missing()).collect();
    let mut now = SystemTime::now();
    let mut txid = None;
    for row in &read {
        let unread = |err: tokio_postgres::Error| BackendError::Unavailable(Box::new(err));
        let namespace: &str = row.try_get(0).map_err(unread)?;
        let key: &[u8] = row.try_get(1).map_err(unread)?;
        now = row.try_get(5).map_err(unread)?;
        txid = Some(row.try_get::<_, i64>(7).map_err(unread)?);
        let Some(&i) = index.get(&(namespace, key)) else {
            continue;
        };
        let fields = || -> Result<_, tokio_postgres::Error> {
            Ok((
                row.try_get::<_, Option<i64>>(2)?,
                row.try_get::<_, Option<SystemTime>>(3)?,
                row.try_get::<_, Option<SystemTime>>(4)?,
                row.try_get::<_, Vec<SystemTime>>(6)?,
            ))
        };
        let seen = &mut rows[i];
        seen.was = true;
        seen.exists = true;
        match fields() {
            Err(err) => seen.corrupt = Some(err.to_string()),
            Ok((count, expires_at, blocked_until, marked)) => {
                match classify(count, expires_at, now) {
                    Ok((count, expires_at)) => {
                        seen.count = count;
                        seen.expires_at = expires_at;
                    }
                    Err(detail) => seen.corrupt = Some(detail),
                }
                seen.blocked_until = blocked_until;
                seen.marked = marked.into();
            }
        }
    }

    let mut marks: Vec<usize> = Vec::new();
    let mut marked_at: Vec<SystemTime> = Vec::new();
    let answers: Vec<Answer> = batch
        .iter()
        .map(|request| {
            let key = request.key.as_bytes();
            match &request.op {
                Op::Spend {
                    counters, spend, ..
                } => {
                    let ids: SmallVec<[usize; 2]> = counters
                        .iter()
                        .map(|(namespace, _)| index[&(&**namespace, key)])
                        .collect();
                    Answer::Spent(spend_one(
                        &db.sql.table,
                        key,
                        &mut rows,
                        &ids,
                        counters,
                        *spend,
                        now,
                    ))
                }
                Op::Amend {
                    namespace,
                    expires_at,
                    amend,
                    ..
                } => {
                    let i = index[&(&**namespace, key)];
                    let changed = amend_one(&mut rows[i], *expires_at, *amend, now);
                    if changed && matches!(amend, Amend::Clear) {
                        marks.push(i);
                        marked_at.push(*expires_at);
                    }
                    Answer::Amended(changed)
                }
            }
        })
        .collect();

    // Every changed row as the batch left it.
    let (mut w_namespaces, mut w_keys, mut w_counts) = (Vec::new(), Vec::new(), Vec::new());
    let (mut w_expires, mut w_blocked, mut w_gone) = (Vec::new(), Vec::new(), Vec::new());
    for (i, row) in rows.iter().enumerate() {
        if !row.dirty || !row.was {
            continue;
        }
        w_namespaces.push(namespaces[i]);
        w_keys.push(keys[i]);
        w_counts.push(row.count);
        w_expires.push(row.expires_at);
        w_blocked.push(row.blocked_until);
        w_gone.push(!row.exists);
    }
    let m_namespaces: Vec<&str> = marks.iter().map(|&i| namespaces[i]).collect();
    let m_keys: Vec<&[u8]> = marks.iter().map(|&i| keys[i]).collect();
    if w_namespaces.is_empty() && marks.is_empty() {
        client.batch_execute("COMMIT").await.map_err(pg_error)?;
    } else {
        let (written, committed) = both(
            client.query_one(
                &write,
                &[
                    &w_namespaces,
                    &w_keys,
                    &w_counts,
                    &w_expires,
                    &w_blocked,
                    &w_gone,
                    &marked_at,
                    &m_namespaces,
                    &m_keys,
                ],
            ),
            // On a failed write the transaction is aborted, and this
            // COMMIT rolls it back.
            client.batch_execute("COMMIT"),
        )
        .await;
        if let (Err(err), Some(txid)) = (&committed, txid)
            && err.as_db_error().is_none()
        {
            // The connection failed with the COMMIT sent: it may have
            // committed.
            let err =
                BackendError::Unavailable(format!("the COMMIT's reply was lost: {err}").into());
            return Err(Failed::Lost { err, txid, answers });
        }
        let written: i64 = written.map_err(pg_error)?.get(0);
        committed.map_err(pg_error)?;
        debug_assert_eq!(written as usize, w_namespaces.len(), "rows held locked");
    }
    Ok(answers)
}

/// A counter's row as a `take_all` read it under its lock (`take_all.sql`),
/// checked: its count, `expires_at` and `blocked_until`.
pub(super) type Read = (i64, SystemTime, Option<SystemTime>);

/// The answer to the spend of a `take_all`, from its counters' rows as its
/// statement read them (`reads`, one per counter, in order), the statement
/// having written what the spend decides: the answer a spend of a batch
/// gets ([`spend_one`]), so both answer alike. A counter named twice is
/// one row, as in a batch.
pub(super) fn decide(
    table: &str,
    key: &[u8],
    reads: &[Read],
    counters: &[(Box<str>, Quota)],
    spend: Spend,
    now: SystemTime,
) -> Result<Spent, BackendError> {
    let mut rows: Vec<Row> = Vec::with_capacity(reads.len());
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(reads.len());
    let ids: SmallVec<[usize; 2]> = counters
        .iter()
        .zip(reads)
        .map(|((namespace, _), &(count, expires_at, blocked_until))| {
            *index.entry(namespace).or_insert_with(|| {
                rows.push(Row {
                    was: true,
                    exists: true,
                    count,
                    expires_at,
                    blocked_until,
                    ..Row::missing()
                });
                rows.len() - 1
            })
        })
        .collect();
    spend_one(table, key, &mut rows, &ids, counters, spend, now)
}

/// One spend, on the rows as the batch has left them so far: all or
/// nothing across its counters (see the contract, "Costs, lockouts and
/// amends").
fn spend_one(
    table: &str,
    key: &[u8],
    rows: &mut [Row],
    ids: &[usize],
    counters: &[(Box<str>, Quota)],
    spend: Spend,
    now: SystemTime,
) -> Result<Spent, BackendError> {
    let corrupt = |namespace: &str, detail: String| BackendError::Corrupt {
        key: describe(table, namespace, key),
        detail,
    };
    for (&i, (namespace, _)) in ids.iter().zip(counters) {
        let row = &mut rows[i];
        if let Some(detail) = &row.corrupt {
            return Err(corrupt(namespace, detail.clone()));
        }
        if !row.was {
            return Err(corrupt(
                namespace,
                "its row is gone while locked".to_owned(),
            ));
        }
        if !row.exists {
            // Deleted by a clear of this batch: made again, as the spend's
            // lock would, a closed window with no lockout.
            *row = Row {
                was: true,
                exists: true,
                dirty: true,
                marked: std::mem::take(&mut row.marked),
                ..Row::missing()
            };
        }
    }
    // Each counter as the spend finds it: its live count, its live window's
    // end, its live lockout's end.
    let seen: SmallVec<[Seen; 2]> = ids
        .iter()
        .map(|&i| {
            let row = &rows[i];
            let live = row.expires_at > now;
            (
                if live { row.count as u64 } else { 0 },
                live.then_some(row.expires_at),
                row.blocked_until.filter(|&b| b > now),
            )
        })
        .collect();
    // Each counter's own cost (`Spend::first` for the first), and what it
    // needs to fit.
    let need = |at: usize| spend.cost_of(at).max(1);
    let fits: SmallVec<[bool; 2]> = counters
        .iter()
        .zip(&seen)
        .enumerate()
        .map(|(at, ((_, quota), &(live, _, blocked)))| {
            blocked.is_none() && live.saturating_add(need(at)) <= quota.limit()
        })
        .collect();
    let admitted = fits.iter().all(|&f| f);
    let mut hits = Hits::with_capacity(counters.len());
    let mut cache = SmallVec::with_capacity(counters.len());
    for (at, (((&i, (_, quota)), &(live, expires_at, blocked)), &fit)) in
        ids.iter().zip(counters).zip(&seen).zip(&fits).enumerate()
    {
        let row = &mut rows[i];
        let window = quota.window().as_duration();
        let spent = spend.cost_of(at);
        let cost = i64::try_from(spent).unwrap_or(i64::MAX);
        let mut cached = None;
        if admitted {
            let opens = expires_at.is_none() && (spent > 0 || spend.open);
            let adds = expires_at.is_some() && spent > 0;
            if opens || adds {
                row.count = (live as i64).saturating_add(cost).min(i64::MAX - 1);
                if opens {
                    row.expires_at = now + window;
                }
                row.dirty = true;
                hits.push(Hit {
                    count: row.count as u64,
                    reset: left(row.expires_at, now),
                    deadline: deadline_id(row.expires_at),
                });
            } else {
                hits.push(Hit {
                    count: live,
                    reset: expires_at.map_or(window, |at| left(at, now)),
                    deadline: expires_at.and_then(deadline_id),
                });
            }
        } else if fit {
            hits.push(Hit {
                count: live,
                reset: expires_at.map_or(window, |at| left(at, now)),
                deadline: None,
            });
        } else {
            let locks = blocked.is_some() || spend.block.is_some();
            let count = refused_count(live, quota.limit(), locks, need(at));
            let mut reset = match (blocked, expires_at) {
                (Some(b), _) => left(b, now),
                (None, Some(at)) => left(at, now),
                (None, None) => window,
            };
            if let (Some(block), None) = (spend.block, blocked) {
                // Pinned to this first denial; the count is kept as it is.
                row.blocked_until = Some(now + block.as_duration());
                row.dirty = true;
                reset = block.as_duration();
            }
            if blocked.is_some() || spend.block.is_some() {
                cached = Some(Cached::Locked(reset));
            } else if live >= quota.limit() {
                // Even a check would be denied, until the window closes.
                cached = Some(Cached::Over(reset, quota.limit()));
            }
            hits.push(Hit {
                count,
                reset,
                deadline: None,
            });
        }
        cache.push(cached);
    }
    Ok(Spent { hits, cache })
}

/// One amend, on the row as the batch has left it so far: `true` when it
/// changed the counter. Only in the window named by `expires_at`, while it
/// is open and no reset marker names it; never below zero, never a count
/// that cannot grow, never a new row or a new lifetime.
fn amend_one(row: &mut Row, expires_at: SystemTime, amend: Amend, now: SystemTime) -> bool {
    if !row.exists
        || row.corrupt.is_some()
        || row.expires_at != expires_at
        || expires_at <= now
        || row.marked.contains(&expires_at)
    {
        return false;
    }
    match amend {
        Amend::Refund(n) => {
            if n == 0 || row.count == 0 {
                return false;
            }
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            row.count = row.count.saturating_sub(n).max(0);
        }
        Amend::Charge(n) => {
            if n == 0 {
                return false;
            }
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            row.count += n.min(i64::MAX - 1 - row.count);
        }
        Amend::Clear => {
            if row.blocked_until.is_some_and(|b| b > now) {
                // The lockout stays, on a closed window: no counter.
                row.count = 0;
                row.expires_at = UNIX_EPOCH;
            } else {
                row.exists = false;
            }
            row.marked.push(expires_at);
        }
    }
    row.dirty = true;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(count: i64, now: SystemTime) -> Row {
        Row {
            was: true,
            exists: true,
            count,
            expires_at: now + Duration::from_secs(60),
            ..Row::missing()
        }
    }

    #[test]
    fn amends_apply_in_order_only_to_their_window() {
        let now = SystemTime::now();
        let mut row = live(3, now);
        let at = row.expires_at;
        assert!(amend_one(&mut row, at, Amend::Refund(5), now));
        assert_eq!(row.count, 0, "never below zero");
        assert!(
            !amend_one(&mut row, at, Amend::Refund(1), now),
            "nothing to give back"
        );
        assert!(amend_one(&mut row, at, Amend::Charge(4), now));
        assert_eq!(row.count, 4);
        assert!(
            !amend_one(
                &mut row,
                at + Duration::from_micros(1),
                Amend::Charge(1),
                now
            ),
            "another window"
        );
        assert!(amend_one(&mut row, at, Amend::Clear, now));
        assert!(!row.exists && row.dirty);
        assert!(
            !amend_one(&mut row, at, Amend::Charge(1), now),
            "cleared: no counter"
        );
        let mut locked = live(2, now);
        locked.blocked_until = Some(now + Duration::from_secs(600));
        assert!(amend_one(&mut locked, at, Amend::Clear, now));
        assert!(locked.exists, "the lockout's row stays");
        assert_eq!((locked.count, locked.expires_at), (0, UNIX_EPOCH));
        assert_eq!(locked.marked.as_slice(), &[at]);
        let mut full = live(i64::MAX - 2, now);
        assert!(amend_one(&mut full, at, Amend::Charge(u64::MAX), now));
        assert_eq!(full.count, i64::MAX - 1, "never a count that cannot grow");
    }

    #[test]
    fn rows_no_spend_may_count_are_told_apart() {
        let now = SystemTime::now();
        let soon = Some(now + Duration::from_secs(1));
        assert!(classify(Some(0), soon, now).is_ok());
        assert!(classify(Some(-1), soon, now).is_err());
        assert!(classify(None, soon, now).is_err());
        assert!(classify(Some(i64::MAX), soon, now).is_err());
        assert!(classify(Some(1), None, now).is_err());
        let far = now + Duration::from_millis(WINDOW_BOUND_MS as u64 + 1_000);
        assert!(classify(Some(1), Some(far), now).is_err());
        assert!(classify(Some(1), Some(UNIX_EPOCH), now).is_ok(), "closed");
    }
}
