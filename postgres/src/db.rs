//! The database a backend works on: its pool and the statements of its
//! table, shared by the backend, its hit senders, its cleaner and its audit.

use std::num::NonZeroU32;

use deadpool_postgres::Pool;
use tokio_postgres::SimpleQueryMessage;

use super::error::{pg_error, pool_error};
use super::table::Sql;
use tower_pinned_window::backend::BackendError;

/// A pool, and the statements of one table.
pub(super) struct Db {
    pub(super) pool: Pool,
    pub(super) sql: Sql,
}

impl Db {
    /// Delete at most `batch` expired counters, at most `batch` expired
    /// reset markers and at most `batch` records of slots past their last
    /// lease; the number of rows deleted, all counted.
    pub(super) async fn clean_expired(&self, batch: NonZeroU32) -> Result<u64, BackendError> {
        let client = self.pool.get().await.map_err(pool_error)?;
        let sql = self.sql.clean.replace("{batch}", &batch.to_string());
        let replies = client.simple_query(&sql).await.map_err(pg_error)?;
        // The SET counts no row; the three DELETEs do.
        Ok(replies
            .iter()
            .map(|reply| match reply {
                SimpleQueryMessage::CommandComplete(rows) => *rows,
                _ => 0,
            })
            .sum())
    }
}
