//! The backstop: rows that no hit may count, found and (on request) given a
//! window.

use std::time::SystemTime;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::row::{WINDOW_BOUND_MS, describe};
use crate::backend::BackendError;
use crate::quota::Window;

/// The most corrupt rows one audit lists.
const MAX_LISTED: i64 = 10_000;

/// A row the hit statement would not count, as the audit found it.
///
/// Example: [`PostgresBackend::audit`](super::PostgresBackend::audit).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CorruptRow {
    /// The layer (or quota) name.
    pub namespace: String,
    /// The client's key.
    pub key: Vec<u8>,
    /// The count, if any (`NULL` is `None`).
    pub count: Option<i64>,
    /// The deadline, if any (`NULL` is `None`; `infinity` is a time past
    /// the bound).
    pub expires_at: Option<SystemTime>,
    /// Whether this audit gave it a window: only a row with a usable count
    /// and no usable deadline, and only when asked.
    pub repaired: bool,
}

/// What [`PostgresBackend::audit`](super::PostgresBackend::audit) found;
/// its example is there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditReport {
    /// Rows in the table.
    pub rows: u64,
    /// Of those, rows whose window has closed, waiting for the cleaner.
    pub expired: u64,
    /// Rows that no hit may count: a negative or `NULL` count, a count that
    /// cannot grow, no deadline, or one that is infinite or further away than
    /// [`Window::MAX`]. At most 10,000 are listed.
    pub corrupt: Vec<CorruptRow>,
}

impl AuditReport {
    /// Whether the table holds nothing that needs a look.
    ///
    /// Example: [`PostgresBackend::audit`](super::PostgresBackend::audit).
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty()
    }
}

/// Scan `db`'s table, and repair what `repair` says: see
/// [`PostgresBackend::audit`](super::PostgresBackend::audit).
pub(super) async fn run(db: &Db, repair: Option<Window>) -> Result<AuditReport, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let sql = &db.sql;
    let stats = client
        .query_one(sql.stats.as_str(), &[])
        .await
        .map_err(pg_error)?;
    let mut report = AuditReport {
        rows: stats.get::<_, i64>(0).max(0) as u64,
        expired: stats.get::<_, i64>(1).max(0) as u64,
        corrupt: Vec::new(),
    };
    let rows = client
        .query(sql.audit.as_str(), &[&WINDOW_BOUND_MS, &MAX_LISTED])
        .await
        .map_err(pg_error)?;
    for row in rows {
        let mut found = CorruptRow {
            namespace: row.get(0),
            key: row.get(1),
            count: row.get(2),
            expires_at: row.try_get(3).ok().flatten(),
            repaired: false,
        };
        tracing::warn!(
            counter = %describe(&sql.table, &found.namespace, &found.key),
            count = ?found.count,
            expires_at = ?found.expires_at,
            "rate-limit audit: a row no hit may count"
        );
        if let Some(window) = repair {
            let millis = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
            if millis <= WINDOW_BOUND_MS {
                let updated = client
                    .execute(
                        sql.repair.as_str(),
                        &[&found.namespace, &found.key, &millis, &WINDOW_BOUND_MS],
                    )
                    .await
                    .map_err(pg_error)?;
                found.repaired = updated == 1;
            }
        }
        report.corrupt.push(found);
    }
    Ok(report)
}
