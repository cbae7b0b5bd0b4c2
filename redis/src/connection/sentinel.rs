//! Redis Sentinel: a connection that asks the sentinels where the master is,
//! and follows it through failovers by itself.
//!
//! The lookup itself is the `redis` crate's (`redis::sentinel`): the
//! sentinels are asked in the order given (`SENTINEL MASTERS`), a master
//! they flag as down is skipped, and the address is accepted only once the
//! server there answers `ROLE` as a master. This module keeps one
//! multiplexed connection to that master and decides when to look again.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind, Value,
};
use futures_util::future::{BoxFuture, FutureExt, Shared};

use super::nodes::{Node, Nodes};

/// The shortest time between two lookups of the master, unless configured
/// otherwise.
///
/// Example: [`SentinelConnectionBuilder`].
pub const DEFAULT_LOOKUP_INTERVAL: Duration = Duration::from_millis(100);

/// How long a command may go unanswered, before it is given up, for the
/// connection to suspect the master and ask the sentinels again (unless
/// configured otherwise).
///
/// Example: [`SentinelConnectionBuilder`].
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_millis(50);

/// The shortest time between two lookups that the connection makes by
/// itself, after one found no master, when the lookup interval is shorter.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// A connection to the master of a Redis Sentinel deployment that follows
/// failovers by itself. Clones share it (one multiplexed connection, one
/// lookup at a time), like a [`ConnectionManager`](::redis::aio::ConnectionManager).
///
/// ```no_run
/// use tower_pinned_window_redis::RedisBackend;
/// use tower_pinned_window_redis::connection::SentinelConnection;
///
/// # async fn run() -> redis::RedisResult<()> {
/// let sentinels = vec![
///     "redis://10.0.0.1:26379/",
///     "redis://10.0.0.2:26379/",
///     "redis://10.0.0.3:26379/",
/// ];
/// let connection = SentinelConnection::builder(sentinels, "mymaster")
///     .connect()
///     .await?;
/// let backend = RedisBackend::new(connection);
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
///
/// # Where commands go
///
/// Only to a server that the sentinels name as the master and that answered
/// `ROLE` as a master when the connection was made; never to a replica. If
/// that server is later demoted, its `READONLY` answer is taken as the sign:
/// nothing was written there, so the command is sent once more to the master
/// the sentinels name now.
///
/// # During a failover
///
/// - **The master dies or closes the connection** (a crash, `kill -9`, a
///   restart, or a sentinel's `CLIENT KILL` when it reconfigures the server):
///   the commands in flight fail with an I/O error, which the backend reports
///   as [`Unavailable`](tower_pinned_window::backend::BackendError::Unavailable), so those
///   requests follow the layer's failure policy. Such a command may or may
///   not have been counted: it is never sent again. The connection then asks
///   the sentinels for the master; commands wait for that lookup (within the
///   layer's timeout), and while no master can be found (the sentinels still
///   name the dead one, or flag it as down and have not promoted a replica
///   yet) they fail at once. The sentinels are asked again at most once per
///   [lookup interval](SentinelConnectionBuilder::lookup_interval): on a
///   command, and by the connection itself one interval after a lookup
///   that found no master, until one is found, so that it finds the
///   promoted replica even when no command reaches it (the backend's
///   circuit breaker is open). Requests are served again at most about an
///   interval (and the lookup's own time) after the sentinels have
///   promoted a replica; with the backend's breaker on, an open breaker
///   lets a probe through as soon as the connection has found a master.
/// - **The master stops answering without closing the connection** (a
///   frozen process, a host or network failure): a command that goes
///   unanswered for [`stall_after`](SentinelConnectionBuilder::stall_after)
///   before it is given up (the layer's timeout drops it) or that times out
///   makes the connection ask the sentinels in the background; the
///   connection moves only when they name another master.
/// - **The master is demoted but stays up**: `READONLY`, as above. A
///   replica's answer is proof that the master moved, so this lookup is
///   made at once, whenever the last one was.
///
/// What a failover can lose is Redis's, not the connection's: replication is
/// asynchronous, so hits the old master counted but had not yet sent to the
/// replica are not on the new master. See the README's Sentinel section.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    master_name: String,
    sentinel: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    lookup_interval: Duration,
    stall_after: Duration,
    state: Mutex<State>,
    /// How many times a master was connected to: the backend's breaker
    /// lets a probe through once it changes.
    found: Arc<AtomicU64>,
}

