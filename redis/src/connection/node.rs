//! One node of a Redis Cluster, as the crate's Cluster client holds it: a
//! multiplexed connection whose probes (`PING`, `CLUSTER SLOTS`, `INFO`...)
//! are given up after [`NODE_WAIT`], and the nudge that makes the client
//! read the slot map again once a silent master's slots have a new owner.
//!
//! The `redis` client reads the slot map and repairs connections while it
//! holds the lock every command of the connection waits on, asking one node
//! after another, with no timeout of its own. A master that stops answering
//! with its sockets open (a paused VM, a host that drops packets, `SIGSTOP`)
//! would hold that lock, and every request of the instance, until it woke.
//! Bounding the probes alone keeps that wait short; a response timeout on
//! every command would also bound the script calls, and the client sends a
//! timed-out command again: a hit counted twice.

use std::any::Any;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster_async::{ClusterConnection, Connect};
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{Arg, AsyncConnectionConfig, Cmd, IntoConnectionInfo, RedisFuture, Value};

use super::slot::key_slot;

/// How long the crate's Cluster client waits on one node for a probe
/// (`PING`, `CLUSTER ...`, `INFO`, `CONFIG`, `ROLE`) before it gives the
/// node up and asks the next; a new connection to a node (TCP, TLS, the
/// handshake) may take twice as long. Well below a layer timeout of
/// 100 ms, so that a slot-map read that asks a silent node first (once for
/// the map, once for its health, once for a new connection: about 40 ms)
/// leaves healthy masters' hits in time, and far above what a live node in
/// the same region takes to answer one.
pub const NODE_WAIT: Duration = Duration::from_millis(10);

/// A connection to one node of a Cluster, for the crate's Cluster client
/// (`ClusterConnection<ClusterNode>`, what
/// [`RedisBackend::connect_cluster`](crate::RedisBackend::connect_cluster)
/// makes): a [`MultiplexedConnection`] whose probes are given up after
/// [`NODE_WAIT`]. Script calls are never timed here (the layer's timeout
/// bounds them, and a timed-out call is never sent again).
#[derive(Clone)]
pub struct ClusterNode(MultiplexedConnection);

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode").finish_non_exhaustive()
    }
}

/// Whether `cmd` is a probe: a read about the node or the Cluster that is
/// safe to give up and ask again.
fn is_probe(cmd: &Cmd) -> bool {
    let Some(Arg::Simple(name)) = cmd.args_iter().next() else {
        return false;
    };
    [
        &b"PING"[..],
        b"CLUSTER",
        b"INFO",
        b"CONFIG",
        b"ROLE",
        b"ECHO",
    ]
    .iter()
    .any(|probe| name.eq_ignore_ascii_case(probe))
}

fn node_silent() -> ::redis::RedisError {
    ::redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the Cluster node did not answer a probe in time",
    ))
}

impl ConnectionLike for ClusterNode {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !is_probe(cmd) {
            return self.0.req_packed_command(cmd);
        }
        let call = self.0.req_packed_command(cmd);
        Box::pin(async move {
            tokio::time::timeout(NODE_WAIT, call)
                .await
                .unwrap_or_else(|_| Err(node_silent()))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

impl Connect for ClusterNode {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        let config = config.set_connection_timeout(Some(NODE_WAIT * 2));
        Box::pin(async move {
            let connection = MultiplexedConnection::connect_with_config(info, config).await?;
            Ok(Self(connection))
        })
    }
}

/// A key of `slot`: `{n}` for the first `n` that hashes there (at most a
/// few tens of thousands of checksums, only in a failover).
fn key_in(slot: u16) -> Option<Vec<u8>> {
    (0u32..1 << 20)
        .map(|n| format!("{{{n}}}").into_bytes())
        .find(|key| key_slot(key) == slot)
}

/// Make a Cluster client read its slot map again: ask `via` (`host:port`,
/// a node that does not serve `slot`) whether a key of `slot` exists. The
/// node answers `MOVED` to the slot's owner, and the client follows it and
/// reads the map again. Nothing when `connection` is not one of the
/// `redis` crate's Cluster clients.
///
/// Gives whether it is done: the client now routes `slot` to a master that
/// answers. The same question, routed by the client's own map once it has
/// read it again, must be answered within `NODE_WAIT * 5`. `via` may not
/// know of the promotion yet and send the client to the silent master, or
/// the client may read its map again from a node that does not know yet:
/// either way its map still points at the silent master, the check goes
/// unanswered, and the caller nudges again (`true` when there is nothing
/// to nudge).
pub(crate) async fn nudge<C: Any>(connection: &mut C, slot: u16, via: &str) -> bool {
    let Some((host, port)) = via.rsplit_once(':') else {
        return false;
    };
    let Ok(port) = port.parse::<u16>() else {
        return false;
    };
    let Some(key) = key_in(slot) else {
        return false;
    };
    let by_address = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    });
    let by_slot = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot,
        SlotAddr::Master,
    )));
    let cmd = ::redis::cmd("EXISTS").arg(key).to_owned();
    let any: &mut dyn Any = connection;
    let (nudged, routed) =
        if let Some(cluster) = any.downcast_mut::<ClusterConnection<ClusterNode>>() {
            let nudged = ask(cluster.route_command(cmd.clone(), by_address)).await;
            (
                nudged,
                nudged && ask(cluster.route_command(cmd, by_slot)).await,
            )
        } else if let Some(cluster) = any.downcast_mut::<ClusterConnection>() {
            let nudged = ask(cluster.route_command(cmd.clone(), by_address)).await;
            (
                nudged,
                nudged && ask(cluster.route_command(cmd, by_slot)).await,
            )
        } else {
            return true;
        };
    tracing::debug!(
        nudged,
        routed,
        slot,
        via,
        "nudged the Cluster client to read its slot map"
    );
    routed
}

/// Whether `question` was answered within `NODE_WAIT * 5`.
async fn ask(question: impl Future<Output = ::redis::RedisResult<Value>>) -> bool {
    matches!(
        tokio::time::timeout(NODE_WAIT * 5, question).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_told_from_script_calls() {
        assert!(is_probe(&::redis::cmd("PING")));
        assert!(is_probe(::redis::cmd("cluster").arg("SLOTS")));
        assert!(is_probe(::redis::cmd("CONFIG").arg("GET").arg("x")));
        assert!(!is_probe(
            ::redis::cmd("EVALSHA").arg("abc").arg(1).arg("k")
        ));
        assert!(!is_probe(::redis::cmd("EVAL").arg("return 1").arg(0)));
        assert!(!is_probe(&::redis::Cmd::new()));
    }

    #[test]
    fn a_key_is_found_for_every_slot_probed() {
        for slot in [0, 1, 5460, 5461, 10922, 16383] {
            let key = key_in(slot).expect("a key");
            assert_eq!(key_slot(&key), slot);
        }
    }
}
