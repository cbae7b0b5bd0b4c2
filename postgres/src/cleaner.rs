//! The task that deletes expired rows, owned by the backend: it holds only a
//! weak reference to it, and is aborted when the last clone is dropped.

use std::num::NonZeroU32;
use std::sync::Weak;
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;

use super::db::Db;

/// Full batches run back to back in one round, at most this many; then the
/// cleaner waits for its next tick, so that a flood it cannot keep up with
/// does not hold a connection for ever.
const MAX_BATCHES_PER_ROUND: u32 = 100;

/// One statement may take this long before the round is given up.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Aborts the cleaner when dropped (with the backend's last clone).
#[derive(Debug)]
pub(super) struct Handle(AbortHandle);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Start the cleaner on the current Tokio runtime.
pub(super) fn spawn(db: Weak<Db>, every: Duration, batch: NonZeroU32) -> Handle {
    Handle(tokio::spawn(run(db, every, batch)).abort_handle())
}

async fn run(weak: Weak<Db>, every: Duration, batch: NonZeroU32) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate
    let mut failing = false;
    loop {
        ticks.tick().await;
        let Some(db) = weak.upgrade() else {
            return;
        };
        let mut deleted = 0u64;
        for _ in 0..MAX_BATCHES_PER_ROUND {
            match tokio::time::timeout(STATEMENT_TIMEOUT, db.clean_expired(batch)).await {
                Ok(Ok(n)) => {
                    deleted += n;
                    if failing {
                        tracing::info!(table = %db.sql.table, "rate-limit cleaner: working again");
                        failing = false;
                    }
                    if n < u64::from(batch.get()) {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                Ok(Err(err)) => {
                    if !failing {
                        tracing::warn!(table = %db.sql.table, error = %err, "rate-limit cleaner: could not delete expired rows (will retry)");
                        failing = true;
                    }
                    break;
                }
                Err(_) => {
                    if !failing {
                        tracing::warn!(table = %db.sql.table, "rate-limit cleaner: a batch took over {STATEMENT_TIMEOUT:?} (will retry)");
                        failing = true;
                    }
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::debug!(table = %db.sql.table, deleted, "rate-limit cleaner: expired rows deleted");
        }
    }
}