struct State {
    /// Bumped each time `master` is replaced; a failure is acted on only if
    /// it was met on the current generation.
    generation: u64,
    master: MasterFuture,
    last_lookup: Option<quanta::Instant>,
    /// A background check of the master's address is running.
    checking: bool,
}

/// The master being connected to, or connected: shared by every command
/// that waits for it.
type MasterFuture = Shared<BoxFuture<'static, RedisResult<Master>>>;

#[derive(Clone)]
struct Master {
    addr: ConnectionAddr,
    connection: MultiplexedConnection,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master_name", &self.inner.master_name)
            .field("master", &self.master().map(|addr| addr.to_string()))
            .finish_non_exhaustive()
    }
}

/// Builds a [`SentinelConnection`].
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_pinned_window_redis::RedisBackend;
/// use tower_pinned_window_redis::connection::{DEFAULT_STALL_AFTER, SentinelConnection};
///
/// let connection = SentinelConnection::builder(
///     vec!["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"],
///     "mymaster",
/// )
/// .lookup_interval(Duration::from_millis(200))
/// .stall_after(DEFAULT_STALL_AFTER)
/// .connect()
/// .await?;
/// let backend = RedisBackend::new(connection);
/// # let _ = backend;
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct SentinelConnectionBuilder {
    sentinels: RedisResult<Vec<ConnectionInfo>>,
    master_name: String,
    master: Option<SentinelNodeConnectionInfo>,
    config: AsyncConnectionConfig,
    lookup_interval: Duration,
    stall_after: Duration,
}

impl fmt::Debug for SentinelConnectionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConnectionBuilder")
            .field("master_name", &self.master_name)
            .field(
                "sentinels",
                &self.sentinels.as_ref().map(|s| {
                    s.iter()
                        .map(|info| info.addr().to_string())
                        .collect::<Vec<_>>()
                }),
            )
            .field("lookup_interval", &self.lookup_interval)
            .field("stall_after", &self.stall_after)
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// Ask the `sentinels` (`redis://host:26379/`, with the sentinels' own
    /// credentials if they need any) for the master they monitor under
    /// `master_name`, and connect to it.
    ///
    /// # Errors
    /// When an address is invalid, or no sentinel names a master that
    /// answers as one.
    ///
    /// Example: [`SentinelConnection`].
    pub async fn connect<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master_name: &str,
    ) -> RedisResult<Self> {
        Self::builder(sentinels, master_name).connect().await
    }

    /// Choose the master's credentials, database and TLS, the connection's
    /// timeouts, and how often the sentinels may be asked.
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub fn builder<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master_name: &str,
    ) -> SentinelConnectionBuilder {
        SentinelConnectionBuilder {
            sentinels: sentinels
                .into_iter()
                .map(IntoConnectionInfo::into_connection_info)
                .collect(),
            master_name: master_name.to_owned(),
            master: None,
            // The layer's timeout is a hit's one timer.
            config: AsyncConnectionConfig::new().set_response_timeout(None),
            lookup_interval: DEFAULT_LOOKUP_INTERVAL,
            stall_after: DEFAULT_STALL_AFTER,
        }
    }

    /// The address of the master this connection talks to, or `None` while
    /// it is looking for one.
    ///
    /// Example: [`SentinelConnection`].
    pub fn master(&self) -> Option<ConnectionAddr> {
        match self.inner.lock().master.peek() {
            Some(Ok(master)) => Some(master.addr.clone()),
            _ => None,
        }
    }

    /// How many times the connection has connected to a master, shared:
    /// the backend's breaker reads it.
    pub(crate) fn masters_found(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.inner.found)
    }

    fn current(&self) -> (u64, MasterFuture) {
        let state = self.inner.lock();
        (state.generation, state.master.clone())
    }

    /// Send with `send` on the master's connection, and act on what the
    /// answer says about the master.
    async fn run<T, F, Fut>(&self, send: F) -> RedisResult<T>
    where
        T: Reply,
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut sent_again = false;
        loop {
            let (generation, master) = self.current();
            let master = match master.await {
                Ok(master) => master,
                Err(err) => {
                    self.inner.replace(generation);
                    return Err(err);
                }
            };
            let watch = Watch::new(&self.inner, generation);
            let result = send(master.connection).await;
            watch.answered();
            let failure = match &result {
                Ok(reply) if reply.answered_by_a_replica() => Failure::Demoted,
                Ok(_) => return result,
                Err(err) => Failure::of(err),
            };
            match failure {
                Failure::Demoted => {
                    tracing::warn!(
                        master = %master.addr,
                        "redis sentinel: the master was demoted to a replica; asking the sentinels"
                    );
                    // A replica's answer is proof that the master moved,
                    // not a guess: the lookup interval does not hold it up.
                    self.inner.look_up_again(generation);
                    // A replica wrote nothing: sending again counts once.
                    if !sent_again {
                        sent_again = true;
                        continue;
                    }
                }
                Failure::Lost => self.inner.replace(generation),
                Failure::Slow => self.inner.recheck(generation),
                Failure::Other => {}
            }
            return result;
        }
    }
}

