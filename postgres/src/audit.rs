//! The backstop: rows that no hit may count, found and (on request) given a
//! window.

use std::time::SystemTime;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::row::{WINDOW_BOUND_MS, describe};
use tower_pinned_window::Window;
use tower_pinned_window::backend::{AuditReport, BackendError};

/// The most rows no hit may count that one audit lists.
const MAX_LISTED: i64 = 10_000;

/// Scan `db`'s table, and repair what `repair` says: see
/// [`PostgresBackend::audit`](super::PostgresBackend::audit).
pub(super) async fn run(db: &Db, repair: Option<Window>) -> Result<AuditReport, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let sql = &db.sql;
    let stats = client
        .query_one(sql.stats.as_str(), &[])
        .await
        .map_err(pg_error)?;
    let mut report = AuditReport::default();
    report.nodes = 1;
    report.scanned = stats.get::<_, i64>(0).max(0) as u64;
    report.expired = stats.get::<_, i64>(1).max(0) as u64;
    // A window past the bound would be refused by the repair statement.
    let repair = repair
        .map(|window| i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
        .filter(|&millis| millis <= WINDOW_BOUND_MS);
    let rows = client
        .query(sql.audit.as_str(), &[&WINDOW_BOUND_MS, &MAX_LISTED])
        .await
        .map_err(pg_error)?;
    for row in rows {
        let namespace: String = row.get(0);
        let key: Vec<u8> = row.get(1);
        let corrupt: bool = row.get(4);
        let without_lifetime: bool = row.get(5);
        let name = describe(&sql.table, &namespace, &key);
        tracing::warn!(
            counter = %name,
            count = ?row.get::<_, Option<i64>>(2),
            // `infinity` cannot be read as a time: logged as `None`.
            expires_at = ?row.try_get::<_, Option<SystemTime>>(3).ok().flatten(),
            "rate-limit audit: a row no hit may count"
        );
        // Only a row with a usable count is given a window: a lifetime
        // would make a corrupt one vanish.
        if let (Some(millis), true, false) = (repair, without_lifetime, corrupt) {
            let updated = client
                .execute(
                    sql.repair.as_str(),
                    &[&namespace, &key, &millis, &WINDOW_BOUND_MS],
                )
                .await
                .map_err(pg_error)?;
            if updated == 1 {
                report.repaired.push(name.clone());
            }
        }
        if corrupt {
            report.corrupt.push(name.clone());
        }
        if without_lifetime {
            report.without_lifetime.push(name);
        }
    }
    Ok(report)
}
