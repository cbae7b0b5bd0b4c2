//! The backstop: find (and on request repair) limiter keys without a
//! lifetime, on one server or on every master of a Cluster.

use std::future::Future;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Cmd, Value};

use super::{RedisBackend, unavailable};
use crate::backend::BackendError;
use crate::quota::Window;

/// Attaches a window to a counter that has no lifetime; touches nothing
/// else, and never a corrupt key (whose lifetime would make it vanish).
const REPAIR_SCRIPT: &str = include_str!("repair.lua");

/// What [`RedisBackend::audit`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditReport {
    /// Nodes scanned: 1 for a standalone server, every master of a Cluster.
    pub nodes: usize,
    /// Keys under the prefix that were scanned.
    pub scanned: u64,
    /// Keys under the prefix that had no lifetime when they were scanned.
    pub without_lifetime: Vec<Vec<u8>>,
    /// Of those, how many were given a lifetime by this audit.
    pub repaired: u64,
    /// Of those, the ones that are not counters (another type, or not a
    /// non-negative integer): never repaired, since a lifetime would make
    /// corrupt state vanish; inspect them.
    pub corrupt: Vec<Vec<u8>>,
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static + Nodes,
{
    /// The backstop: scan every key under the prefix (on every master of a
    /// Cluster) and report those with no lifetime, which only code that sets
    /// a lifetime in a second call (or older versions of a limiter) leaves
    /// behind. With `repair`, each such counter is given that window,
    /// atomically and only if it still has no lifetime; its count is left as
    /// it is. Keys that are not counters are reported in
    /// [`AuditReport::corrupt`] and never touched.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when a node cannot be scanned.
    pub async fn audit(&self, repair: Option<Window>) -> Result<AuditReport, BackendError> {
        let mut connection = self.inner.connection.inner.clone();
        let nodes = connection.nodes().await.map_err(unavailable)?;
        let pattern = glob_escape(&self.inner.prefix);
        let mut report = AuditReport {
            nodes: nodes.len(),
            ..AuditReport::default()
        };
        for node in &nodes {
            let mut cursor = 0u64;
            loop {
                let mut scan = ::redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply = connection.on_node(node, scan).await.map_err(unavailable)?;
                let (next, keys): (u64, Vec<Vec<u8>>) =
                    ::redis::from_redis_value(reply).map_err(malformed)?;
                for key in keys {
                    report.scanned += 1;
                    let mut pttl = ::redis::cmd("PTTL");
                    pttl.arg(&key);
                    let ttl: i64 = ::redis::from_redis_value(
                        connection.on_node(node, pttl).await.map_err(unavailable)?,
                    )
                    .map_err(malformed)?;
                    if ttl != -1 {
                        continue;
                    }
                    if let Some(window) = repair {
                        let mut eval = ::redis::cmd("EVAL");
                        eval.arg(REPAIR_SCRIPT)
                            .arg(1)
                            .arg(&key)
                            .arg(window.as_millis());
                        let set: i64 = ::redis::from_redis_value(
                            connection.on_node(node, eval).await.map_err(unavailable)?,
                        )
                        .map_err(malformed)?;
                        match set {
                            1 => report.repaired += 1,
                            -1 => report.corrupt.push(key.clone()),
                            _ => {}
                        }
                    }
                    report.without_lifetime.push(key);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(report)
    }
}

/// `prefix*`, with the prefix's glob characters escaped.
fn glob_escape(prefix: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + 1);
    for &byte in prefix {
        if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(byte);
    }
    pattern.push(b'*');
    pattern
}

/// The nodes of a deployment that hold keys, and how to send a command to
/// one of them: the one server of a standalone connection, or every master of
/// a Cluster connection. Implemented for the connections this crate supports.
pub trait Nodes: ConnectionLike {
    /// The nodes that hold keys.
    fn nodes(&mut self) -> impl Future<Output = ::redis::RedisResult<Vec<Node>>> + Send;
    /// Send `cmd` to `node`.
    fn on_node(
        &mut self,
        node: &Node,
        cmd: Cmd,
    ) -> impl Future<Output = ::redis::RedisResult<Value>> + Send;
}

/// A node found by [`Nodes::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Node {
    /// The server a standalone connection talks to.
    This,
    /// A Cluster master.
    Master {
        /// Its host, as the Cluster announces it.
        host: String,
        /// Its port.
        port: u16,
    },
}

macro_rules! standalone_nodes {
    ($($connection:ty),*) => {$(
        impl Nodes for $connection {
            async fn nodes(&mut self) -> ::redis::RedisResult<Vec<Node>> {
                Ok(vec![Node::This])
            }

            async fn on_node(&mut self, _node: &Node, cmd: Cmd) -> ::redis::RedisResult<Value> {
                cmd.query_async(self).await
            }
        }
    )*};
}

standalone_nodes!(ConnectionManager, ::redis::aio::MultiplexedConnection);

#[cfg(feature = "redis-cluster")]
impl Nodes for ::redis::cluster_async::ClusterConnection {
    async fn nodes(&mut self) -> ::redis::RedisResult<Vec<Node>> {
        use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let slots = self
            .route_command(
                ::redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        // Each entry: [start, end, [host, port, id, ...], replicas...].
        let entries: Vec<Vec<Value>> = ::redis::from_redis_value(slots)?;
        let mut masters = Vec::new();
        for entry in entries {
            if let Some(master) = entry.get(2) {
                let fields: Vec<Value> = ::redis::from_redis_value(master.clone())?;
                if let [host, port, ..] = fields.as_slice() {
                    let node = Node::Master {
                        host: ::redis::from_redis_value(host.clone())?,
                        port: ::redis::from_redis_value(port.clone())?,
                    };
                    if !masters.contains(&node) {
                        masters.push(node);
                    }
                }
            }
        }
        Ok(masters)
    }

    async fn on_node(&mut self, node: &Node, cmd: Cmd) -> ::redis::RedisResult<Value> {
        use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let routing = match node {
            Node::Master { host, port } => SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            },
            Node::This => SingleNodeRoutingInfo::Random,
        };
        self.route_command(cmd, RoutingInfo::SingleNode(routing))
            .await
    }
}

fn malformed(err: ::redis::ParsingError) -> BackendError {
    BackendError::Unavailable(Box::new(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_patterns_escape_globs() {
        assert_eq!(glob_escape(b"tpw:"), b"tpw:*");
        assert_eq!(glob_escape(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\*");
    }
}
