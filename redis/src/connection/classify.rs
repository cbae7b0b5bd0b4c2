//! How a Redis call's failure is classified, for the breaker and for the
//! caller: an outage of the store ([`is_outage`], which counts against the
//! key's breaker), a Cluster's refusal ([`is_cluster_state`], which counts
//! neither way), a refusal of keys of several hash slots in one call
//! ([`is_cross_slot`]), what an open breaker answers ([`open_error`]), and
//! the [`BackendError`] each reaches the caller as ([`unavailable`]).

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

use tower_pinned_window::backend::BackendError;

/// The detail of the error an open breaker answers with.
const OPEN: &str = "tower-pinned-window: circuit open after repeated failures";

/// Whether `err` is what an open breaker answers.
pub(super) fn is_open(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Client && err.detail() == Some(OPEN)
}

/// A command's failure, as the backend reports it: what an open breaker
/// answers is [`BackendError::CircuitOpen`], and a Cluster's refusal
/// ([`is_cluster_state`]) is [`BackendError::ClusterDown`].
pub(crate) fn unavailable(err: RedisError) -> BackendError {
    if is_open(&err) {
        BackendError::CircuitOpen
    } else if is_cluster_state(&err) {
        BackendError::ClusterDown(Box::new(err))
    } else if err.is_timeout() {
        BackendError::TimedOut
    } else {
        BackendError::Unavailable(Box::new(err))
    }
}

pub(super) fn open_error() -> RedisError {
    RedisError::from((ErrorKind::Client, "circuit open", OPEN.to_owned()))
}

/// Whether `err` is a refusal of keys of several hash slots in one call
/// (`CROSSSLOT`): nothing ran, and the call may go again, by slot.
pub(crate) fn is_cross_slot(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot)
}

/// Whether `err` is a Cluster's refusal rather than a master's failure:
/// `CLUSTERDOWN` (with `cluster-require-full-coverage yes`, every master
/// answers it for every key while one slot is unserved), `TRYAGAIN` (a
/// multi-key call on a slot being migrated) and `MASTERDOWN` (a replica
/// cut off from its master, with `replica-serve-stale-data no`). Each is
/// answered at once by a live node about its Cluster's or its replication's
/// state, so it says nothing about the health of the master the key's
/// breaker stands for: counting it would hold a healthy master's breaker
/// shut after the Cluster is whole again. It reaches the caller as
/// [`BackendError::ClusterDown`].
///
/// A redirection (`MOVED`, `ASK`) is not one: the Cluster client follows
/// it, and one that reaches the caller is one it could not follow, to a
/// master that does not answer (in a failover, `MOVED <slot> <the dead
/// master>` until the replica is promoted), so it counts as that master's
/// failure ([`is_outage`]).
pub(super) fn is_cluster_state(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown
        )
    )
}

/// Whether `err` says the store is down or unreachable (rather than that a
/// command was wrong, or a script missing, which a healthy server answers,
/// or that the Cluster refuses: [`is_cluster_state`]). A redirection
/// (`MOVED`, `ASK`) or `READONLY` that reaches the caller is one the
/// Cluster client gave up following: the master it points to does not
/// answer. `LOADING` is the server's own state.
pub(super) fn is_outage(err: &RedisError) -> bool {
    match err.kind() {
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::BusyLoading
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::ReadOnly
        ),
        ErrorKind::Client | ErrorKind::UnexpectedReturnType | ErrorKind::InvalidClientConfig => {
            false
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outages_count() {
        assert!(is_outage(&RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_outage(&RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoScript),
            "no script"
        ))));
        assert!(is_open(&open_error()));
        assert!(!is_outage(&open_error()));
    }
}
