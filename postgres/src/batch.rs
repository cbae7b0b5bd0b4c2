//! Hits in flight together, sent in one statement.
//!
//! A hit is queued, and a sender task takes the queue's hits (up to
//! [`MAX_BATCH`]) into one execution of the hit statement. At most
//! `statements` senders run at once; when all are busy, hits wait in the
//! queue and go out together in the next statement. So a lone hit is sent at
//! once, alone, and under load each statement carries the hits that arrived
//! while the previous ones were running: no timer, no added wait.
//!
//! Hits on one counter in the same statement are one row with their number
//! of hits; the row's new count tells each hit its own count (the first of
//! `n` hits gets `count - n + 1`), so exactly `limit` of them are admitted,
//! as if they had been sent one by one in that order.
//!
//! A hit whose caller has given up (its future dropped: the request timed
//! out or went away) before its statement is sent is not sent.
//!
//! The queue and its senders are generic over the [`Job`] they carry: the
//! spends and amends (`spend.rs`) go through a queue of their own, the same
//! way, one transaction per batch.

use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::row::{HitRow, WINDOW_BOUND_MS, describe, read_row};
use tower_pinned_window::backend::BackendError;
use tower_pinned_window::key::Key;

/// The most counters one statement carries.
pub(super) const MAX_BATCH: usize = 128;

/// Hits waiting beyond this many are refused at once
/// ([`BackendError::Unavailable`]): the database is not keeping up, and a
/// longer queue would only answer later.
const MAX_QUEUED: usize = 65_536;

/// Statements in flight at once, unless configured otherwise.
///
/// Example: [`PostgresBackendBuilder`](super::PostgresBackendBuilder).
pub const DEFAULT_STATEMENTS: usize = 4;

/// What one counter's hit gets back: its row after the statement.
pub(super) type Reply = Result<HitRow, BackendError>;

/// One counter to hit, and where its answer goes.
pub(super) struct Pending {
    pub(super) namespace: Box<str>,
    pub(super) key: Key,
    pub(super) window_ms: i64,
    pub(super) reply: oneshot::Sender<Reply>,
}

/// What a queue carries: one caller's request, with where its answer goes.
pub(super) trait Job: Send + Sized + 'static {
    /// The most jobs one batch carries.
    const MAX_BATCH: usize;

    /// Whether the caller has given up (its future dropped): such a job is
    /// not sent.
    fn is_closed(&self) -> bool;

    /// Answer the caller with `err`.
    fn fail(self, err: BackendError);

    /// Send `batch` to `db` (one statement, or one transaction), and answer
    /// every job of it.
    fn send(db: &Arc<Db>, batch: Vec<Self>) -> impl Future<Output = ()> + Send;
}

impl Job for Pending {
    const MAX_BATCH: usize = MAX_BATCH;

    fn is_closed(&self) -> bool {
        self.reply.is_closed()
    }

    fn fail(self, err: BackendError) {
        let _ = self.reply.send(Err(err));
    }

    fn send(db: &Arc<Db>, batch: Vec<Self>) -> impl Future<Output = ()> + Send {
        send(db, batch)
    }
}

/// The queue of hits (or of another [`Job`]), its senders, and the database
/// they send to.
pub(super) struct Batcher<J = Pending> {
    db: Arc<Db>,
    queue: Mutex<Vec<J>>,
    senders: AtomicUsize,
    max_senders: usize,
}

impl<J: Job> Batcher<J> {
    /// At most `statements` senders at once, to `db`.
    pub(super) fn new(statements: NonZeroUsize, db: Arc<Db>) -> Self {
        Self {
            db,
            queue: Mutex::new(Vec::new()),
            senders: AtomicUsize::new(0),
            max_senders: statements.get(),
        }
    }

    /// The most senders at once.
    pub(super) fn statements(&self) -> usize {
        self.max_senders
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<J>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Take a sender's place, if one is free.
    fn try_claim(&self) -> bool {
        let mut running = self.senders.load(Ordering::Acquire);
        loop {
            if running >= self.max_senders {
                return false;
            }
            match self.senders.compare_exchange_weak(
                running,
                running + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => running = now,
            }
        }
    }
}

/// Queue `jobs` and make sure a sender will send them. Must be called on a
/// Tokio runtime.
pub(super) fn submit<J: Job>(batcher: &Arc<Batcher<J>>, jobs: impl IntoIterator<Item = J>) {
    let refused = {
        let mut queue = batcher.lock();
        let before = queue.len();
        queue.extend(jobs);
        if queue.len() > MAX_QUEUED {
            queue.split_off(before)
        } else {
            Vec::new()
        }
    };
    for job in refused {
        job.fail(BackendError::Unavailable(
            "too many PostgreSQL requests waiting to be sent".into(),
        ));
    }
    if batcher.try_claim() {
        tokio::spawn(send_loop(Arc::clone(batcher)));
    }
}

/// A sender's place, given back when dropped: also when the task is
/// cancelled (its runtime shut down), so a place is never lost.
struct Place<'a, J>(&'a Batcher<J>);

