//! The connections this crate makes, for
//! [`RedisBackend::connect`](crate::backend::redis::RedisBackend::connect),
//! [`RedisBackend::connect_in_background`](crate::backend::redis::RedisBackend::connect_in_background)
//! and, with `redis-cluster`, `RedisBackend::connect_cluster`.
//!
//! Each has the `redis` client's own response timeout turned off: the layer
//! already times every backend call (its
//! [`timeout`](crate::RateLimitLayer::timeout)), so a hit arms one timer,
//! not two.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, RedisError};

use super::breaker::unavailable;
use crate::backend::BackendError;
use crate::error::ConfigError;

/// Why a connection could not be made.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower_pinned_window::backend::redis::RedisBackend;
/// use tower_pinned_window::backend::redis::connection::ConnectError;
///
/// // Not a Redis URL: retrying would not help.
/// let err = RedisBackend::connect("http://example.com").await.unwrap_err();
/// assert!(matches!(err, ConnectError::Config(_)));
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL (or another setting) is wrong: retrying will not help.
    Config(ConfigError),
    /// The store could not be reached.
    Unavailable(BackendError),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(err) => err.fmt(f),
            Self::Unavailable(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(err) => Some(err),
            Self::Unavailable(err) => Some(err),
        }
    }
}

impl From<ConfigError> for ConnectError {
    fn from(err: ConfigError) -> Self {
        Self::Config(err)
    }
}

/// The client for `url`, or the configuration error that says why not.
fn client(url: &str) -> Result<Client, ConfigError> {
    Client::open(url).map_err(invalid_url)
}

/// A bad URL, described without the URL itself (it may hold a password).
fn invalid_url(err: RedisError) -> ConfigError {
    ConfigError::InvalidUrl(err.to_string())
}

/// The settings of the [`ConnectionManager`]s this crate makes: no response
/// timeout of the client's own (the layer's is the one timer of a hit), and
/// reconnection attempts at most 250 ms apart, so that requests are served
/// again soon after Redis is back.
///
/// # Examples
///
/// A connection of your own, with the same settings:
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_pinned_window::backend::redis::RedisBackend;
/// use tower_pinned_window::backend::redis::connection::connection_manager_config;
/// use tower_pinned_window::redis::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let connection = client
///     .get_connection_manager_with_config(connection_manager_config())
///     .await?;
/// let backend = RedisBackend::new(connection);
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
pub fn connection_manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(None)
        .set_max_delay(Duration::from_millis(250))
}

/// A [`ConnectionManager`] on the Redis at `url`, with
/// [`connection_manager_config`], once its first connection is up.
pub(crate) async fn connection_manager(url: &str) -> Result<ConnectionManager, ConnectError> {
    client(url)?
        .get_connection_manager_with_config(connection_manager_config())
        .await
        .map_err(|err| ConnectError::Unavailable(unavailable(err)))
}

/// A connection that is made in the background: see
/// [`RedisBackend::connect_in_background`](crate::backend::redis::RedisBackend::connect_in_background).
///
/// # Examples
///
/// ```
/// use tower_pinned_window::backend::redis::RedisBackend;
///
/// // Outside a runtime, the attempts start with the first command.
/// let backend = RedisBackend::connect_in_background("redis://127.0.0.1:6379/")?;
/// assert!(!backend.connection().is_connected());
/// assert!(backend.connection().connection().is_none());
/// # Ok::<(), tower_pinned_window::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct BackgroundConnection {
    shared: Arc<Shared>,
}

struct Shared {
    db: i64,
    connection: OnceLock<ConnectionManager>,
    /// The client, until the attempts have started.
    start: Mutex<Option<Client>>,
}

impl fmt::Debug for BackgroundConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackgroundConnection")
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl BackgroundConnection {
    /// A connection to the Redis at `url`, made in the background.
    pub(crate) fn to(url: &str) -> Result<Self, ConfigError> {
        Ok(Self::new(client(url)?))
    }

    fn new(client: Client) -> Self {
        let this = Self {
            shared: Arc::new(Shared {
                db: client.get_connection_info().redis_settings().db(),
                connection: OnceLock::new(),
                start: Mutex::new(Some(client)),
            }),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            this.start();
        }
        this
    }

    /// Whether the first connection is up. Example: [`BackgroundConnection`].
    pub fn is_connected(&self) -> bool {
        self.shared.connection.get().is_some()
    }

    /// The connection, once it is up. Example: [`BackgroundConnection`].
    pub fn connection(&self) -> Option<&ConnectionManager> {
        self.shared.connection.get()
    }

    fn start(&self) {
        let Some(client) = self
            .shared
            .start
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        tokio::spawn(connect_loop(client, Arc::downgrade(&self.shared)));
    }

    fn not_connected() -> RedisError {
        RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "not connected to Redis yet (connecting in the background)",
        ))
    }
}

