//! [`Leasing::take_all`](tower_pinned_window::backend::Leasing::take_all):
//! a slot of a key's cap and the request's counters, in one transaction
//! sent in one round trip.
//!
//! The transaction is pipelined, every statement sent before any answer is
//! read: `BEGIN`; `take_lock.sql` (the key's record of slots locked, an
//! empty one made when missing); `spend_lock.sql` (every counter's row
//! locked, in the order hits and spends lock them, a missing one created
//! as a closed window); `take_all.sql` (the step decided and written, on
//! what the locks hold); `take_end.sql`; `COMMIT`. `take_all.sql` starts
//! after the locks are taken, so its snapshot reads the record and the
//! rows exactly as the steps before left them, and nothing changes them
//! until the `COMMIT`: one atomic step, with the database's clock. A record
//! or a row that is not of the store's shape fails the step there, with
//! nothing written; `take_end.sql` then aborts the transaction, so that the
//! `COMMIT` rolls back what the locks made too.
//!
//! Only this step holds a record of slots and counters at once, always
//! the record first, then the counters in one order (`namespace, key`):
//! it never deadlocks with a take, a give-back, an extend (records only),
//! a hit or a batch of spends (counters only), or another `take_all`.
//!
//! A spend's answer is worked out here from the rows as the statement read
//! them, by the same code that answers the spends of a batch, so both
//! answer alike; the statement itself writes what that code decides.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use smallvec::SmallVec;
use tokio_postgres::Row;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::lease::{corrupt as corrupt_slots, millis};
use super::row::{WINDOW_BOUND_MS, deadline_id, describe};
use super::spend::{self, Cached, InTransaction, Read, Spent, both, classify};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{BackendError, Hit, Hits, InFlight, SlotId, Spend, Taken};
use tower_pinned_window::key::Key;

/// One `take_all`, owned: what its future sends.
pub(super) struct Step {
    /// The cap's namespace: the record of slots is the pair's.
    pub(super) namespace: Box<str>,
    pub(super) key: Key,
    pub(super) cap: InFlight,
    pub(super) slot: SlotId,
    /// Each counter's namespace and quota, in order.
    pub(super) counters: Vec<(Box<str>, Quota)>,
    /// `None`: the counters are hit.
    pub(super) spend: Option<Spend>,
}

/// One counter as the statement returned it.
struct Counter {
    namespace: String,
    /// The row was there (the lock made it when missing).
    was: bool,
    /// No hit may count it: the step failed.
    bad: bool,
    count: Option<i64>,
    expires_at: Option<SystemTime>,
    blocked_until: Option<SystemTime>,
    /// Hits: its count and `expires_at` after the step.
    hit: Option<(i64, SystemTime)>,
}

/// The step as the statement returned it.
struct Outcome {
    found: bool,
    fine: bool,
    ok: bool,
    held: bool,
    in_use: u64,
    earliest: Option<SystemTime>,
    counts: bool,
    taken: bool,
    now: SystemTime,
    counters: Vec<Counter>,
}

/// The step, in one transaction of one round trip; its hits, with the
/// cap's answer, and what the local deny cache may learn from them.
pub(super) async fn run(db: Arc<Db>, step: Step) -> Result<Spent, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    // Dropped, never handed out again, unless the transaction ended.
    let client = InTransaction::new(client);
    let outcome = transaction(&db, client.client(), &step).await?;
    client.release();
    answer(&db, &step, outcome)
}