impl<J> Drop for Place<'_, J> {
    fn drop(&mut self) {
        self.0.senders.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A sender: statements until the queue is empty. It holds the place
/// [`submit`] claimed for it.
async fn send_loop<J: Job>(batcher: Arc<Batcher<J>>) {
    let batcher = &*batcher;
    let mut place = Place(batcher);
    loop {
        let batch: Vec<J> = {
            let mut queue = batcher.lock();
            queue.retain(|job| !job.is_closed());
            let n = queue.len().min(J::MAX_BATCH);
            queue.drain(..n).collect()
        };
        if batch.is_empty() {
            drop(place);
            // A hit queued after the look above may have found every place
            // taken, counting on this sender: look again.
            if batcher.lock().is_empty() || !batcher.try_claim() {
                return;
            }
            place = Place(batcher);
            continue;
        }
        J::send(&batcher.db, batch).await;
        // Let the callers just answered queue their next hits before this
        // sender looks again, so they go out together rather than one by one
        // (measured: up to 1.5 times the hits per second at 16 in flight).
        tokio::task::yield_now().await;
    }
}

/// One statement for `batch`, and every hit's answer.
async fn send(db: &Db, mut batch: Vec<Pending>) {
    let client = match db.pool.get().await {
        Ok(client) => client,
        Err(err) => return fail(batch, &pool_error(err)),
    };
    batch.retain(|hit| !hit.reply.is_closed());
    if batch.is_empty() {
        return;
    }
    // One row per counter, with its number of hits.
    let mut rows: HashMap<(&str, &[u8]), usize> = HashMap::with_capacity(batch.len());
    let (mut namespaces, mut keys, mut hits, mut windows) =
        (Vec::new(), Vec::new(), Vec::<i64>::new(), Vec::new());
    let mut row_of = Vec::with_capacity(batch.len());
    for hit in &batch {
        let row = *rows
            .entry((&*hit.namespace, hit.key.as_bytes()))
            .or_insert_with(|| {
                namespaces.push(&*hit.namespace);
                keys.push(hit.key.as_bytes());
                hits.push(0);
                windows.push(hit.window_ms);
                hits.len() - 1
            });
        hits[row] += 1;
        row_of.push(row);
    }
    let result = async {
        let statement = client.prepare_cached(&db.sql.hit).await.map_err(pg_error)?;
        client
            .query(
                &statement,
                &[&namespaces, &keys, &hits, &windows, &WINDOW_BOUND_MS],
            )
            .await
            .map_err(pg_error)
    }
    .await;
    let returned = match result {
        Ok(returned) => returned,
        Err(err) => return fail(batch, &err),
    };
    // Each row's count after the statement, and where its first hit stands.
    let mut counted: Vec<Option<(HitRow, u64)>> = vec![None; hits.len()];
    for row in &returned {
        let read = || -> Result<_, tokio_postgres::Error> {
            Ok((
                row.try_get::<_, &str>(0)?,
                row.try_get::<_, &[u8]>(1)?,
                row.try_get::<_, i64>(2)?,
                row.try_get(3)?,
                row.try_get(4)?,
            ))
        };
        let (namespace, key, count, expires_at, now) = match read() {
            Ok(read) => read,
            Err(err) => return fail(batch, &BackendError::Unavailable(Box::new(err))),
        };
        let Some(&i) = rows.get(&(namespace, key)) else {
            continue;
        };
        let n = hits[i] as u64;
        if let Ok(count) = u64::try_from(count)
            && count >= n
        {
            let at = HitRow {
                count,
                expires_at,
                now,
            };
            counted[i] = Some((at, count - n + 1));
        }
    }
    // Rows that did not come back: the statement would not count them.
    let mut corrupt: Vec<Option<String>> = vec![None; hits.len()];
    for (i, found) in counted.iter().enumerate() {
        if found.is_none() {
            let detail = match client
                .query_opt(db.sql.peek.as_str(), &[&namespaces[i], &keys[i]])
                .await
            {
                Ok(Some(row)) => match read_row(&row) {
                    Err(detail) => detail,
                    Ok(_) => "a row the hit would not count, which has changed since".to_owned(),
                },
                Ok(None) => "a row the hit would not count, which is gone since".to_owned(),
                Err(err) => format!("a row the hit would not count, unread: {err}"),
            };
            corrupt[i] = Some(detail);
        }
    }
    drop(client);
    drop((rows, namespaces, keys));
    for (hit, i) in batch.into_iter().zip(row_of) {
        let reply = match (&mut counted[i], &corrupt[i]) {
            (Some((at, next)), _) => {
                let reply = HitRow {
                    count: *next,
                    ..*at
                };
                *next += 1;
                Ok(reply)
            }
            (None, detail) => Err(BackendError::Corrupt {
                key: describe(&db.sql.table, &hit.namespace, hit.key.as_bytes()),
                detail: detail.clone().unwrap_or_default(),
            }),
        };
        let _ = hit.reply.send(reply);
    }
}

/// Every job of `batch` fails with `err`.
pub(super) fn fail<J: Job>(batch: Vec<J>, err: &BackendError) {
    for job in batch {
        job.fail(share(err));
    }
}

/// `err` again, for another job of the same statement.
pub(super) fn share(err: &BackendError) -> BackendError {
    match err {
        BackendError::TimedOut => BackendError::TimedOut,
        BackendError::AtCapacity => BackendError::AtCapacity,
        BackendError::CircuitOpen => BackendError::CircuitOpen,
        BackendError::Corrupt { key, detail } => BackendError::Corrupt {
            key: key.clone(),
            detail: detail.clone(),
        },
        other => BackendError::Unavailable(other.to_string().into()),
    }
}