impl SentinelConnectionBuilder {
    /// The master's (and a promoted replica's) settings: database, username
    /// and password, TLS. The default is database 0 without credentials.
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub fn master_connection_info(mut self, info: SentinelNodeConnectionInfo) -> Self {
        self.master = Some(info);
        self
    }

    /// The connection and response timeouts of the connection to the
    /// master (unless set: the `redis` crate's 1 s to connect, and no
    /// response timeout, since the layer's timeout already bounds every
    /// hit; keep it off in a config of your own:
    /// `set_response_timeout(None)`).
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub fn connection_config(mut self, config: AsyncConnectionConfig) -> Self {
        self.config = config;
        self
    }

    /// The shortest time between two lookups of the master (default
    /// [`DEFAULT_LOOKUP_INTERVAL`]). Requests are served again at most about
    /// this long (plus the lookup's own time) after the sentinels promote a
    /// replica, with the backend's circuit breaker on or off; meanwhile the
    /// sentinels are asked at most once per interval by this connection.
    /// While no master is found, the connection looks again by itself once
    /// per interval (at least 10 ms apart), until it finds one or is
    /// dropped. Zero asks on every failure.
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub fn lookup_interval(mut self, interval: Duration) -> Self {
        self.lookup_interval = interval;
        self
    }

