//! The provider's word ([`Heeding`](tower_pinned_window::backend::Heeding)):
//! a close and a raise, each one statement (`sql/close.sql`,
//! `sql/raise.sql`) on the counter's row, under its row lock, on the
//! database's clock. Not batched: a provider speaks rarely, so there is
//! nothing to share a statement with.
//!
//! A close writes the row's `blocked_until`, the lockout a spend sets and
//! reads, and never its count or `expires_at`; a raise writes its count
//! (and, for a window it opens, `expires_at`), never `blocked_until`. Each
//! statement also reads the row as it stood before it (its snapshot), so
//! a row it refused is named and described in one round trip.

use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::row::{WINDOW_BOUND_MS, deadline_id, describe};
use super::spend::classify;
use tower_pinned_window::Window;
use tower_pinned_window::backend::{BackendError, Hit};
use tower_pinned_window::key::Key;

/// The most a count is raised to: a count that can still grow (the
/// statements refuse `i64::MAX`, as a hit does).
const MOST: u64 = i64::MAX as u64 - 1;

fn unread(err: tokio_postgres::Error) -> BackendError {
    BackendError::Unavailable(Box::new(err))
}

fn left(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

/// Why the row as it stood (`count`, `expires_at`, then `blocked_until`
/// when `lockout`, from column `at`; whether there was one in the column
/// after them) is one the statement refused; `None` when it is not corrupt
/// (or there was none: it changed under the statement, a row made
/// meanwhile by another transaction).
fn refused(row: &Row, at: usize, lockout: bool, now: SystemTime) -> Option<String> {
    let read = || -> Result<_, tokio_postgres::Error> {
        let blocked_until = if lockout {
            row.try_get::<_, Option<SystemTime>>(at + 2)?
        } else {
            None
        };
        let was = row.try_get::<_, bool>(at + 2 + usize::from(lockout))?;
        Ok((
            was,
            row.try_get::<_, Option<i64>>(at)?,
            row.try_get::<_, Option<SystemTime>>(at + 1)?,
            blocked_until,
        ))
    };
    let (was, count, expires_at, blocked_until) = match read() {
        Ok(read) => read,
        Err(err) => return Some(err.to_string()),
    };
    if !was {
        return None;
    }
    if let Err(detail) = classify(count, expires_at, now) {
        return Some(detail);
    }
    blocked_until
        .filter(|&b| left(b, now) > Duration::from_millis(WINDOW_BOUND_MS as u64))
        .map(|_| "a lockout without a lifetime (blocked_until past the bound, or infinity)".into())
}

/// Close `namespace`'s counter for `key` for `span`: the time left of its
/// lockout after the step.
pub(super) async fn close(
    db: &Db,
    namespace: &str,
    key: &Key,
    span: Window,
) -> Result<Duration, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.close)
        .await
        .map_err(pg_error)?;
    // Window::MAX keeps every span inside i64 milliseconds.
    let span_ms = span.as_millis() as i64;
    let row = client
        .query_one(&statement, &[&namespace, &key.as_bytes(), &span_ms])
        .await
        .map_err(pg_error)?;
    let closed: Option<SystemTime> = row.try_get(0).map_err(unread)?;
    let now: SystemTime = row.try_get(1).map_err(unread)?;
    if let Some(until) = closed {
        return Ok(left(until, now));
    }
    Err(match refused(&row, 2, true, now) {
        Some(detail) => BackendError::Corrupt {
            key: describe(&db.sql.table, namespace, key.as_bytes()),
            detail,
        },
        None => BackendError::Unavailable(
            "the counter's row changed under the close: not closed".into(),
        ),
    })
}

/// What a raise asks of a counter: at least `count`, at most `limit`; a
/// window it opens lasts `min(window, within)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Raise {
    pub(super) count: u64,
    pub(super) limit: u64,
    pub(super) window: Window,
    pub(super) within: Window,
}

/// Raise `namespace`'s counter for `key` as `raise` asks: the counter after
/// the step.
pub(super) async fn raise(
    db: &Db,
    namespace: &str,
    key: &Key,
    raise: Raise,
) -> Result<Hit, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.raise)
        .await
        .map_err(pg_error)?;
    let (count, limit) = (raise.count.min(MOST) as i64, raise.limit.min(MOST) as i64);
    let (window, within) = (
        raise.window.as_millis() as i64,
        raise.within.as_millis() as i64,
    );
    let row = client
        .query_one(
            &statement,
            &[
                &namespace,
                &key.as_bytes(),
                &count,
                &limit,
                &window,
                &within,
            ],
        )
        .await
        .map_err(pg_error)?;
    let raised: Option<i64> = row.try_get(0).map_err(unread)?;
    let expires_at: Option<SystemTime> = row.try_get(1).map_err(unread)?;
    let now: SystemTime = row.try_get(2).map_err(unread)?;
    let corrupt = |detail| BackendError::Corrupt {
        key: describe(&db.sql.table, namespace, key.as_bytes()),
        detail,
    };
    if let (Some(raised), Some(expires_at)) = (raised, expires_at) {
        return Ok(Hit {
            count: raised as u64,
            reset: left(expires_at, now),
            deadline: deadline_id(expires_at),
        });
    }
    if let Some(detail) = refused(&row, 3, false, now) {
        return Err(corrupt(detail));
    }
    if count > 0 {
        return Err(BackendError::Unavailable(
            "the counter's row changed under the raise: not raised".into(),
        ));
    }
    // A raise of 0: the counter as it stands, read from the statement's
    // snapshot (the row lock was not taken, and nothing was written).
    let stood: (Option<i64>, Option<SystemTime>) = (
        row.try_get(3).map_err(unread)?,
        row.try_get(4).map_err(unread)?,
    );
    match stood {
        (Some(count), Some(expires_at)) if expires_at > now => Ok(Hit {
            count: count as u64,
            reset: left(expires_at, now),
            deadline: deadline_id(expires_at),
        }),
        // No counter, or a closed window: nothing stands.
        _ => Ok(Hit {
            count: 0,
            reset: raise.window.min(raise.within).as_duration(),
            deadline: None,
        }),
    }
}
