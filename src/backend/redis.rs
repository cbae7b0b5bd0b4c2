//! The Redis backend: counters shared by every instance of a service.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use hashbrown::{DefaultHashBuilder, HashTable};

use futures_util::future::join_all;
use smallvec::SmallVec;

use super::{Backend, BackendError, Counter, Hit, Hits};
use crate::key::Key;
use crate::quota::{Quota, Window};

/// The script run for every hit, by its SHA1 (`EVALSHA`).
///
/// It increments the counter and attaches the window's lifetime only when the
/// counter has none, which is the case for a counter it just created (or one
/// left without a lifetime by older code); an existing lifetime is never
/// touched. A value that is not a non-negative integer, or a key of another
/// type, is corrupt: the script answers `{reason}` and the stored value is
/// left exactly as it was. The window is checked before anything is written,
/// so no error can leave a counter without a lifetime.
pub const HIT_SCRIPT: &str = r#"-- tower-pinned-window: count one hit in a window pinned to the first hit.
-- KEYS[1]: the counter. ARGV[1]: the window in milliseconds.
-- Returns {count, milliseconds left}, or {reason} for a corrupt counter.
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 9007199254740991 or window % 1 ~= 0 then
  return redis.error_reply('ERR tower-pinned-window: invalid window ' .. tostring(ARGV[1]))
end
local count = redis.pcall('INCR', KEYS[1])
if type(count) == 'table' then
  local err = count.err or ''
  if string.find(err, 'WRONGTYPE', 1, true) or string.find(err, 'not an integer', 1, true)
      or string.find(err, 'overflow', 1, true) then
    local kind = redis.call('TYPE', KEYS[1]).ok
    if kind == 'string' then
      return {'value ' .. string.sub(redis.call('GET', KEYS[1]), 1, 64)}
    end
    return {'a key of type ' .. kind}
  end
  return redis.error_reply(err)
end
if count < 1 then
  redis.call('DECR', KEYS[1])
  return {'negative value ' .. tostring(count - 1)}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
  ttl = window
end
return {count, ttl}
"#;

/// Attaches a window to a counter that has no lifetime; touches nothing
/// else, and never a corrupt key (whose lifetime would make it vanish).
/// Returns 1 when it attached one, 0 when the key had a lifetime, -1 when the
/// key is not a counter.
const REPAIR_SCRIPT: &str = r#"-- tower-pinned-window: attach a lifetime to a counter that has none.
if redis.call('TYPE', KEYS[1]).ok ~= 'string' or not string.match(redis.call('GET', KEYS[1]), '^%d+$') then
  return -1
end
if redis.call('PTTL', KEYS[1]) == -1 then
  return redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
"#;

/// Reads a counter without counting: `{}` when absent, `{reason}` when
/// corrupt, `{value, PTTL}` otherwise.
const PEEK_SCRIPT: &str = r#"-- tower-pinned-window: read a counter without counting.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return {}
end
if kind ~= 'string' then
  return {'a key of type ' .. kind}
end
local value = redis.call('GET', KEYS[1])
if not string.match(value, '^%d+$') then
  return {'value ' .. string.sub(value, 1, 64)}
end
return {value, redis.call('PTTL', KEYS[1])}
"#;

static HIT_SHA: LazyLock<String> = LazyLock::new(|| sha1_hex(HIT_SCRIPT));

/// The prefix of every key this backend writes, unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "tpw:";

/// Denied keys remembered locally, unless configured otherwise.
pub const DEFAULT_DENY_CACHE: usize = 65_536;

