//! The Redis backend's settings: [`RedisBackendBuilder`] and the defaults
//! it starts from. The backend is put together from them by
//! [`RedisBackendBuilder::build`].

use std::fmt;
use std::time::Duration;

use super::connection::acks::Acks;
use super::connection::breaker::BreakerConfig;
use tower_pinned_window::ConfigError;

/// The prefix of every key this backend writes, unless configured otherwise
/// ([`RedisBackendBuilder::prefix`]; [`RedisBackend`](super::RedisBackend)'s example shows it in
/// a key).
pub const DEFAULT_PREFIX: &str = "tpw:";

/// Denied keys remembered locally, unless configured otherwise
/// ([`RedisBackendBuilder::deny_cache`]; [`RedisBackendBuilder`] has an
/// example).
pub const DEFAULT_DENY_CACHE: usize = 65_536;

/// The longest this instance holds a denial of a counter whose count can
/// go down (a [`Counter::lowers`](tower_pinned_window::backend::Counter::lowers)) before it asks Redis again, unless
/// configured otherwise ([`RedisBackendBuilder::deny_cache_recheck`]): a
/// key denied on a busy route then costs Redis at most ten calls a second
/// per instance, and a denial outlives the room another instance freed by
/// at most this and a round trip.
pub const DEFAULT_DENY_CACHE_RECHECK: Duration = Duration::from_millis(100);

/// Builds a [`RedisBackend`](super::RedisBackend).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_pinned_window_redis::RedisBackend;
/// use tower_pinned_window::key::Key;
/// use tower_pinned_window_redis::redis::Client;
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let connection = client.get_multiplexed_async_connection().await?;
/// let backend = RedisBackend::builder(connection)
///     .prefix("app1:")
///     .deny_cache(10_000)
///     .deny_cache_recheck(Duration::from_millis(50))
///     .breaker(3, Duration::from_secs(1))
///     .build();
/// assert_eq!(backend.storage_key("api", &Key::new("203.0.113.7")), b"app1:api{203.0.113.7}");
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct RedisBackendBuilder<C> {
    pub(super) connection: C,
    pub(super) prefix: Vec<u8>,
    pub(super) deny_cache: usize,
    pub(super) deny_cache_recheck: Duration,
    pub(super) breaker: Option<BreakerConfig>,
    pub(super) coalesce: bool,
    pub(super) acks: Option<Acks>,
}

impl<C> fmt::Debug for RedisBackendBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("prefix", &self.prefix.escape_ascii().to_string())
            .field("deny_cache", &self.deny_cache)
            .field("deny_cache_recheck", &self.deny_cache_recheck)
            .field("breaker", &self.breaker)
            .field("coalesce", &self.coalesce)
            .field("wait_for_replicas", &self.acks)
            .finish_non_exhaustive()
    }
}

impl<C> RedisBackendBuilder<C> {
    /// A builder of a backend on `connection`, with the defaults.
    pub(super) fn new(connection: C) -> Self {
        Self {
            connection,
            prefix: DEFAULT_PREFIX.into(),
            deny_cache: DEFAULT_DENY_CACHE,
            deny_cache_recheck: DEFAULT_DENY_CACHE_RECHECK,
            breaker: Some(BreakerConfig::default()),
            coalesce: true,
            acks: None,
        }
    }