    /// A command given up after going unanswered this long (default
    /// [`DEFAULT_STALL_AFTER`]), or one that times out, makes the connection
    /// ask the sentinels whether the master moved. Set it below the layer's
    /// timeout.
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub fn stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after;
        self
    }

    /// The connection, returned at once: the first lookup runs in the
    /// background (on the current Tokio runtime), and commands sent meanwhile
    /// wait for it.
    ///
    /// # Errors
    /// When a sentinel address is invalid or the list is empty.
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub fn build(self) -> RedisResult<SentinelConnection> {
        let sentinel = SentinelClient::build(
            self.sentinels?,
            self.master_name.clone(),
            self.master,
            SentinelServerType::Master,
        )?;
        let inner = Arc::new(Inner {
            master_name: self.master_name,
            sentinel: tokio::sync::Mutex::new(sentinel),
            config: self.config,
            lookup_interval: self.lookup_interval,
            stall_after: self.stall_after,
            state: Mutex::new(State {
                generation: 0,
                master: futures_util::future::pending().boxed().shared(),
                last_lookup: None,
                checking: false,
            }),
            found: Arc::new(AtomicU64::new(0)),
        });
        {
            let mut state = inner.lock();
            state.last_lookup = Some(quanta::Instant::now());
            state.master = spawn(connect(Arc::clone(&inner), 0));
        }
        Ok(SentinelConnection { inner })
    }

    /// The connection, once the sentinels have named a master and it is
    /// connected.
    ///
    /// # Errors
    /// When a sentinel address is invalid, or no sentinel names a master
    /// that answers as one.
    ///
    /// Example: [`SentinelConnectionBuilder`].
    pub async fn connect(self) -> RedisResult<SentinelConnection> {
        let connection = self.build()?;
        let (_, master) = connection.current();
        master.await?;
        Ok(connection)
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn may_look_up(&self, state: &State) -> bool {
        state
            .last_lookup
            .is_none_or(|last| last.elapsed() >= self.lookup_interval)
    }

    /// The master's connection failed (or was never made): look it up again,
    /// and have every command wait for that.
    fn replace(self: &Arc<Self>, generation: u64) {
        let state = self.lock();
        if state.generation != generation || !self.may_look_up(&state) {
            return;
        }
        self.start_lookup(state);
    }

    /// A replica answered in the master's place: look the master up again
    /// now, whenever the last lookup was. The lookup keeps only a server
    /// that answers `ROLE` as a master, so this cannot loop on the replica.
    fn look_up_again(self: &Arc<Self>, generation: u64) {
        let state = self.lock();
        if state.generation != generation {
            return;
        }
        self.start_lookup(state);
    }

    fn start_lookup(self: &Arc<Self>, mut state: MutexGuard<'_, State>) {
        state.generation += 1;
        state.last_lookup = Some(quanta::Instant::now());
        state.master = spawn(connect(Arc::clone(self), state.generation));
    }

    /// A lookup of `generation` found no master: look again one lookup
    /// interval later (at least [`MIN_RETRY`]), in the background, unless
    /// a command has started another lookup meanwhile. So the connection
    /// finds the promoted replica within an interval of the promotion
    /// even when no command reaches it (the backend's breaker is open),
    /// and it stops looking when the connection is dropped.
    fn retry_later(self: &Arc<Self>, generation: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(self);
        let wait = self.lookup_interval.max(MIN_RETRY);
        runtime.spawn(async move {
            tokio::time::sleep(wait).await;
            if let Some(inner) = inner.upgrade() {
                inner.replace(generation);
            }
        });
    }

    /// The master may be gone without a word: ask the sentinels in the
    /// background, and move only if they name another master.
    fn recheck(self: &Arc<Self>, generation: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut state = self.lock();
        if state.generation != generation || state.checking || !self.may_look_up(&state) {
            return;
        }
        state.checking = true;
        state.last_lookup = Some(quanta::Instant::now());
        let inner = Arc::clone(self);
        runtime.spawn(async move {
            let found = inner.find_master().await;
            let mut state = inner.lock();
            state.checking = false;
            let Ok(client) = found else {
                // No master to move to (yet): keep the connection there is.
                return;
            };
            if state.generation != generation {
                return;
            }
            let addr = client.get_connection_info().addr();
            if matches!(state.master.peek(), Some(Ok(master)) if master.addr == *addr) {
                return;
            }
            tracing::warn!(
                master = %addr,
                "redis sentinel: the master stopped answering and the sentinels name another; moving"
            );
            state.generation += 1;
            let (again, generation) = (Arc::clone(&inner), state.generation);
            state.master = spawn(async move {
                let opened = open(&again, client).await;
                if opened.is_err() {
                    again.retry_later(generation);
                }
                opened
            });
        });
    }

    async fn find_master(&self) -> RedisResult<Client> {
        let mut sentinel = self.sentinel.lock().await;
        sentinel.async_get_client().await
    }
}

/// Look the master up and connect to it (the lookup of `generation`); when
/// that fails, look again later ([`Inner::retry_later`]).
async fn connect(inner: Arc<Inner>, generation: u64) -> RedisResult<Master> {
    let found = match inner.find_master().await {
        Ok(client) => open(&inner, client).await,
        Err(err) => {
            tracing::warn!(
                master_name = %inner.master_name,
                "redis sentinel: no master found: {err}"
            );
            Err(err)
        }
    };
    if found.is_err() {
        inner.retry_later(generation);
    }
    found
}

async fn open(inner: &Inner, client: Client) -> RedisResult<Master> {
    let addr = client.get_connection_info().addr().clone();
    let connection = client
        .get_multiplexed_async_connection_with_config(&inner.config)
        .await?;
    tracing::info!(master = %addr, master_name = %inner.master_name, "redis sentinel: connected to the master");
    inner.found.fetch_add(1, Ordering::AcqRel);
    Ok(Master { addr, connection })
}

/// Run `future` on the current runtime, so that it finishes even when every
/// command waiting for it is dropped; outside a runtime, whoever waits for
/// it drives it.
fn spawn(future: impl Future<Output = RedisResult<Master>> + Send + 'static) -> MasterFuture {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn(future);
            async move {
                task.await
                    .unwrap_or_else(|err| Err(RedisError::from(std::io::Error::other(err))))
            }
            .boxed()
            .shared()
        }
        Err(_) => future.boxed().shared(),
    }
}