/// Counters in Redis or Redis Cluster, shared by every instance of a service.
///
/// Every hit is **one round trip**: `EVALSHA` of [`HIT_SCRIPT`], which
/// increments the counter and attaches the window's lifetime in the same
/// atomic step when the counter has none, and never touches an existing
/// lifetime. When Redis has lost the script (`NOSCRIPT` after a restart,
/// `SCRIPT FLUSH` or a failover), the hit is retried once with `EVAL`, which
/// also loads it again. Each call names one key, so it works unchanged on a
/// Redis Cluster connection.
///
/// Any async Redis connection that can be cloned serves: a
/// [`ConnectionManager`] (what [`connect`](Self::connect) makes; it
/// reconnects by itself), a `MultiplexedConnection`, or a Cluster connection
/// (feature `redis-cluster`). Concurrent hits share the connection and are
/// pipelined on it; no hit opens a connection of its own.
///
/// Keys are `{prefix}{layer name}:{key}`, with the prefix `tpw:` by default.
///
/// # Requirements
///
/// Redis 6.0 or later (tested against 7.0); the script uses `INCR`, `DECR`,
/// `PTTL`, `PEXPIRE`, `TYPE` and `GET`. An ACL user needs
/// `+evalsha +eval +incr +decr +pttl +pexpire +type +get` for hits, `+del`
/// for [`reset`](Backend::reset), and `+scan` for [`audit`](Self::audit)
/// (plus `+cluster|slots` on a Cluster), all on the prefix's keys
/// (`~tpw:*`).
///
/// # The local deny cache
///
/// Once a hit comes back over its limit, the key is remembered on this
/// instance until its window closes, and further hits on it are denied here,
/// with no round trip. This is exact because the window is pinned: its
/// deadline cannot move. The deadline is measured from when the hit was sent,
/// so it never outlasts the window in Redis. Such denials report a count of
/// `limit + 1`.
///
/// The trade-off is [`reset`](Backend::reset): it clears this instance's
/// cache, but other instances keep denying a key they have cached until its
/// window would have closed. Turn the cache off with
/// [`deny_cache(0)`](RedisBackendBuilder::deny_cache) where resets must take
/// effect everywhere at once.
pub struct RedisBackend<C> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    connection: C,
    prefix: Box<[u8]>,
    deny: Option<DenyCache>,
}

impl<C> Clone for RedisBackend<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix.escape_ascii().to_string())
            .field(
                "deny_cache",
                &self.inner.deny.as_ref().map_or(0, |d| d.capacity),
            )
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisBackend`].
pub struct RedisBackendBuilder<C> {
    connection: C,
    prefix: Vec<u8>,
    deny_cache: usize,
}

impl<C> fmt::Debug for RedisBackendBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("prefix", &self.prefix.escape_ascii().to_string())
            .field("deny_cache", &self.deny_cache)
            .finish_non_exhaustive()
    }
}

impl<C> RedisBackendBuilder<C> {
    /// The prefix of every key (default `tpw:`).
    pub fn prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many denied keys this instance remembers (default
    /// [`DEFAULT_DENY_CACHE`]); 0 turns the local deny cache off.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// The backend.
    pub fn build(self) -> RedisBackend<C> {
        RedisBackend {
            inner: Arc::new(Inner {
                connection: self.connection,
                prefix: self.prefix.into(),
                deny: (self.deny_cache > 0).then(|| DenyCache::new(self.deny_cache)),
            }),
        }
    }
}

impl RedisBackend<ConnectionManager> {
    /// Connect to the Redis at `url` (`redis://host:port/db`) through a
    /// [`ConnectionManager`], which reconnects by itself after an outage.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when the URL is invalid or the first
    /// connection fails.
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        let client = ::redis::Client::open(url).map_err(unavailable)?;
        let connection = client.get_connection_manager().await.map_err(unavailable)?;
        Ok(Self::new(connection))
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A backend on `connection`, with the default prefix and deny cache.
    pub fn new(connection: C) -> Self {
        Self::builder(connection).build()
    }

    /// Choose the prefix and the deny cache.
    pub fn builder(connection: C) -> RedisBackendBuilder<C> {
        RedisBackendBuilder {
            connection,
            prefix: DEFAULT_PREFIX.into(),
            deny_cache: DEFAULT_DENY_CACHE,
        }
    }

    /// The Redis key that holds `key`'s counter for the layer `namespace`.
    pub fn storage_key(&self, namespace: &str, key: &Key) -> Vec<u8> {
        let prefix = &self.inner.prefix;
        let mut out = Vec::with_capacity(prefix.len() + namespace.len() + 1 + key.as_bytes().len());
        out.extend_from_slice(prefix);
        out.extend_from_slice(namespace.as_bytes());
        out.push(b':');
        out.extend_from_slice(key.as_bytes());
        out
    }

    /// The connection the backend uses.
    pub fn connection(&self) -> &C {
        &self.inner.connection
    }

    async fn eval(&self, key: &[u8], window: Window) -> Result<Hit, BackendError> {
        let mut connection = self.inner.connection.clone();
        let mut evalsha = ::redis::cmd("EVALSHA");
        evalsha
            .arg(HIT_SHA.as_str())
            .arg(1)
            .arg(key)
            .arg(window.as_millis());
        let value = match evalsha.query_async::<Value>(&mut connection).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!("hit script missing on the server (restart or SCRIPT FLUSH): sending it with EVAL");
                let mut eval = ::redis::cmd("EVAL");
                eval.arg(HIT_SCRIPT).arg(1).arg(key).arg(window.as_millis());
                eval.query_async::<Value>(&mut connection).await
            }
            other => other,
        }
        .map_err(unavailable)?;
        parse_hit(value, key)
    }
}

