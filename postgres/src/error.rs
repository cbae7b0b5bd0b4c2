//! How PostgreSQL's and the pool's errors read as [`BackendError`]s.

use deadpool_postgres::PoolError;

use tower_pinned_window::backend::BackendError;

/// A statement's failure, as the backend reports it: a cancelled statement
/// (`statement_timeout`) is [`BackendError::TimedOut`].
pub(super) fn pg_error(err: tokio_postgres::Error) -> BackendError {
    if err.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
        BackendError::TimedOut
    } else {
        BackendError::Unavailable(Box::new(err))
    }
}

/// A pool's failure, as the backend reports it: no connection in time is
/// [`BackendError::TimedOut`].
pub(super) fn pool_error(err: PoolError) -> BackendError {
    match err {
        PoolError::Timeout(_) => BackendError::TimedOut,
        PoolError::Backend(err) => pg_error(err),
        other => BackendError::Unavailable(Box::new(other)),
    }
}