/// What a failed command says about the master.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// A replica answered: nothing was written.
    Demoted,
    /// The connection is gone.
    Lost,
    /// No answer in time.
    Slow,
    /// The command's own error.
    Other,
}

impl Failure {
    fn of(err: &RedisError) -> Self {
        match err.kind() {
            ErrorKind::Server(kind) if replica_error(kind) => Self::Demoted,
            _ if err.is_timeout() => Self::Slow,
            _ if err.is_io_error()
                || err.is_connection_dropped()
                || err.is_unrecoverable_error() =>
            {
                Self::Lost
            }
            _ => Self::Other,
        }
    }
}

/// An error only a replica answers: `READONLY` (a write refused) or
/// `MASTERDOWN` (a replica cut off from its master).
fn replica_error(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown
    )
}

/// A reply that may carry a replica's error: the multiplexed connection
/// hands server errors back as values, and leaves raising them to the caller.
trait Reply {
    fn answered_by_a_replica(&self) -> bool;
}

impl Reply for Value {
    fn answered_by_a_replica(&self) -> bool {
        matches!(self, Value::ServerError(err) if err.kind().is_some_and(replica_error))
    }
}

impl Reply for Vec<Value> {
    fn answered_by_a_replica(&self) -> bool {
        self.iter().any(Reply::answered_by_a_replica)
    }
}

/// Watches one command: given up unanswered after `stall_after`, it makes
/// the connection check the master.
struct Watch<'a> {
    inner: &'a Arc<Inner>,
    generation: u64,
    since: quanta::Instant,
    answered: bool,
}

impl<'a> Watch<'a> {
    fn new(inner: &'a Arc<Inner>, generation: u64) -> Self {
        Self {
            inner,
            generation,
            since: quanta::Instant::now(),
            answered: false,
        }
    }

    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.answered && self.since.elapsed() >= self.inner.stall_after {
            self.inner.recheck(self.generation);
        }
    }
}

forward_commands! {
    impl for SentinelConnection;
    |this, send| Box::pin(this.run(move |mut connection| async move { send!(connection).await }));
    |this| match this.inner.lock().master.peek() {
        Some(Ok(master)) => master.connection.get_db(),
        _ => 0,
    }
}

/// The audit scans the master the connection talks to.
impl Nodes for SentinelConnection {
    async fn nodes(&mut self) -> RedisResult<Vec<Node>> {
        Ok(vec![Node::This])
    }

    async fn on_node(&mut self, _node: &Node, cmd: Cmd) -> RedisResult<Value> {
        cmd.query_async(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_say_what_became_of_the_master() {
        use std::io;
        let cases: &[(&str, RedisError, Failure)] = &[
            (
                "READONLY",
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ReadOnly),
                    "You can't write against a read only replica.",
                )),
                Failure::Demoted,
            ),
            (
                "MASTERDOWN",
                RedisError::from((
                    ErrorKind::Server(ServerErrorKind::MasterDown),
                    "Link with MASTER is down",
                )),
                Failure::Demoted,
            ),
            (
                "reset",
                RedisError::from(io::Error::from(io::ErrorKind::ConnectionReset)),
                Failure::Lost,
            ),
            (
                "broken pipe",
                RedisError::from(io::Error::from(io::ErrorKind::BrokenPipe)),
                Failure::Lost,
            ),
            (
                "timed out",
                RedisError::from(io::Error::from(io::ErrorKind::TimedOut)),
                Failure::Slow,
            ),
            (
                "a script's error",
                RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "bad")),
                Failure::Other,
            ),
            (
                "NOSCRIPT",
                RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "no script")),
                Failure::Other,
            ),
        ];
        for (name, err, want) in cases {
            assert_eq!(Failure::of(err), *want, "{name}: {err}");
        }
    }

    #[tokio::test]
    async fn bad_sentinel_addresses_are_errors() {
        let err = SentinelConnection::builder(vec!["not a url"], "m")
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidClientConfig, "{err}");
        let err = SentinelConnection::builder(Vec::<String>::new(), "m")
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::EmptySentinelList, "{err}");
    }
}