fn parse_hit(value: Value, key: &[u8]) -> Result<Hit, BackendError> {
    let corrupt = |detail: String| BackendError::Corrupt {
        key: key.escape_ascii().to_string(),
        detail,
    };
    match value {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(count), Value::Int(ttl)] if *count >= 1 && *ttl >= 0 => Ok(Hit {
                count: *count as u64,
                reset: Duration::from_millis(*ttl as u64),
            }),
            [Value::BulkString(reason)] => {
                Err(corrupt(String::from_utf8_lossy(reason).into_owned()))
            }
            _ => Err(corrupt(format!("unexpected script reply {items:?}"))),
        },
        other => Err(corrupt(format!("unexpected script reply {other:?}"))),
    }
}

fn malformed(err: ::redis::ParsingError) -> BackendError {
    BackendError::Unavailable(Box::new(err))
}

fn unavailable(err: RedisError) -> BackendError {
    if err.is_timeout() {
        BackendError::TimedOut
    } else {
        BackendError::Unavailable(Box::new(err))
    }
}

/// The future of a [`RedisBackend`] hit: already complete when the local
/// deny cache answered, one round trip otherwise.
pub struct RedisHit {
    state: HitState,
}

type Remote = Pin<Box<dyn Future<Output = Result<Hits, BackendError>> + Send>>;

enum HitState {
    Ready(Option<Result<Hits, BackendError>>),
    Remote(Remote),
}

impl fmt::Debug for RedisHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            HitState::Ready(_) => "ready",
            HitState::Remote(_) => "remote",
        };
        f.debug_struct("RedisHit").field("state", &state).finish()
    }
}

impl Future for RedisHit {
    type Output = Result<Hits, BackendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            HitState::Ready(result) => {
                Poll::Ready(result.take().expect("RedisHit polled after it completed"))
            }
            HitState::Remote(future) => future.as_mut().poll(cx),
        }
    }
}

