//! Spends and amends: one transaction per spend, one statement per amend.
//!
//! A spend bypasses the hit batching and the local deny cache: it locks the
//! rows of all its counters (creating a missing one as a closed window),
//! reads them, decides all or nothing, and writes, in one transaction.

use std::time::{Duration, SystemTime};

use super::PostgresBackend;
use super::error::{pg_error, pool_error};
use super::row::{WINDOW_BOUND_MS, deadline_id, describe};
use crate::backend::{BackendError, Counter, Hit, Hits, Spend};
use crate::key::Key;

/// One counter's row as the spend read it.
struct Seen {
    /// The count of the live window (0 when there is none).
    live: u64,
    /// The live window's end, if any.
    expires_at: Option<SystemTime>,
    /// The live lockout's end, if any.
    blocked_until: Option<SystemTime>,
}

fn left(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

pub(super) async fn spend_all(
    backend: &PostgresBackend,
    key: &Key,
    counters: &[Counter<'_>],
    spend: Spend,
) -> Result<Hits, BackendError> {
    if counters.is_empty() {
        return Ok(Hits::new());
    }
    let db = &backend.inner.db;
    let mut client = db.pool.get().await.map_err(pool_error)?;
    let transaction = client.transaction().await.map_err(pg_error)?;
    let namespaces: Vec<&str> = counters.iter().map(|c| c.namespace).collect();
    let keys: Vec<&[u8]> = counters.iter().map(|_| key.as_bytes()).collect();
    transaction
        .execute(db.sql.spend_lock.as_str(), &[&namespaces, &keys])
        .await
        .map_err(pg_error)?;
    let rows = transaction
        .query(db.sql.spend_read.as_str(), &[&namespaces, &key.as_bytes()])
        .await
        .map_err(pg_error)?;
    let corrupt = |namespace: &str, detail: String| BackendError::Corrupt {
        key: describe(&db.sql.table, namespace, key.as_bytes()),
        detail,
    };
    let mut now = SystemTime::now();
    let mut seen = Vec::with_capacity(counters.len());
    for counter in counters {
        let row = rows
            .iter()
            .find(|row| row.try_get::<_, &str>(0).ok() == Some(counter.namespace))
            .ok_or_else(|| corrupt(counter.namespace, "its row is gone while locked".to_owned()))?;
        let read = || -> Result<_, tokio_postgres::Error> {
            Ok((
                row.try_get::<_, Option<i64>>(1)?,
                row.try_get::<_, Option<SystemTime>>(2)?,
                row.try_get::<_, Option<SystemTime>>(3)?,
                row.try_get::<_, SystemTime>(4)?,
            ))
        };
        let (count, expires_at, blocked_until, at) =
            read().map_err(|e| corrupt(counter.namespace, e.to_string()))?;
        now = at;
        let count = match count {
            Some(c) if (0..i64::MAX).contains(&c) => c as u64,
            other => return Err(corrupt(counter.namespace, format!("count {other:?}"))),
        };
        let Some(expires_at) = expires_at else {
            return Err(corrupt(counter.namespace, "expires_at is NULL".to_owned()));
        };
        let bound = Duration::from_millis(WINDOW_BOUND_MS as u64);
        if left(expires_at, now) > bound {
            return Err(corrupt(
                counter.namespace,
                "expires_at past the bound (or infinity)".to_owned(),
            ));
        }
        let live = expires_at > now;
        seen.push(Seen {
            live: if live { count } else { 0 },
            expires_at: live.then_some(expires_at),
            blocked_until: blocked_until.filter(|&b| b > now),
        });
    }
    let need = spend.cost.max(1);
    let fits: Vec<bool> = counters
        .iter()
        .zip(&seen)
        .map(|(c, s)| s.blocked_until.is_none() && s.live.saturating_add(need) <= c.quota.limit())
        .collect();
    let admitted = fits.iter().all(|&f| f);
    let cost = i64::try_from(spend.cost).unwrap_or(i64::MAX);
    let mut hits = Hits::with_capacity(counters.len());
    for ((counter, s), &fit) in counters.iter().zip(&seen).zip(&fits) {
        let window = counter.quota.window().as_duration();
        let window_ms = counter.quota.window().as_millis() as i64;
        if admitted {
            let opens = s.expires_at.is_none() && (spend.cost > 0 || spend.open);
            let adds = s.expires_at.is_some() && spend.cost > 0;
            if opens || adds {
                let count = (s.live as i64).saturating_add(cost).min(i64::MAX - 1);
                let row = transaction
                    .query_one(
                        db.sql.spend_write.as_str(),
                        &[
                            &counter.namespace,
                            &key.as_bytes(),
                            &count,
                            &opens.then_some(window_ms),
                            &None::<i64>,
                        ],
                    )
                    .await
                    .map_err(pg_error)?;
                let (expires_at, at): (SystemTime, SystemTime) = (row.get(0), row.get(1));
                hits.push(Hit {
                    count: count as u64,
                    reset: left(expires_at, at),
                    deadline: deadline_id(expires_at),
                });
            } else {
                hits.push(Hit {
                    count: s.live,
                    reset: s.expires_at.map_or(window, |at| left(at, now)),
                    deadline: s.expires_at.and_then(deadline_id),
                });
            }
        } else if fit {
            hits.push(Hit {
                count: s.live,
                reset: s.expires_at.map_or(window, |at| left(at, now)),
                deadline: None,
            });
        } else {
            let count = s
                .live
                .saturating_add(need)
                .max(counter.quota.limit().saturating_add(1));
            let mut reset = match (s.blocked_until, s.expires_at) {
                (Some(b), _) => left(b, now),
                (None, Some(at)) => left(at, now),
                (None, None) => window,
            };
            if let (Some(block), None) = (spend.block, s.blocked_until) {
                let block_ms = block.as_millis() as i64;
                let live = i64::try_from(s.live).unwrap_or(i64::MAX);
                let row = transaction
                    .query_one(
                        db.sql.spend_write.as_str(),
                        &[
                            &counter.namespace,
                            &key.as_bytes(),
                            // A closed window keeps its stored count.
                            &if s.expires_at.is_some() {
                                Some(live)
                            } else {
                                None
                            },
                            &None::<i64>,
                            &Some(block_ms),
                        ],
                    )
                    .await;
                // The count is written as it was: COALESCE below.
                row.map_err(pg_error)?;
                reset = block.as_duration();
            }
            hits.push(Hit {
                count,
                reset,
                deadline: None,
            });
        }
    }
    transaction.commit().await.map_err(pg_error)?;
    Ok(hits)
}