async fn transaction(
    db: &Db,
    client: &deadpool_postgres::Object,
    step: &Step,
) -> Result<Outcome, BackendError> {
    let lock_slots = client
        .prepare_cached(&db.sql.take_lock)
        .await
        .map_err(pg_error)?;
    let lock_counters = client
        .prepare_cached(&db.sql.spend_lock)
        .await
        .map_err(pg_error)?;
    let decide = client
        .prepare_cached(&db.sql.take_all)
        .await
        .map_err(pg_error)?;
    let end = client
        .prepare_cached(&db.sql.take_end)
        .await
        .map_err(pg_error)?;
    let key = step.key.as_bytes();
    let lease = millis(step.cap.lease());
    let max = i64::try_from(step.cap.max()).unwrap_or(i64::MAX);
    let slot = step.slot.to_string();
    // The lock names each row once (a row named twice in one INSERT would
    // be an error); the statement after it, each counter in order.
    let mut locks: Vec<&str> = Vec::with_capacity(step.counters.len());
    for (namespace, _) in &step.counters {
        if !locks.contains(&&**namespace) {
            locks.push(namespace);
        }
    }
    let lock_keys: Vec<&[u8]> = vec![key; locks.len()];
    let creates: Vec<bool> = vec![true; locks.len()];
    let namespaces: Vec<&str> = step.counters.iter().map(|(n, _)| &**n).collect();
    let windows: Vec<i64> = step
        .counters
        .iter()
        .map(|(_, q)| millis(q.window()))
        .collect();
    let limits: Vec<i64> = step
        .counters
        .iter()
        .map(|(_, q)| i64::try_from(q.limit()).unwrap_or(i64::MAX))
        .collect();
    let spends = step.spend.is_some();
    let spend = step.spend.unwrap_or(Spend::cost(0));
    let cost = i64::try_from(spend.cost).unwrap_or(i64::MAX);
    let first: Option<i64> = spend
        .first
        .map(|unit| i64::try_from(unit).unwrap_or(i64::MAX));
    let block: Option<i64> = spend.block.map(millis);
    let (begun, (slots_locked, (counters_locked, (decided, (ended, committed))))) = both(
        client.batch_execute("BEGIN"),
        both(
            client.execute(&lock_slots, &[&&*step.namespace, &key, &lease]),
            both(
                client.execute(&lock_counters, &[&locks, &lock_keys, &creates]),
                both(
                    client.query(
                        &decide,
                        &[
                            &&*step.namespace,
                            &key,
                            &slot,
                            &max,
                            &lease,
                            &namespaces,
                            &windows,
                            &limits,
                            &spends,
                            &cost,
                            &spend.open,
                            &block,
                            &WINDOW_BOUND_MS,
                            &first,
                        ],
                    ),
                    both(
                        client.execute(&end, &[]),
                        // After a failed statement the transaction is
                        // aborted, and this COMMIT rolls it back.
                        client.batch_execute("COMMIT"),
                    ),
                ),
            ),
        ),
    )
    .await;
    begun.map_err(pg_error)?;
    slots_locked.map_err(pg_error)?;
    counters_locked.map_err(pg_error)?;
    let rows = decided.map_err(pg_error)?;
    let outcome = read(&rows).map_err(|err| BackendError::Unavailable(Box::new(err)))?;
    if outcome.ok {
        ended.map_err(pg_error)?;
    }
    // A failed step: `take_end.sql` failed on purpose, and the COMMIT
    // rolled back.
    committed.map_err(pg_error)?;
    Ok(outcome)
}

/// What the statement's rows say.
fn read(rows: &[Row]) -> Result<Outcome, tokio_postgres::Error> {
    let Some(first) = rows.first() else {
        // One row at least, even for no counter: never here.
        return Ok(Outcome {
            found: false,
            fine: false,
            ok: false,
            held: false,
            in_use: 0,
            earliest: None,
            counts: false,
            taken: false,
            now: SystemTime::now(),
            counters: Vec::new(),
        });
    };
    let mut counters = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(namespace) = row.try_get::<_, Option<String>>(10)? else {
            continue;
        };
        let bad = row.try_get::<_, Option<bool>>(12)?.unwrap_or(false);
        // A corrupt row's columns are read only to name what is wrong in
        // it: one that cannot be read is named as unknown.
        let (count, expires_at, blocked_until) = if bad {
            (
                row.try_get(13).unwrap_or(None),
                row.try_get(14).unwrap_or(None),
                row.try_get(15).unwrap_or(None),
            )
        } else {
            (row.try_get(13)?, row.try_get(14)?, row.try_get(15)?)
        };
        let hit = match (row.try_get::<_, Option<i64>>(16)?, row.try_get(17)?) {
            (Some(count), Some(expires_at)) => Some((count, expires_at)),
            _ => None,
        };
        counters.push(Counter {
            namespace,
            was: row.try_get::<_, Option<bool>>(11)?.unwrap_or(false),
            bad,
            count,
            expires_at,
            blocked_until,
            hit,
        });
    }
    Ok(Outcome {
        found: first.try_get(0)?,
        fine: first.try_get(1)?,
        ok: first.try_get(2)?,
        held: first.try_get(3)?,
        in_use: first.try_get::<_, i64>(4)?.max(0) as u64,
        earliest: first.try_get(5)?,
        counts: first.try_get(6)?,
        taken: first.try_get(7)?,
        now: first.try_get(9)?,
        counters,
    })
}