impl<C> Backend for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Future = RedisHit;

    /// One `EVALSHA` per counter, all sent at once: on one connection they
    /// are pipelined (one round trip of latency); on a Cluster, counters on
    /// different masters are hit in parallel.
    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> RedisHit {
        let storage_keys: SmallVec<[Vec<u8>; 2]> = counters
            .iter()
            .map(|c| self.storage_key(c.namespace, key))
            .collect();
        if let Some(deny) = &self.inner.deny {
            let cached: SmallVec<[Option<Duration>; 2]> =
                storage_keys.iter().map(|k| deny.check(k)).collect();
            if cached.iter().any(Option::is_some) {
                // Denied here, without a round trip; the counters are not hit.
                let hits = counters
                    .iter()
                    .zip(cached)
                    .map(|(c, left)| match left {
                        Some(reset) => Hit {
                            count: c.quota.limit().saturating_add(1),
                            reset,
                        },
                        None => Hit {
                            count: 0,
                            reset: Duration::ZERO,
                        },
                    })
                    .collect();
                return RedisHit {
                    state: HitState::Ready(Some(Ok(hits))),
                };
            }
        }
        let quotas: SmallVec<[Quota; 2]> = counters.iter().map(|c| c.quota).collect();
        let this = self.clone();
        RedisHit {
            state: HitState::Remote(Box::pin(async move {
                let sent = quanta::Instant::now();
                let results = join_all(
                    storage_keys
                        .iter()
                        .zip(&quotas)
                        .map(|(k, q)| this.eval(k, q.window())),
                )
                .await;
                let mut hits = Hits::with_capacity(results.len());
                for ((result, storage_key), quota) in
                    results.into_iter().zip(storage_keys).zip(quotas)
                {
                    let hit = result?;
                    if let Some(deny) = this
                        .inner
                        .deny
                        .as_ref()
                        .filter(|_| hit.count > quota.limit())
                    {
                        deny.insert(storage_key, sent + hit.reset);
                    }
                    hits.push(hit);
                }
                Ok(hits)
            })),
        }
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        let storage_key = self.storage_key(namespace, key);
        let mut connection = self.inner.connection.clone();
        let reply: Value = ::redis::cmd("EVAL")
            .arg(PEEK_SCRIPT)
            .arg(1)
            .arg(&storage_key)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        let corrupt = |detail: String| BackendError::Corrupt {
            key: storage_key.escape_ascii().to_string(),
            detail,
        };
        let Value::Array(items) = reply else {
            return Err(corrupt(format!("unexpected script reply {reply:?}")));
        };
        match items.as_slice() {
            [] => Ok(None),
            [Value::BulkString(reason)] => {
                Err(corrupt(String::from_utf8_lossy(reason).into_owned()))
            }
            [Value::BulkString(digits), Value::Int(ttl)] => {
                let count = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| corrupt(format!("value {}", digits.escape_ascii())))?;
                // A counter without a lifetime (PTTL -1) never resets by itself.
                let reset = u64::try_from(*ttl).map_or(Duration::MAX, Duration::from_millis);
                Ok(Some(Hit { count, reset }))
            }
            _ => Err(corrupt(format!("unexpected script reply {items:?}"))),
        }
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        let storage_key = self.storage_key(namespace, key);
        if let Some(deny) = &self.inner.deny {
            deny.remove(&storage_key);
        }
        let mut connection = self.inner.connection.clone();
        let deleted: i64 = ::redis::cmd("DEL")
            .arg(&storage_key)
            .query_async(&mut connection)
            .await
            .map_err(unavailable)?;
        Ok(deleted > 0)
    }
}

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
        let mut connection = self.inner.connection.clone();
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

/// Keys known to be over their limit until a deadline, on this instance.
struct DenyCache {
    capacity: usize,
    hasher: DefaultHashBuilder,
    state: Mutex<DenyState>,
}

struct DenyState {
    table: HashTable<(Box<[u8]>, quanta::Instant)>,
    /// No entry expires before this; a full cache is not swept until then.
    min_deadline: Option<quanta::Instant>,
}

