//! The backstop: rows that no hit may count, found and (on request) given a
//! window, and records of slots that no take may change, found.

use std::time::SystemTime;

use super::db::Db;
use super::error::{pg_error, pool_error};
use super::lease::describe_slots;
use super::row::{WINDOW_BOUND_MS, describe};
use tower_pinned_window::Window;
use tower_pinned_window::backend::{AuditReport, BackendError};

/// The most rows no hit may count (and records of slots no take may
/// change) that one audit lists.
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
    let listed = rows.len() as i64;
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
    // Records of slots: never repaired (a lifetime given to a record whose
    // leases are not read would keep or free slots at random).
    let records = client
        .query(sql.slots_audit.as_str(), &[&(MAX_LISTED - listed).max(0)])
        .await
        .map_err(pg_error)?;
    for record in records {
        let namespace: String = record.get(0);
        let key: Vec<u8> = record.get(1);
        let without_lifetime: bool = record.get(2);
        let name = describe_slots(db, &namespace, &key);
        tracing::warn!(
            slots = %name,
            "rate-limit audit: a record of slots no take may change"
        );
        if without_lifetime {
            report.without_lifetime.push(name.clone());
        }
        report.corrupt.push(name);
    }
    Ok(report)
}