    /// The prefix of every key (default `tpw:`), to share a Redis with other
    /// data or other deployments.
    ///
    /// # Panics
    /// When `prefix` contains `{` or `}`: on a Cluster it would take the hash
    /// tag over from the crate's own (see [`RedisBackend`](super::RedisBackend)'s keys). Use
    /// [`try_prefix`](Self::try_prefix) for a prefix read from configuration.
    ///
    /// Example: [`RedisBackendBuilder`].
    #[track_caller]
    pub fn prefix(self, prefix: impl Into<Vec<u8>>) -> Self {
        match self.try_prefix(prefix) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`prefix`](Self::prefix), for a prefix known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::InvalidPrefix`] when `prefix` contains `{` or `}`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tower_pinned_window_redis::RedisBackend;
    /// use tower_pinned_window::ConfigError;
    ///
    /// // Not connected here (there is no runtime): only the builder is shown.
    /// let backend = RedisBackend::connect_in_background("redis://127.0.0.1:6379/")?;
    /// let builder = RedisBackend::builder(backend.connection().clone());
    /// assert_eq!(
    ///     builder.try_prefix("app{1}:").err(),
    ///     Some(ConfigError::InvalidPrefix("app{1}:".into()))
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn try_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        if prefix.iter().any(|b| matches!(b, b'{' | b'}')) {
            return Err(ConfigError::InvalidPrefix(
                prefix.escape_ascii().to_string(),
            ));
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// How many denied keys this instance remembers (default
    /// [`DEFAULT_DENY_CACHE`]); 0 turns the local deny cache off.
    ///
    /// Example: [`RedisBackendBuilder`].
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// The longest a denial of a counter that can go down (a
    /// [`Counter::lowers`](tower_pinned_window::backend::Counter::lowers): a layer with a `reserve`, a `count_if` or a
    /// `reset_if`) is held here before Redis is asked again (default
    /// [`DEFAULT_DENY_CACHE_RECHECK`]); a counter that only goes up is
    /// held until its window closes. See
    /// [the local deny cache](super::RedisBackend#the-local-deny-cache).
    ///
    /// # Panics
    /// When `recheck` is zero (turn the cache off with
    /// [`deny_cache(0)`](Self::deny_cache) instead). Use
    /// [`try_deny_cache_recheck`](Self::try_deny_cache_recheck) for a value
    /// read from configuration.
    ///
    /// Example: [`RedisBackendBuilder`].
    #[track_caller]
    pub fn deny_cache_recheck(self, recheck: Duration) -> Self {
        match self.try_deny_cache_recheck(recheck) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`deny_cache_recheck`](Self::deny_cache_recheck), for a value
    /// known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroDenyCacheRecheck`] for zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window_redis::RedisBackend;
    /// use tower_pinned_window::ConfigError;
    ///
    /// let backend = RedisBackend::connect_in_background("redis://127.0.0.1:6379/")?;
    /// let builder = || RedisBackend::builder(backend.connection().clone());
    /// assert_eq!(
    ///     builder().try_deny_cache_recheck(Duration::ZERO).err(),
    ///     Some(ConfigError::ZeroDenyCacheRecheck)
    /// );
    /// assert!(builder().try_deny_cache_recheck(Duration::from_millis(20)).is_ok());
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn try_deny_cache_recheck(mut self, recheck: Duration) -> Result<Self, ConfigError> {
        if recheck.is_zero() {
            return Err(ConfigError::ZeroDenyCacheRecheck);
        }
        self.deny_cache_recheck = recheck;
        Ok(self)
    }

    /// The circuit breaker: after `failures` failed commands in a row
    /// (unreachable, timed out by the layer, `LOADING`...),
    /// the backend answers [`BackendError::CircuitOpen`](tower_pinned_window::backend::BackendError::CircuitOpen) at once and lets
    /// one probe through at a time: the first 25 ms after it opened, the next twice as long after each probe
    /// that failed (50 ms, 100 ms, ...), never more than `cooldown` apart.
    /// A probe that succeeds closes it, and the next opening starts from
    /// 25 ms again. So an outage costs requests no wait
    /// and Redis at most one probe per `cooldown` once it has lasted a
    /// while, and a short fault costs little more than it lasts: under a
    /// 100 ms layer timeout, a Redis frozen for 300 ms fails hits from
    /// 100 ms to about 300 ms after the freeze began (the probe in flight
    /// when it wakes is answered and closes the breaker). The default is
    /// [`DEFAULT_BREAKER_FAILURES`](super::DEFAULT_BREAKER_FAILURES) and [`DEFAULT_BREAKER_COOLDOWN`](super::DEFAULT_BREAKER_COOLDOWN). It
    /// logs a warning when it opens and an info line when it closes; the
    /// metrics count its answers as `circuit_open`.
    ///
    /// A command the layer gave up on counts as a failure when it had waited
    /// at least 10 ms: with a layer
    /// [`timeout`](tower_pinned_window::RateLimitLayer::timeout) shorter than that, a
    /// store that stops answering costs each request its timeout instead.
    /// A command dropped sooner (its client went away) counts neither way,
    /// so clients that cancel requests can't open the breaker of a healthy
    /// store.
    ///
    /// On a Redis Cluster connection there is one breaker per master, so a
    /// failing master does not stop the healthy masters' keys: the backend
    /// reads `CLUSTER SLOTS` on its first command and every 5 s after, and
    /// until it knows the masters, there is one breaker per
    /// 128 consecutive slots. The Cluster's refusals
    /// (`CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN`) are answered by live nodes
    /// about the Cluster's state, not a master's failure, and count neither
    /// way: such a hit fails with [`BackendError::ClusterDown`](tower_pinned_window::backend::BackendError::ClusterDown), counted as
    /// `cluster_down` (with `cluster_client_builder`'s settings, within the
    /// layer's default timeout; a client that retries
    /// it until the layer's timeout gets a timeout, which does count). A
    /// `MOVED` or `ASK` the Cluster client gave up following counts as a
    /// failure of the master it points to, which did not answer. While a
    /// breaker is open the backend reads `CLUSTER INFO` (one node at
    /// random, every 25 ms) and, when `cluster_state` turns from `fail`
    /// back to `ok`, lets every open breaker probe at once (and again at
    /// each `ok` read in the next second, as the nodes turn ok one by one;
    /// it reads `CLUSTER SLOTS` again). On any
    /// other connection there is one breaker for the backend.
    ///
    /// On a `SentinelConnection` (feature `redis-sentinel`) the breaker does not hold up a
    /// failover: the connection goes on looking for the master in the
    /// background (every lookup interval) while no command reaches it, and
    /// an open breaker lets a probe through as soon as the connection has
    /// connected to a master since it opened, so requests are served again
    /// within the lookup interval of the promotion, as without a breaker.
    ///
    /// `cooldown` shorter than 25 ms is the wait before
    /// every probe.
    ///
    /// # Panics
    /// When `failures` is 0 or `cooldown` is zero. Use
    /// [`try_breaker`](Self::try_breaker) for values read from
    /// configuration.
    ///
    /// Example: [`RedisBackendBuilder`].
    #[track_caller]
    pub fn breaker(self, failures: u32, cooldown: Duration) -> Self {
        match self.try_breaker(failures, cooldown) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`breaker`](Self::breaker), for values known only at run time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroBreakerFailures`] or
    /// [`ConfigError::ZeroBreakerCooldown`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window_redis::RedisBackend;
    /// use tower_pinned_window::ConfigError;
    ///
    /// let backend = RedisBackend::connect_in_background("redis://127.0.0.1:6379/")?;
    /// let builder = RedisBackend::builder(backend.connection().clone());
    /// assert_eq!(
    ///     builder.try_breaker(0, Duration::from_secs(1)).err(),
    ///     Some(ConfigError::ZeroBreakerFailures)
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn try_breaker(mut self, failures: u32, cooldown: Duration) -> Result<Self, ConfigError> {
        if failures == 0 {
            return Err(ConfigError::ZeroBreakerFailures);
        }
        if cooldown.is_zero() {
            return Err(ConfigError::ZeroBreakerCooldown);
        }
        self.breaker = Some(BreakerConfig { failures, cooldown });
        Ok(self)
    }

    /// No circuit breaker: every hit waits on Redis, up to the layer's
    /// timeout.
    ///
    /// Example: [`RedisBackendBuilder`].
    pub fn no_breaker(mut self) -> Self {
        self.breaker = None;
        self
    }

    /// The replica-acknowledged mode (off by default): a call that writes
    /// counters (hits, spends, amends, resets) counts as answered only once
    /// `replicas` replicas of its master hold it. Each such call is sent as
    /// one pipeline, the script call then `WAIT replicas timeout`, on the
    /// same connection to the same master (no extra round trip; on a
    /// Cluster, to the master of the call's slot). `timeout` is rounded up
    /// to whole milliseconds.
    ///
    /// When `WAIT` counts fewer replicas within `timeout`, the call's
    /// answers are not used: each of its requests fails with
    /// [`BackendError::Unavailable`](tower_pinned_window::backend::BackendError::Unavailable) ("not acknowledged by N replica(s)
    /// within T ms"), follows the layer's
    /// [`FailurePolicy`](tower_pinned_window::FailurePolicy), and counts as a failure of
    /// its master's breaker. The counts the master made stay as they are:
    /// the call is never sent again, and nothing is undone.
    ///
    /// What it buys: a master that was frozen and deposed while its replica
    /// took over has no replica left to acknowledge it, so what it answers
    /// when it wakes is not admitted (without the mode, it can admit hits
    /// in the moment before it learns it was deposed, and those are lost
    /// when it resyncs). What it costs: every write waits for a replica's
    /// acknowledgement, and `WAIT` holds the connection it is sent on, so
    /// calls on one master's connection go one after the other, each a
    /// replication round trip longer; a master whose replicas are slow or
    /// gone costs each of its calls up to `timeout`. With
    /// [`FailurePolicy::FailOpen`](tower_pinned_window::FailurePolicy::FailOpen), a call
    /// not acknowledged still lets its requests through (uncounted), as
    /// any outage does. See the Redis guide ([`docs/redis.md`](https://docs.rs/tower-pinned-window/latest/tower_pinned_window/guide/redis/index.html)) for the
    /// measured cost and what it guarantees.
    ///
    /// # Panics
    /// When `replicas` is 0 or `timeout` is zero (`WAIT` would then wait
    /// forever). Use [`try_wait_for_replicas`](Self::try_wait_for_replicas)
    /// for values read from configuration.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_pinned_window_redis::RedisBackend;
    /// use tower_pinned_window_redis::redis::Client;
    ///
    /// let client = Client::open("redis://127.0.0.1:6379/")?;
    /// let connection = client.get_multiplexed_async_connection().await?;
    /// let backend = RedisBackend::builder(connection)
    ///     // The master's replica holds every write before it counts.
    ///     .wait_for_replicas(1, Duration::from_millis(50))
    ///     .build();
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn wait_for_replicas(self, replicas: u32, timeout: Duration) -> Self {
        match self.try_wait_for_replicas(replicas, timeout) {
            Ok(this) => this,
            Err(err) => panic!("{err}"),
        }
    }

    /// Like [`wait_for_replicas`](Self::wait_for_replicas), for values known
    /// only at run time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroWaitReplicas`] or [`ConfigError::ZeroWaitTimeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_pinned_window_redis::RedisBackend;
    /// use tower_pinned_window::ConfigError;
    ///
    /// let backend = RedisBackend::connect_in_background("redis://127.0.0.1:6379/")?;
    /// let builder = || RedisBackend::builder(backend.connection().clone());
    /// assert_eq!(
    ///     builder().try_wait_for_replicas(0, Duration::from_millis(50)).err(),
    ///     Some(ConfigError::ZeroWaitReplicas)
    /// );
    /// assert_eq!(
    ///     builder().try_wait_for_replicas(1, Duration::ZERO).err(),
    ///     Some(ConfigError::ZeroWaitTimeout)
    /// );
    /// assert!(builder().try_wait_for_replicas(1, Duration::from_micros(100)).is_ok());
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn try_wait_for_replicas(
        mut self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        if replicas == 0 {
            return Err(ConfigError::ZeroWaitReplicas);
        }
        if timeout.is_zero() {
            return Err(ConfigError::ZeroWaitTimeout);
        }
        self.acks = Some(Acks::new(replicas, timeout));
        Ok(self)
    }

    /// Whether requests issued while others are in flight go to Redis
    /// together (default `true`): one script call for every hit (or spend,
    /// or amend) queued behind the call in flight, each answered exactly as
    /// if sent alone (see [coalesced hits](super::RedisBackend#coalesced-hits) and
    /// [spends](super::RedisBackend#spends)). `false` sends one `EVALSHA` of the
    /// hit script per counter hit, and one call per spend or amend.
    // Hidden: it exists only so the benchmarks (`bench/redis.sh`,
    // `bench/wrk_redis.sh`) and the tests can compare the two paths in one
    // run; coalescing is never worse for a user, so it is no setting of
    // theirs. It stays callable for them.
    #[doc(hidden)]
    pub fn coalesce(mut self, coalesce: bool) -> Self {
        self.coalesce = coalesce;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_with_braces_are_refused() {
        let builder = || RedisBackendBuilder {
            connection: (),
            prefix: Vec::new(),
            deny_cache: 0,
            deny_cache_recheck: DEFAULT_DENY_CACHE_RECHECK,
            breaker: None,
            coalesce: true,
            acks: None,
        };
        for prefix in ["{", "}", "a{b}:", "tpw}"] {
            assert_eq!(
                builder().try_prefix(prefix).err(),
                Some(ConfigError::InvalidPrefix(prefix.into())),
                "{prefix}"
            );
            let panicked = std::panic::catch_unwind(|| builder().prefix(prefix));
            assert!(panicked.is_err(), "{prefix}");
        }
        for prefix in ["", "tpw:", "app1:", "%#:*"] {
            assert_eq!(
                builder().try_prefix(prefix).unwrap().prefix,
                prefix.as_bytes(),
                "{prefix}"
            );
        }
    }
}