impl DenyCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            hasher: DefaultHashBuilder::default(),
            state: Mutex::new(DenyState {
                table: HashTable::new(),
                min_deadline: None,
            }),
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        let mut state = self.hasher.build_hasher();
        state.write(key);
        state.finish()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DenyState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Time left while `key` is denied.
    fn check(&self, key: &[u8]) -> Option<Duration> {
        let hash = self.hash(key);
        let now = quanta::Instant::now();
        let mut state = self.lock();
        match state.table.find_entry(hash, |(k, _)| **k == *key) {
            Ok(entry) if entry.get().1 > now => Some(entry.get().1 - now),
            Ok(entry) => {
                entry.remove();
                None
            }
            Err(_) => None,
        }
    }

    fn insert(&self, key: Vec<u8>, deadline: quanta::Instant) {
        let hash = self.hash(&key);
        let now = quanta::Instant::now();
        if deadline <= now {
            return;
        }
        let mut state = self.lock();
        if state.table.len() >= self.capacity {
            if state.min_deadline.is_some_and(|min| min > now) {
                return; // full of live entries: this key just costs a round trip
            }
            state.table.retain(|(_, d)| *d > now);
            state.min_deadline = state.table.iter().map(|(_, d)| *d).min();
            if state.table.len() >= self.capacity {
                return;
            }
        }
        state.min_deadline = Some(state.min_deadline.map_or(deadline, |min| min.min(deadline)));
        let hasher = &self.hasher;
        match state.table.find_entry(hash, |(k, _)| **k == *key) {
            Ok(mut entry) => entry.get_mut().1 = deadline,
            Err(absent) => {
                let table = absent.into_table();
                table.insert_unique(hash, (key.into(), deadline), |(k, _)| {
                    let mut state = hasher.build_hasher();
                    state.write(k);
                    state.finish()
                });
            }
        }
    }

    fn remove(&self, key: &[u8]) {
        let hash = self.hash(key);
        let mut state = self.lock();
        if let Ok(entry) = state.table.find_entry(hash, |(k, _)| **k == *key) {
            entry.remove();
        }
    }
}

/// SHA1 of `text`, in lowercase hex: the name `EVALSHA` runs a script by.
fn sha1_hex(text: &str) -> String {
    ::redis::Script::new(text).get_hash().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_replies_parse() {
        let cases: &[(&str, Value, Result<Hit, &str>)] = &[
            (
                "fresh",
                Value::Array(vec![Value::Int(1), Value::Int(60_000)]),
                Ok(Hit {
                    count: 1,
                    reset: Duration::from_secs(60),
                }),
            ),
            (
                "corrupt value",
                Value::Array(vec![Value::BulkString(b"value abc".to_vec())]),
                Err("value abc"),
            ),
            (
                "zero count",
                Value::Array(vec![Value::Int(0), Value::Int(5)]),
                Err("unexpected script reply"),
            ),
            (
                "negative ttl",
                Value::Array(vec![Value::Int(3), Value::Int(-1)]),
                Err("unexpected script reply"),
            ),
            (
                "not an array",
                Value::Int(7),
                Err("unexpected script reply"),
            ),
        ];
        for (name, value, want) in cases {
            match (parse_hit(value.clone(), b"tpw:n:k"), want) {
                (Ok(hit), Ok(want)) => assert_eq!(hit, *want, "{name}"),
                (Err(BackendError::Corrupt { key, detail }), Err(want)) => {
                    assert_eq!(key, "tpw:n:k", "{name}");
                    assert!(detail.contains(want), "{name}: {detail}");
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }

    #[test]
    fn audit_patterns_escape_globs() {
        assert_eq!(glob_escape(b"tpw:"), b"tpw:*");
        assert_eq!(glob_escape(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\*");
    }

    #[test]
    fn the_script_sha_is_sha1_of_its_text() {
        assert_eq!(sha1_hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(HIT_SHA.len(), 40);
    }

    #[test]
    fn the_deny_cache_expires_and_stays_bounded() {
        let cache = DenyCache::new(2);
        let now = quanta::Instant::now();
        let later = now + Duration::from_secs(60);
        cache.insert(b"a".to_vec(), later);
        cache.insert(b"b".to_vec(), later);
        cache.insert(b"c".to_vec(), later);
        assert!(cache.check(b"a").is_some());
        assert!(cache.check(b"b").is_some());
        assert_eq!(
            cache.check(b"c"),
            None,
            "a full cache of live entries takes no more"
        );
        cache.remove(b"a");
        assert_eq!(cache.check(b"a"), None);
        cache.insert(b"past".to_vec(), now);
        assert_eq!(
            cache.check(b"past"),
            None,
            "a deadline already gone is not cached"
        );
    }
}