/// The answer to `step` from what its statement did.
fn answer(db: &Db, step: &Step, outcome: Outcome) -> Result<Spent, BackendError> {
    let key = step.key.as_bytes();
    if !outcome.ok {
        return Err(failed(db, step, &outcome));
    }
    let now = outcome.now;
    let left = |at: SystemTime| at.duration_since(now).unwrap_or(Duration::ZERO);
    let granted = |in_use| Taken {
        granted: true,
        in_use,
        retry: Duration::ZERO,
    };
    if !outcome.counts {
        // Held already, or refused by a full cap: the counters are read.
        let hits = step
            .counters
            .iter()
            .zip(&outcome.counters)
            .map(|((_, quota), c)| match (c.count, c.expires_at) {
                (Some(count), Some(at)) if at > now => Hit {
                    count: count.max(0) as u64,
                    reset: left(at),
                    deadline: None,
                },
                _ => Hit {
                    count: 0,
                    reset: quota.window().as_duration(),
                    deadline: None,
                },
            })
            .collect::<Hits>();
        let taken = if outcome.held {
            granted(outcome.in_use)
        } else {
            Taken {
                granted: false,
                in_use: outcome.in_use,
                retry: outcome.earliest.map_or(Duration::ZERO, left),
            }
        };
        let cache = step.counters.iter().map(|_| None).collect();
        return Ok(Spent {
            hits: hits.with_taken(Some(taken)),
            cache,
        });
    }
    let Spent { hits, cache } = match step.spend {
        Some(spend) => {
            let reads: Vec<Read> = outcome
                .counters
                .iter()
                .map(|c| {
                    (
                        c.count.unwrap_or(0),
                        c.expires_at.unwrap_or(SystemTime::UNIX_EPOCH),
                        c.blocked_until,
                    )
                })
                .collect();
            spend::decide(&db.sql.table, key, &reads, &step.counters, spend, now)?
        }
        None => counted(db, step, &outcome)?,
    };
    let admitted = hits
        .iter()
        .zip(&step.counters)
        .all(|(hit, (_, quota))| hit.count <= quota.limit());
    debug_assert_eq!(
        admitted, outcome.taken,
        "the statement takes the slot when the counters admit the request"
    );
    let taken = outcome.taken.then(|| granted(outcome.in_use + 1));
    Ok(Spent {
        hits: hits.with_taken(taken),
        cache,
    })
}

/// Hits counted by the statement: each counter's count after the step (a
/// counter named `n` times was hit `n` times, and its first hit gets
/// `count - n + 1`, as in a batch of hits), and what the deny cache learns
/// from a hit over its limit.
fn counted(db: &Db, step: &Step, outcome: &Outcome) -> Result<Spent, BackendError> {
    let mut named: HashMap<&str, u64> = HashMap::with_capacity(step.counters.len());
    for (namespace, _) in &step.counters {
        *named.entry(namespace).or_default() += 1;
    }
    let mut seen: HashMap<&str, u64> = HashMap::with_capacity(step.counters.len());
    let mut hits = Hits::with_capacity(step.counters.len());
    let mut cache: SmallVec<[Option<Cached>; 2]> = SmallVec::with_capacity(step.counters.len());
    for ((namespace, quota), c) in step.counters.iter().zip(&outcome.counters) {
        let Some((count, expires_at)) = c.hit else {
            return Err(BackendError::Corrupt {
                key: describe(&db.sql.table, namespace, step.key.as_bytes()),
                detail: "a row the hit would not count".to_owned(),
            });
        };
        let n = named[&**namespace];
        let j = seen.entry(namespace).or_default();
        *j += 1;
        let count = (count.max(0) as u64).saturating_sub(n - *j);
        let hit = Hit {
            count,
            reset: expires_at
                .duration_since(outcome.now)
                .unwrap_or(Duration::ZERO),
            deadline: deadline_id(expires_at),
        };
        cache.push((count > quota.limit()).then_some(Cached::Over(hit.reset, quota.limit())));
        hits.push(hit);
    }
    Ok(Spent { hits, cache })
}

/// Why the step failed: the record of slots, or the first counter's row no
/// hit may count, named as every other step names them.
fn failed(db: &Db, step: &Step, outcome: &Outcome) -> BackendError {
    let key = step.key.as_bytes();
    if !outcome.found {
        // The lock made the record, and holds it: never here.
        return BackendError::Unavailable("the key's record of slots is gone while locked".into());
    }
    if !outcome.fine {
        return corrupt_slots(db, &step.namespace, key);
    }
    for c in &outcome.counters {
        let detail = if c.bad {
            match classify(c.count, c.expires_at, outcome.now) {
                Err(detail) => detail,
                Ok(_) => "blocked_until is infinite".to_owned(),
            }
        } else if !c.was {
            "its row is gone while locked".to_owned()
        } else {
            continue;
        };
        return BackendError::Corrupt {
            key: describe(&db.sql.table, &c.namespace, key),
            detail,
        };
    }
    BackendError::Unavailable("the take_all statement refused the step".into())
}
