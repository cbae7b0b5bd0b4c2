//! The Redis connections a user builds, and the plumbing under them.
//!
//! Public here, for [`RedisBackend::new`](super::RedisBackend::new) and
//! its `connect` helpers: [`BackgroundConnection`] (a connection that comes
//! up in the background), [`SentinelConnection`] (feature
//! `sentinel`), the settings of the connections this crate makes
//! ([`connection_manager_config`], `cluster_client_builder` with feature
//! `cluster`), [`ConnectError`], and [`Nodes`], the connections
//! [`RedisBackend::audit`](super::RedisBackend::audit) can scan.
//!
//! Inside, each a module of its own and private to the backend: the
//! connection wrapper every command goes through (`guarded`), the circuit
//! breaker it passes (`breaker`, with its per-master slot map on a
//! Cluster, `slot_map`, and the Cluster watcher that reads the Cluster's
//! state while a breaker is open, `cluster_watch`), how a call's failure
//! is classified (`classify`), the `WAIT` a write goes
//! with in the replica-acknowledged mode (`acks`), Cluster hash slots
//! (`slot`), and a Cluster node's connection with bounded probes
//! ([`ClusterNode`], `node`).

/// `ConnectionLike` for a connection that forwards each command to another,
/// written once for the wrappers of this module (the background
/// connection, the Sentinel connection; the guarded router of `guarded`,
/// whose writes may go with a `WAIT`, has its own).
///
/// `|this, send| forward` forwards one command or a pipeline's: `this` is
/// the wrapper, and `send!(connection)` sends the command on `connection`,
/// giving the connection's future. `|this| db` answers `get_db`.
macro_rules! forward_commands {
    (
        impl$(<$($generic:ident),*>)? for $wrapper:ty $(where [$($bound:tt)*])?;
        |$this:ident, $send:ident| $forward:expr;
        |$db_this:ident| $db:expr $(;)?
    ) => {
        impl$(<$($generic),*>)? ::redis::aio::ConnectionLike for $wrapper $(where $($bound)*)? {
            fn req_packed_command<'a>(
                &'a mut self,
                cmd: &'a ::redis::Cmd,
            ) -> ::redis::RedisFuture<'a, ::redis::Value> {
                let $this = self;
                macro_rules! $send {
                    ($connection:expr) => {
                        $connection.req_packed_command(cmd)
                    };
                }
                $forward
            }

            fn req_packed_commands<'a>(
                &'a mut self,
                pipeline: &'a ::redis::Pipeline,
                offset: usize,
                count: usize,
            ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
                let $this = self;
                macro_rules! $send {
                    ($connection:expr) => {
                        $connection.req_packed_commands(pipeline, offset, count)
                    };
                }
                $forward
            }

            fn get_db(&self) -> i64 {
                let $db_this = self;
                $db
            }
        }
    };
}

pub(super) mod acks;
pub(super) mod breaker;
pub(super) mod classify;
pub(super) mod cluster_watch;
pub(super) mod connect;
pub(super) mod guarded;
#[cfg(feature = "cluster")]
pub(super) mod node;
pub(super) mod nodes;
#[cfg(feature = "sentinel")]
pub(super) mod sentinel;
pub(super) mod slot;
pub(super) mod slot_map;

pub use connect::{BackgroundConnection, ConnectError, connection_manager_config};
#[cfg(feature = "cluster")]
pub use connect::{cluster_client_builder, connect_cluster_client};
#[cfg(feature = "cluster")]
pub use node::{ClusterNode, NODE_WAIT};
pub use nodes::{Node, Nodes};
#[cfg(feature = "sentinel")]
pub use sentinel::{
    DEFAULT_LOOKUP_INTERVAL, DEFAULT_STALL_AFTER, SentinelConnection, SentinelConnectionBuilder,
};
