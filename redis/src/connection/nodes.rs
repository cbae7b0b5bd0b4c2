//! The nodes of a deployment that hold keys, and how to send a command to
//! one of them: what the audit scans.

use std::future::Future;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Cmd, Value};

/// The nodes of a deployment that hold keys, and how to send a command to
/// one of them: the one server of a standalone connection, or every master of
/// a Cluster connection. Implemented for the connections this crate supports.
///
/// [`RedisBackend::audit`](crate::RedisBackend::audit) scans
/// them, and has an example.
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

/// A node found by [`Nodes::nodes`]; see [`Nodes`] for an example.
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

#[cfg(feature = "cluster")]
impl<C> Nodes for ::redis::cluster_async::ClusterConnection<C>
where
    C: ConnectionLike + ::redis::cluster_async::Connect + Clone + Send + Sync + Unpin + 'static,
{
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