async fn connect_loop(client: Client, shared: Weak<Shared>) {
    let mut warned = false;
    loop {
        if shared.strong_count() == 0 {
            return;
        }
        let attempt = ConnectionManager::new_with_config(
            client.clone(),
            connection_manager_config().set_number_of_retries(0),
        )
        .await;
        match attempt {
            Ok(connection) => {
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let _ = shared.connection.set(connection);
                tracing::info!("connected to Redis");
                return;
            }
            Err(err) if !warned => {
                warned = true;
                tracing::warn!(error = %err, "Redis unreachable: connecting in the background; requests follow the failure policy meanwhile");
            }
            Err(err) => tracing::debug!(error = %err, "Redis still unreachable"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

forward_commands! {
    impl for BackgroundConnection;
    |this, send| match this.shared.connection.get() {
        Some(connection) => {
            let mut connection = connection.clone();
            Box::pin(async move { send!(connection).await })
        }
        None => {
            this.start();
            Box::pin(std::future::ready(Err(Self::not_connected())))
        }
    };
    |this| this.shared.db
}

#[cfg(feature = "redis-cluster")]
/// The settings of the Cluster clients this crate makes, for `nodes`
/// (`redis://host:port/`, any of the Cluster's nodes): no response
/// timeout of the client's own (the layer's is the one timer of a hit),
/// and few, short retries, so that a Cluster's refusal reaches the caller
/// within the layer's default 100 ms timeout, as
/// [`BackendError::ClusterDown`](crate::backend::BackendError::ClusterDown).
///
/// The client retries a command on its own: it follows a `MOVED` or an
/// `ASK` at once, refreshes its slot map and sends again after `READONLY`
/// or a dropped connection, and sleeps before it sends again after
/// `CLUSTERDOWN`, `TRYAGAIN` or `MASTERDOWN` (or a node it cannot reach).
/// All of these draw on one count per command. Its defaults (16 retries,
/// sleeps from 1.28 s) outlast any sensible layer timeout, so a refusal
/// never reached the caller: the layer gave the hit up as a timeout, and
/// the breaker counted it as the master's failure. Here:
///
/// - **3 retries** (`retries`): enough for the one or two follows a
///   resharding or a failover needs (a `MOVED`, an `ASK` then a `TRYAGAIN`
///   while the slot's keys move, a `READONLY` from a demoted master, a
///   dropped connection to a dead one), with one to spare;
/// - **each sleep 2 to 10 ms**, picked at random (`min_retry_wait(2)`,
///   `max_retry_wait(10)`, and `retry_wait_formula(10, 1)`: a flat 10 ms
///   ceiling, not one that doubles with each retry): long enough for a
///   `TRYAGAIN` to see the migration of a batch of keys end (a `MIGRATE`
///   takes about a millisecond) or a slot map to be read again, short
///   enough that three of them (6 to 30 ms, plus four round trips) end well
///   within the layer's default 100 ms, with room for a busy host. The
///   count of tries is what loads a refusing node (four a hit), not the
///   sleeps, so shorter sleeps cost it nothing; the random part keeps
///   instances from retrying in step.
///
/// A `CLUSTERDOWN` lasts until the failed master's replica is promoted
/// (seconds): no retries within a timeout outlast it, so the hit is given
/// up with the Cluster's own answer instead. A follow (`MOVED`, `ASK`)
/// does not sleep, so a hit that a resharding or a failover redirects is
/// not slowed by these. Fewer retries also send a command again less often
/// after a dropped connection, where a script may have run already.
///
/// # Examples
///
/// A Cluster connection of your own, with the same settings:
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_pinned_window::backend::redis::RedisBackend;
/// use tower_pinned_window::backend::redis::connection::cluster_client_builder;
///
/// use tower_pinned_window::backend::redis::connection::connect_cluster_client;
///
/// let client = cluster_client_builder(["redis://127.0.0.1:7000/"]).build()?;
/// let backend = RedisBackend::new(connect_cluster_client(&client).await?);
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
pub fn cluster_client_builder<I, T>(nodes: I) -> ::redis::cluster::ClusterClientBuilder
where
    I: IntoIterator<Item = T>,
    T: ::redis::IntoConnectionInfo,
{
    ::redis::cluster::ClusterClient::builder(nodes)
        .overall_response_timeout(None)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
        .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
        .retry_wait_formula(CLUSTER_RETRY_WAIT_MS.1, 1)
}

#[cfg(feature = "redis-cluster")]
/// How many times the Cluster client sends a command again (see
/// [`cluster_client_builder`]).
const CLUSTER_RETRIES: u32 = 3;

#[cfg(feature = "redis-cluster")]
/// The shortest and the longest sleep (ms) before the Cluster client sends
/// a refused command again (see [`cluster_client_builder`]).
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (2, 10);

// A refused command's sleeps take at most half the layer's default timeout:
// the other half is for its round trips and a busy host.
#[cfg(feature = "redis-cluster")]
const _: () = assert!(
    CLUSTER_RETRIES as u64 * CLUSTER_RETRY_WAIT_MS.1 * 2
        <= crate::timeout::DEFAULT_TIMEOUT.as_millis() as u64
);

#[cfg(feature = "redis-cluster")]
/// How long [`warn_full_coverage`] waits for `CONFIG GET`.
const COVERAGE_READ: Duration = Duration::from_millis(250);

#[cfg(feature = "redis-cluster")]
/// Read `cluster-require-full-coverage` on a Cluster connection just made
/// (one node's, at random), and warn once when it is `yes`: what it costs
/// in a failover, and where the docs say so. Best effort: a `CONFIG` that
/// is refused (ACL) or renamed, a reply that takes longer than
/// [`COVERAGE_READ`], or any other error is logged at debug level only.
async fn warn_full_coverage<C: ::redis::aio::ConnectionLike>(connection: &mut C) {
    let read = tokio::time::timeout(
        COVERAGE_READ,
        ::redis::cmd("CONFIG")
            .arg("GET")
            .arg("cluster-require-full-coverage")
            .query_async::<std::collections::HashMap<String, String>>(connection),
    )
    .await;
    match read {
        Ok(Ok(config)) => match config.get("cluster-require-full-coverage") {
            Some(value) if value.eq_ignore_ascii_case("yes") => tracing::warn!(
                "redis cluster has cluster-require-full-coverage yes: in a failover, every master refuses every key (CLUSTERDOWN) from the failed master's FAIL until its replica's promotion, so hits on healthy masters' keys fail too; `no` keeps them served (docs/redis.md, Cluster failover)"
            ),
            Some(_) => {}
            None => tracing::debug!(
                "CONFIG GET cluster-require-full-coverage: no such setting; not checked"
            ),
        },
        Ok(Err(err)) => tracing::debug!(
            error = %err,
            "CONFIG GET cluster-require-full-coverage failed (refused or renamed?); not checked"
        ),
        Err(_) => tracing::debug!(
            timeout = ?COVERAGE_READ,
            "CONFIG GET cluster-require-full-coverage not answered in time; not checked"
        ),
    }
}

#[cfg(feature = "redis-cluster")]
/// A connection to the Redis Cluster that `nodes` belong to, with
/// [`cluster_client_builder`]'s settings, once the slot map is known.
pub(crate) async fn cluster_connection<I, T>(
    nodes: I,
) -> Result<::redis::cluster_async::ClusterConnection<super::ClusterNode>, ConnectError>
where
    I: IntoIterator<Item = T>,
    T: ::redis::IntoConnectionInfo,
{
    let client = cluster_client_builder(nodes)
        .build()
        .map_err(|err| ConnectError::Config(invalid_url(err)))?;
    connect_cluster_client(&client).await
}

#[cfg(feature = "redis-cluster")]
/// A connection through `client` whose nodes are [`ClusterNode`](super::ClusterNode)s
/// (probes given up after [`NODE_WAIT`](super::NODE_WAIT), so that a silent
/// node holds no request of other nodes), once the slot map is known: what
/// [`RedisBackend::connect_cluster`](crate::backend::redis::RedisBackend::connect_cluster)
/// makes, for a client with settings of your own (TLS, a password). The
/// `redis` crate's own `get_async_connection` gives a Cluster connection
/// whose slot-map reads wait on a silent node for as long as it is silent.
/// Like `connect_cluster`, it warns once when the Cluster runs with
/// `cluster-require-full-coverage yes`.
///
/// # Errors
/// [`ConnectError::Unavailable`] when no node answers.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_pinned_window::backend::redis::RedisBackend;
/// use tower_pinned_window::backend::redis::connection::{
///     cluster_client_builder, connect_cluster_client,
/// };
///
/// let client = cluster_client_builder(["rediss://10.0.0.1:7000/"]).build()?;
/// let backend = RedisBackend::new(connect_cluster_client(&client).await?);
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
pub async fn connect_cluster_client(
    client: &::redis::cluster::ClusterClient,
) -> Result<::redis::cluster_async::ClusterConnection<super::ClusterNode>, ConnectError> {
    let mut connection = client
        .get_async_generic_connection::<super::ClusterNode>()
        .await
        .map_err(|err| ConnectError::Unavailable(unavailable(err)))?;
    warn_full_coverage(&mut connection).await;
    Ok(connection)
}
