//! Limits held in the store ([`Limits`](tower_pinned_window::backend::Limits)):
//! a table beside the counters' (`{table}_limits`, made by the migration),
//! one row per layer and scope. A set is one statement (`sql/limit_set.sql`,
//! an upsert, or `sql/limit_remove.sql`), a read one `SELECT`
//! (`sql/limits.sql`) whose values go through `StoredLimits::insert_stored`:
//! a value that is not a limit is left out and counted. Counters are in
//! another table: a set never touches one.

use tokio_postgres::Row;

use super::db::Db;
use super::error::{pg_error, pool_error};
use tower_pinned_window::Quota;
use tower_pinned_window::backend::{BackendError, StoredLimits, encode_limit};

/// Write the limit of the scope `scope` (as `encode_scope` makes it) of
/// `layer` (`None`: remove it).
pub(super) async fn set(
    db: &Db,
    layer: &str,
    scope: &[u8],
    quota: Option<Quota>,
) -> Result<(), BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    match quota {
        Some(quota) => {
            let statement = client
                .prepare_cached(&db.sql.limit_set)
                .await
                .map_err(pg_error)?;
            client
                .execute(&statement, &[&layer, &scope, &encode_limit(quota)])
                .await
                .map_err(pg_error)?;
        }
        None => {
            let statement = client
                .prepare_cached(&db.sql.limit_remove)
                .await
                .map_err(pg_error)?;
            client
                .execute(&statement, &[&layer, &scope])
                .await
                .map_err(pg_error)?;
        }
    }
    Ok(())
}

/// Every limit of `layer`.
pub(super) async fn read(db: &Db, layer: &str) -> Result<StoredLimits, BackendError> {
    let client = db.pool.get().await.map_err(pool_error)?;
    let statement = client
        .prepare_cached(&db.sql.limits)
        .await
        .map_err(pg_error)?;
    let rows = client
        .query(&statement, &[&layer])
        .await
        .map_err(pg_error)?;
    let mut stored = StoredLimits::new();
    for row in &rows {
        insert(&mut stored, row);
    }
    Ok(stored)
}

/// One row into `stored`: a row whose columns cannot be read as a scope and
/// a value (a column changed by hand) is counted corrupt like any value
/// that is not a limit.
fn insert(stored: &mut StoredLimits, row: &Row) {
    match (row.try_get::<_, &[u8]>(0), row.try_get::<_, &str>(1)) {
        (Ok(scope), Ok(value)) => stored.insert_stored(scope, value.as_bytes()),
        // An empty value is never a limit: left out and counted.
        _ => stored.insert_stored(b"", b""),
    }
}
