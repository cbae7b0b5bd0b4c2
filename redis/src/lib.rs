//! The Redis backend of [`tower-pinned-window`](tower_pinned_window): counters
//! shared by every instance of a service, in Redis, a Redis Cluster (feature
//! `cluster`) or Redis behind Sentinel (feature `sentinel`).
//!
//! Built only on what `tower-pinned-window` makes public for any store
//! author: its [`Backend`], [`Spending`], [`Leasing`] and [`Heeding`]
//! traits and its
//! [`toolkit`](tower_pinned_window::backend::toolkit) (the storage-key
//! codec, the deny cache, the batched future). [`RedisBackend`] documents
//! the backend, with an example; the guide is
//! [`docs/redis.md`](https://docs.rs/tower-pinned-window/latest/tower_pinned_window/guide/redis/index.html).
//!
//! The backend's public types are here, and wire its parts together, each a
//! module of its own:
//!
//! - `builder`: the backend's settings ([`RedisBackendBuilder`]) and their
//!   defaults (the backend is put together from them here);
//! - `script`: the Lua scripts (the `.lua` files beside this module) and the
//!   one runner of them all, `EVALSHA` then `EVAL` when the server has lost
//!   the script;
//! - `reply`: what the scripts answer, read and checked;
//! - `coalesce`: the lanes that send the requests issued together in one
//!   call, and what goes through them: `hits`, `spends` (spends and
//!   amends), `takes` (takes and give-backs of slots in flight) and
//!   `take_alls` (a slot and a request's counters in one step);
//! - `leases`: the slots of requests in flight ([`Leasing`]): a script call
//!   per step, and the extends;
//! - [`connection`]: the connections a user builds (made at once, in the
//!   background, to a Cluster, through Sentinel) and, inside, the nodes of a
//!   deployment, Cluster hash slots, the connection wrapper every command
//!   goes through, and the circuit breaker with its slot map and Cluster
//!   watcher;
//! - `audit`: the backstop that finds counters (and records of slots)
//!   without a lifetime.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The features, rendered from the `##` comments of Cargo.toml's [features].
#![cfg_attr(
    feature = "document-features",
    doc = concat!("# Features\n\n", document_features::document_features!())
)]

mod amends;
mod audit;
mod builder;
mod coalesce;
pub mod connection;
mod heeds;
mod hits;
mod leases;
mod limits;
mod lost;
mod reply;
mod script;
mod spends;
mod take_alls;
mod takes;

/// Entry points for the fuzz targets in the repository's `fuzz/`
/// (cargo-fuzz builds with `--cfg fuzzing`): thin wrappers around the reply
/// parsers. Not part of the API, never built otherwise.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    use tower_pinned_window::backend::{BackendError, Hit, Taken};

    /// The hit script's reply, read as the backend reads it.
    pub fn hit_reply(value: redis::Value, key: &[u8]) -> Result<Hit, BackendError> {
        crate::reply::fuzzing::hit(value, key)
    }

    /// The amend script's reply for one amend (a refund): its answer, or
    /// the reply back when it is not of the script's shape.
    pub fn refund_reply(
        value: redis::Value,
        key: &[u8],
    ) -> Result<Result<bool, BackendError>, redis::Value> {
        crate::reply::fuzzing::refund(value, key)
    }

    /// The spend script's reply for requests of `sizes` counters: per
    /// request, each counter's hit and whether it is full, or `None` for a
    /// corrupt counter or refused arguments; the reply back when it is not
    /// of the script's shape.
    #[allow(clippy::type_complexity)]
    pub fn spend_reply(
        value: redis::Value,
        sizes: &[usize],
    ) -> Result<Vec<Option<Vec<(Hit, bool)>>>, redis::Value> {
        crate::reply::fuzzing::spend(value, sizes)
    }

    /// The take-all script's reply for requests of `sizes` counters: per
    /// request, the cap's answer (`None` when the counters refused) and
    /// each counter's hit and whether it is full, or `None` for a corrupt
    /// record or counter or refused arguments; the reply back when it is
    /// not of the script's shape.
    #[allow(clippy::type_complexity)]
    pub fn take_all_reply(
        value: redis::Value,
        sizes: &[usize],
    ) -> Result<Vec<Option<(Option<Taken>, Vec<(Hit, bool)>)>>, redis::Value> {
        crate::reply::fuzzing::take_all(value, sizes)
    }

    /// The peek script's reply.
    pub fn peek_reply(value: redis::Value, key: &[u8]) -> Result<Option<Hit>, BackendError> {
        crate::reply::fuzzing::peek(value, key)
    }

    /// The close script's reply on the counter `key`: the lockout's time
    /// left.
    pub fn close_reply(
        value: redis::Value,
        key: &[u8],
    ) -> Result<std::time::Duration, BackendError> {
        crate::reply::parse_close(value, key)
    }

    /// The raise script's reply on the counter `key`: the counter after the
    /// step.
    pub fn raise_reply(value: redis::Value, key: &[u8]) -> Result<Hit, BackendError> {
        crate::reply::parse_raise(value, key)
    }

    /// The batch script's reply for `entries` (storage key, window, hits).
    #[allow(clippy::type_complexity)]
    pub fn batch_reply(
        reply: redis::Value,
        entries: &[(&[u8], u64, u64)],
    ) -> Result<Vec<Result<Hit, BackendError>>, redis::Value> {
        crate::reply::fuzzing::batch(reply, entries)
    }

    /// The take script's reply on the record `record`.
    pub fn take_reply(value: redis::Value, record: &[u8]) -> Result<Taken, BackendError> {
        crate::reply::fuzzing::take(value, record)
    }

    /// The give-back script's reply on the record `record`.
    pub fn give_back_reply(value: redis::Value, record: &[u8]) -> Result<bool, BackendError> {
        crate::reply::fuzzing::give_back(value, record)
    }

    /// The in-use script's reply on the record `record`.
    pub fn in_use_reply(value: redis::Value, record: &[u8]) -> Result<u64, BackendError> {
        crate::reply::fuzzing::in_use(value, record)
    }

    /// The extend script's reply for a call on `records` records, the
    /// first `first`: the slots extended, and the places (from 0) of the
    /// records skipped as corrupt.
    pub fn extend_reply(
        value: redis::Value,
        records: usize,
        first: &[u8],
    ) -> Result<(u64, Vec<usize>), BackendError> {
        crate::reply::fuzzing::extend(value, records, first)
    }

    /// The slots' batch script's reply for steps on `record`, each a take
    /// (`true`) or a give-back: a result per step (a give-back's
    /// `granted` whether the slot was there), or the reply back when it is
    /// not of the script's shape.
    #[allow(clippy::type_complexity)]
    pub fn slots_batch_reply(
        value: redis::Value,
        takes: &[bool],
        record: &[u8],
    ) -> Result<Vec<Result<Taken, BackendError>>, redis::Value> {
        crate::reply::fuzzing::slots_batch(value, takes, record)
    }
}

pub use self::builder::{
    DEFAULT_DENY_CACHE, DEFAULT_DENY_CACHE_RECHECK, DEFAULT_PREFIX, RedisBackendBuilder,
};
pub use connection::breaker::{DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES};

/// The `redis` crate this crate is built with, so that connections and
/// configuration types you pass to [`RedisBackend`] come from the same
/// version: `use tower_pinned_window_redis::redis;` instead of a `redis`
/// dependency of your own (or one pinned to the same version).
pub use redis;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager};
use futures_util::future::join_all;

use self::amends::{AmendWork, Forget};
use self::coalesce::{Batcher, Enqueued, Work};
use self::connection::breaker::Breakers;
use self::connection::classify::unavailable;
use self::connection::guarded::Guarded;
use self::connection::{BackgroundConnection, ConnectError, Nodes};
use self::hits::HitWork;
use self::reply::{parse_hit, parse_peek};
use self::script::{HIT, PEEK, RESET, Size};
use self::spends::SpendWork;
use self::take_alls::TakeAllWork;
use self::takes::SlotWork;
use tower_pinned_window::ConfigError;
use tower_pinned_window::Quota;
use tower_pinned_window::Window;
use tower_pinned_window::backend::toolkit::{BackendFuture, Denials, Denied, storage_key};
use tower_pinned_window::backend::{
    Amend, AuditReport, Backend, BackendError, Cap, Counter, Heeding, Held, Hit, Hits, Leasing,
    LimitScope, Limits, SlotId, Spend, Spending, StoredLimits, Taken,
};
use tower_pinned_window::key::Key;

/// Counters in Redis or Redis Cluster, shared by every instance of a service.
///
/// Every hit is **one atomic script step**, and hits in flight together
/// share a round trip ([coalesced hits](#coalesced-hits), the default): the
/// script increments the counter and attaches the window's lifetime in the
/// same atomic step when the counter has none, and never touches an existing
/// lifetime. When Redis has lost the script (`NOSCRIPT` after a restart,
/// `SCRIPT FLUSH` or a failover), the call is sent again once with `EVAL`,
/// which also loads it again. On a Redis Cluster a call names keys of one
/// slot only.
///
/// Any async Redis connection that can be cloned serves: a
/// [`ConnectionManager`] (what
/// [`connect`](RedisBackend::connect) makes; it reconnects by itself), a
/// [`BackgroundConnection`] (what
/// [`connect_in_background`](RedisBackend::connect_in_background) makes), a
/// `MultiplexedConnection`, or a Cluster connection (feature
/// `cluster`; `connect_cluster` makes one). Concurrent hits share the
/// connection and are pipelined on it; no hit opens a connection of its own.
/// Use the [`redis`] crate this crate re-exports to make your
/// own.
///
/// # Examples
///
/// A layer whose counters are in Redis. [`connect_in_background`](Self::connect_in_background)
/// returns at once, and connects on the runtime that serves requests (here
/// there is none, so it never does):
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window_redis::{DEFAULT_PREFIX, RedisBackend};
/// use tower_pinned_window::key::{Key, ClientIp};
/// use tower_pinned_window::{Quota, RateLimitLayer};
///
/// let backend = RedisBackend::connect_in_background("redis://127.0.0.1:6379/")?;
/// assert_eq!(DEFAULT_PREFIX, "tpw:");
/// assert_eq!(
///     backend.storage_key("api", &Key::new("203.0.113.7")),
///     b"tpw:api{203.0.113.7}"
/// );
/// assert!(!backend.connection().is_connected());
/// let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60))?)
///     .key(ClientIp::new())
///     .backend(backend);
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Outages
///
/// The layer times every backend call (its
/// [`timeout`](tower_pinned_window::RateLimitLayer::timeout)) and applies its
/// [`FailurePolicy`](tower_pinned_window::FailurePolicy) to what fails. The connections
/// this crate makes have the `redis` client's own response timeout turned
/// off, so a hit arms one timer; turn it off in a connection of your own
/// too ([`connection_manager_config`](connection::connection_manager_config), or
/// `AsyncConnectionConfig::set_response_timeout(None)`).
///
/// A circuit breaker (on by default; see
/// [`RedisBackendBuilder::breaker`]) remembers that Redis is down: after
/// repeated failures, hits fail at once with [`BackendError::CircuitOpen`],
/// and one probe at a time goes through, soon after it opened and less
/// often while probes keep failing. On a Cluster there is one breaker per
/// master, so a master that fails over does not stop the other masters'
/// keys, and the Cluster's own refusals (`CLUSTERDOWN`, `TRYAGAIN`,
/// `MASTERDOWN`) open none: a hit so refused fails with
/// [`BackendError::ClusterDown`], within the layer's default timeout on a
/// connection made with `cluster_client_builder`'s settings (feature
/// `cluster`).
///
/// Redis replicates asynchronously: a failover loses the hits its master
/// had not sent to the promoted replica, and a master frozen until it was
/// deposed can admit hits when it wakes, before it learns it was deposed.
/// [`RedisBackendBuilder::wait_for_replicas`] counts a write only once
/// replicas hold it.
///
/// # Coalesced hits
///
/// A hit that finds no call in flight goes at once, in a call of its own: no
/// hit waits for a timer to fill a batch. Hits issued while a call is in
/// flight queue, and go together in the next call, sent as soon as the
/// answer is back (or at once, beside the call in flight, once as many
/// requests queue as that call carries, 32 at most: at most two calls in
/// flight, so under load Redis does not wait for the client between calls):
/// one `EVALSHA` of a batch script for all of them. n hits on
/// one counter are one `INCRBY n`, with the lifetime attached in the same
/// atomic step when the counter is created; they take the counts
/// `c-n+1 ..= c`, exactly what n separate increments would have given, and
/// each hit gets its own count, the counter's time left and its deadline
/// (`PEXPIRETIME`, for [`refund`](Backend::refund)). Hits on one key with
/// different windows (two layers of one name with other quotas) are applied
/// in turn, as if sent one after the other. On a standalone server (or
/// Sentinel) any keys share a call; on a Cluster, keys of one hash slot (every
/// counter of one request key is in one slot). A Cluster connection is known
/// by its type; another connection type that reaches a Cluster is found out
/// by the first call Redis refuses as cross-slot (refused before it ran), and
/// its hits are then grouped by slot.
///
/// Inside a call each counter answers for itself: a corrupt counter fails
/// only the hits on it (their requests are stopped; the value is left as it
/// was), and the other counters of the call are counted. A call that fails
/// as a whole (an outage) fails each of its hits, and each request follows
/// the failure policy. A dropped request never leaves a half-done call: the
/// script ran whole or not at all, and the call goes on for the requests
/// still waiting (the dropped one only loses its answer). A hit whose request
/// is dropped before its call is sent is not sent; when every request of a
/// call in flight is gone, the call is dropped too, as a lone hit's would be.
/// Outside a tokio runtime, each counter hit is one `EVALSHA` of the hit
/// script (`hit.lua` in the source).
///
/// # Keys
///
/// A counter's key is the prefix (`tpw:` by default), the counter's
/// namespace, and the request's key between braces, both escaped (printable
/// ASCII but `%`, `{` and `}` as it is, every other byte `%` and two hex
/// digits; see [storage keys](tower_pinned_window::backend#storage-keys)): `tpw:api{203.0.113.7}`,
/// `tpw:api:100/86400000ms{203.0.113.7}` for the same layer's `also` quota.
/// No two (namespace, key) pairs share a Redis key, whatever bytes a client
/// sends. On a Cluster the braces are the hash tag, placed by this crate
/// around the escaped key: a client cannot choose a slot, and every counter
/// of one key is in one slot. [`storage_key`](Self::storage_key) gives the
/// key of a counter.
///
/// Beside a counter, in its slot, markers may live, each named by the
/// counter's key and a suffix, so never a counter's key (which always ends
/// with `}`): `tpw:login{203.0.113.7}:lost:` and 32 hex digits, a spend
/// call's answers, for 5 s (see [spends](#spends)); `tpw:login{203.0.113.7}:lock`,
/// a lockout ([`Spend::block`]), created with its lifetime in the step that
/// denied (or by [`Heeding::close`], the provider's word), never extended
/// by a spend, moved later only by a close, and deleted by
/// [`reset`](Backend::reset); and
/// `tpw:login{203.0.113.7}:reset`, left by a reset (or an
/// [`Amend::Clear`]) until the deleted window's deadline, so that a window
/// opened after it is never amended for a hit of the deleted one. The
/// slots of the key's requests in flight live beside them too, in
/// `tpw:login{203.0.113.7}:slots` (see [requests in flight](#requests-in-flight)),
/// never touched by a counter's steps, nor a counter by theirs. Counters
/// themselves are stored as before this release (a decimal integer with a
/// lifetime), so counters written by an older release, during a rolling
/// upgrade, are counted, expire and are refunded as before.
///
/// # Spends
///
/// [`spend_all`](Spending::spend_all) (costs, a window opened for a charge,
/// lockouts) and [`amend`](Spending::amend) (refunds, charges, clears) are
/// coalesced as hits are, each kind in lanes of its own: the spends issued
/// while a call is in flight go together in the next call of the spend
/// script, the amends in the next call of the amend script. The script
/// applies a call's requests in order, each all or nothing over its own
/// counters and seeing them as the requests before it left them, exactly as
/// if each had been its own call: the admitted costs of a key never pass
/// its limit, and add up to its stored count. A corrupt counter answers
/// only the requests on it. A call cut by a dropped connection or a
/// failover is never sent again by the backend, so each of its requests
/// was counted once or not at all, and follows the failure policy. A spend
/// Redis counted but whose answer was lost (the connection dropped after
/// the call ran, the layer's timeout) is given back: the script writes each
/// call's answers to a marker beside its first counter (`…}:lost:` and an
/// id, a 5 s lifetime), in the same atomic step, and the backend takes it
/// (`GETDEL`) once Redis answers again, and refunds what the call admitted,
/// each counter only in its own window (see the guarantees guide, "A
/// refused request keeps no cost", for the bounds).
///
/// The local deny cache answers a spend too, once Redis has denied one of
/// its counters that no spend can fit until a deadline: at its limit (so a
/// check of cost 0 is refused as well) until its window closes, or locked
/// out until the lockout's end (each for at most the recheck bound when the
/// counter [lowers](Counter::lowers), see below). A denial only because the
/// cost is larger than what is left is not remembered. A lockout lives in Redis, for every instance, set
/// by the denial that first reached it: a spend that would lock a counter
/// out is answered locally only by a lockout, and one merely at its limit
/// goes to Redis, which locks it out. A refund or charge after a
/// [`reset`](Backend::reset) never reaches the window opened after it; when
/// that new window opened in the same millisecond as the deleted one had
/// (so it closes in the same millisecond), its own hits are not refunded or
/// charged either: Redis cannot tell them from the deleted window's, and
/// the hit stays counted.
///
/// # Requests in flight
///
/// [`Leasing`] (a cap on the requests in flight per key, each holding a
/// slot on a lease) keeps a key's slots in a **sorted set** beside its
/// counters, in their hash slot: `tpw:api{203.0.113.7}:slots`. Each member
/// is a slot's name (its [`SlotId`]'s 32 lowercase hex digits), scored by
/// the end of its lease in Unix milliseconds on **the Redis server's
/// clock** (`TIME`, read in the script), so instances whose clocks differ
/// agree on when a lease runs out. Each step is one script call, one
/// atomic step: a take drops the leases that ran out, then adds the slot
/// when fewer than the cap are live; a give-back removes it; an extend
/// moves each slot still live to the new lease's end, and never adds one
/// that is gone; a count (`in_use`) reads the live ones.
///
/// **The record always has a lifetime, at least its latest lease**: the
/// take that adds a slot sets it in the same step (`PEXPIREAT` when the
/// record has none, raised when it would end sooner, never shortened), and
/// so does an extend. Slots of a holder that died are gone a lease later,
/// and so is the record once its last lease runs out. [`audit`](Self::audit)
/// reports a record found without one.
///
/// A record that is not of this shape (a key of another type, or a member
/// that is not a slot's name) is **corrupt**: a take, a give-back or a
/// count on its key fails with [`BackendError::Corrupt`] naming the record,
/// and the record is left exactly as it was; an extend skips it (logged at
/// warn, not counted) and extends the other records of its call. Every step
/// reads the whole record to check it, which is cheap for the caps this is
/// for (a few slots, plus those whose lease ran out since the key's last
/// take).
///
/// **Takes and give-backs are coalesced** (the default), as hits are, in
/// lanes of their own that carry both: the takes and give-backs issued
/// while a call is in flight go together in the next call of one batch
/// script (`slots_batch.lua`), which makes each step exactly as the take or
/// give-back script (`take.lua`, `give_back.lua`) makes it alone, in the
/// order they came; a corrupt record refuses only its own steps. So a
/// request's take and its give-back cost a share of a call each, and under
/// load the slot a request gives back rides with the takes of those that
/// begin. A step that finds no call in flight goes at once, in a call of
/// its own script. [`release`](Leasing::release), the give-back the layer
/// makes when a request ends, joins its lane at once with nobody waiting
/// for it: no task of its own (an idle lane starts its driver), never
/// withdrawn, never sent again when its call fails (its lease frees the
/// slot, which by then may be another request's). A call cut by a dropped
/// connection is never sent again either: each take in it was made once or
/// not at all, and one made whose answer was lost is given back by its
/// name, or asked again with the same [`SlotId`], which is granted without
/// taking two. With `coalesce(false)`, each step is one call of its own
/// script. A [`take_all`](Leasing::take_all) (a slot and the request's
/// counters together) is one call of its own script (`take_all.lua`) on
/// the record and the counters, which share the key's hash tag, coalesced
/// or not: take-alls share calls in lanes of their own, each made as if
/// sent alone. A count is one call on the key's master. An extend names the
/// slots of many keys: one call for all of them on a standalone server or
/// Sentinel, one call per hash slot on a Cluster, sent together; a
/// connection not known as a Cluster learns it from the first extend Redis
/// refuses as cross-slot, which ran nothing.
///
/// # Requirements
///
/// Redis 7.0 or later for [`refund`](Backend::refund),
/// [`amend`](Spending::amend), [`spend_all`](Spending::spend_all) and
/// [`Leasing`], which use `PEXPIRETIME`; hits need only Redis 6.0 (on 6.x they carry no
/// deadline and are never refunded: the hit stays counted). Tested against
/// 7.0. An ACL user needs `+evalsha +eval +incr +incrby +decr +decrby +pttl
/// +pexpire +pexpireat +pexpiretime +time +type +get` for hits and refunds,
/// `+zadd +zrem +zrange +zremrangebyscore +zscore +zcard +zcount` for slots
/// in flight (a [`take_all`](Leasing::take_all) needs those and its hits'
/// or spend's),
/// `+set` for spends, amends, resets and [`Heeding`], `+getdel` for spends (a lost
/// reply's give-back), `+del` for
/// [`reset`](Backend::reset) and [`Amend::Clear`], and `+scan` for [`audit`](Self::audit) (plus
/// `+cluster|slots` on a Cluster, and `+cluster|info` for the breakers to
/// see the Cluster whole again), all on the prefix's keys (`~tpw:*`), and
/// `+wait` with [`RedisBackendBuilder::wait_for_replicas`].
///
/// # The local deny cache
///
/// Once Redis denies a counter, this instance remembers it and denies
/// further hits (and spends) on it here, with no round trip. How long
/// depends on whether its count can go down:
///
/// - A counter whose count only goes up is held until its window closes
///   (or its lockout ends). This is exact because the window is pinned: its
///   deadline cannot move. The deadline is measured from when the hit was
///   sent, so it never outlasts the window in Redis.
/// - A counter that [lowers](Counter::lowers) (its layer has a `reserve`,
///   a `count_if` or a `reset_if`; a `BudgetLayer` has a `reserve`) may be
///   freed at any moment by a settle, refund or clear on another instance,
///   so it is held at most
///   [`deny_cache_recheck`](RedisBackendBuilder::deny_cache_recheck)
///   (default [`DEFAULT_DENY_CACHE_RECHECK`]) from when the denied request
///   was sent, never past its window or lockout. No instance then denies a
///   request here that Redis has room for for longer than that bound and a
///   round trip ([`docs/guarantees.md`](https://docs.rs/tower-pinned-window/latest/tower_pinned_window/guide/guarantees/index.html)).
///
/// Such denials report a count of `limit + 1` (a spend's: the limit plus
/// its cost on that counter, as the [spend contract](tower_pinned_window::backend#costs-lockouts-and-amends)
/// says) and no [deadline](Hit::deadline): they were not counted in Redis, so they are
/// never refunded. An amend, a [`refund`](Backend::refund) or a
/// [`reset`](Backend::reset) clears this instance's cache for the key. The
/// trade-off left is a `reset` or `refund` your own code calls on a counter
/// that does not lower: other instances keep denying it until the window
/// they cached closes. Turn the cache off with
/// [`deny_cache(0)`](RedisBackendBuilder::deny_cache) where those must take
/// effect everywhere at once.
pub struct RedisBackend<C> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    /// The connection behind the breaker.
    connection: Guarded<C>,
    prefix: Box<[u8]>,
    /// Shared with the futures of queued hits, which remember denials.
    deny: Option<Arc<Denials>>,
    /// The lanes of coalesced hits, spends and amends (on clones of the
    /// same connection); `None` with `coalesce(false)`.
    lanes: Option<Lanes<C>>,
    /// An extend's records go in one call per hash slot: a Cluster
    /// connection (known from its type, or learnt from a `CROSSSLOT`
    /// refusal, as the lanes learn it).
    extends_by_slot: AtomicBool,
}

/// The lanes of each kind of request: a call carries one kind (takes and
/// give-backs of slots are one kind).
struct Lanes<C> {
    hits: Arc<Batcher<C, HitWork>>,
    spends: Arc<Batcher<C, SpendWork>>,
    amends: Arc<Batcher<C, AmendWork>>,
    slots: Arc<Batcher<C, SlotWork>>,
    /// A slot and its request's counters in one step: lanes of their own,
    /// since their answer is the counters' hits.
    take_alls: Arc<Batcher<C, TakeAllWork>>,
}

impl<C: Clone> Lanes<C> {
    fn new(connection: &Guarded<C>, cluster: bool) -> Self {
        Self {
            hits: Arc::new(Batcher::new(connection.clone(), cluster)),
            spends: Arc::new(Batcher::new(connection.clone(), cluster)),
            amends: Arc::new(Batcher::new(connection.clone(), cluster)),
            slots: Arc::new(Batcher::new(connection.clone(), cluster)),
            take_alls: Arc::new(Batcher::new(connection.clone(), cluster)),
        }
    }
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
                &self.inner.deny.as_ref().map_or(0, |d| d.capacity()),
            )
            .field("coalesce", &self.inner.lanes.is_some())
            .finish_non_exhaustive()
    }
}

// The builder's file holds the settings; the backend is put together here,
// beside the state it is made of.
impl<C> RedisBackendBuilder<C> {
    /// The backend.
    ///
    /// Example: [`RedisBackendBuilder`].
    pub fn build(self) -> RedisBackend<C>
    where
        C: Clone + 'static,
    {
        // Known from the connection's type. Another connection type that
        // turns out to reach a Cluster is found out by the first call Redis
        // refuses as cross-slot, and its hits are then grouped by slot.
        #[cfg(feature = "cluster")]
        let cluster = is_cluster::<C>();
        #[cfg(not(feature = "cluster"))]
        let cluster = false;
        // A Sentinel connection tells the breakers when it has found a
        // master, so that one opened during a failover probes at once.
        #[cfg(feature = "sentinel")]
        let found = (&self.connection as &dyn std::any::Any)
            .downcast_ref::<connection::sentinel::SentinelConnection>()
            .map(connection::sentinel::SentinelConnection::masters_found);
        #[cfg(not(feature = "sentinel"))]
        let found = None;
        let connection = Guarded::new(
            self.connection,
            self.breaker
                .map(|config| Arc::new(Breakers::new(config, cluster, found))),
            self.acks,
        );
        RedisBackend {
            inner: Arc::new(Inner {
                lanes: self.coalesce.then(|| Lanes::new(&connection, cluster)),
                extends_by_slot: AtomicBool::new(cluster),
                connection,
                prefix: self.prefix.into(),
                deny: (self.deny_cache > 0)
                    .then(|| Arc::new(Denials::new(self.deny_cache, self.deny_cache_recheck))),
            }),
        }
    }
}

/// Whether `C` is the Redis Cluster connection (its breakers go by master).
#[cfg(feature = "cluster")]
fn is_cluster<C: 'static>() -> bool {
    let c = std::any::TypeId::of::<C>();
    c == std::any::TypeId::of::<::redis::cluster_async::ClusterConnection>()
        || c == std::any::TypeId::of::<
            ::redis::cluster_async::ClusterConnection<connection::ClusterNode>,
        >()
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A backend on `connection`, with the default prefix and deny cache.
    ///
    /// Example: [`connection_manager_config`](connection::connection_manager_config)'s.
    pub fn new(connection: C) -> Self {
        Self::builder(connection).build()
    }

    /// Choose the prefix and the deny cache.
    ///
    /// Example: [`RedisBackendBuilder`].
    pub fn builder(connection: C) -> RedisBackendBuilder<C> {
        RedisBackendBuilder::new(connection)
    }

    /// The Redis key that holds `key`'s counter for the namespace
    /// `namespace` (a layer's name, or `name:LIMIT/WINDOWms` for its other
    /// quotas): the crate's one storage-key encoding (see [keys](RedisBackend#keys))
    /// under this backend's prefix.
    ///
    /// Example: [`RedisBackend`].
    pub fn storage_key(&self, namespace: &str, key: &Key) -> Vec<u8> {
        storage_key::encode(&self.inner.prefix, namespace, key)
    }

    /// The connection the backend uses (without its breaker).
    ///
    /// Example: [`RedisBackend`].
    pub fn connection(&self) -> &C {
        self.inner.connection.unguarded()
    }
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
    /// [`AuditReport::corrupt`] and never touched. The report names each key
    /// as [`BackendError::Corrupt`] does.
    ///
    /// A layer's limits (a key with no brace ending `:limits`, see
    /// [`Limits`]) live until
    /// removed: scanned, never reported, never touched.
    ///
    /// A record of slots in flight (a key ending `}:slots`, see
    /// [requests in flight](RedisBackend#requests-in-flight)) found without
    /// a lifetime is reported in [`AuditReport::without_lifetime`] (a leak:
    /// the contract says it always has one) and, with `repair`, given a
    /// lifetime until the later of the window's end and its latest lease's,
    /// so no live slot is lost; its slots are left as they are. One that is
    /// not of a record's shape (another type, a member that is not a slot)
    /// is reported as corrupt and never touched.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when a node cannot be scanned.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_pinned_window::Window;
    /// use tower_pinned_window_redis::RedisBackend;
    ///
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379/").await?;
    /// // Report only:
    /// let report = backend.audit(None).await?;
    /// println!("{} keys without a lifetime", report.without_lifetime.len());
    /// // Or give each such counter a window of an hour:
    /// let report = backend
    ///     .audit(Some(Window::new(Duration::from_secs(3600))?))
    ///     .await?;
    /// assert!(report.repaired.len() <= report.without_lifetime.len());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn audit(&self, repair: Option<Window>) -> Result<AuditReport, BackendError> {
        audit::run(self.connection().clone(), &self.inner.prefix, repair).await
    }
}

impl RedisBackend<ConnectionManager> {
    /// Connect to the Redis at `url` (`redis://host:port/db`) through a
    /// [`ConnectionManager`], which reconnects by itself after an outage;
    /// waits until the first connection is up. It has no response timeout
    /// of its own ([`connection_manager_config`](connection::connection_manager_config)).
    ///
    /// To start while Redis may be down, use
    /// [`connect_in_background`](RedisBackend::connect_in_background).
    ///
    /// # Errors
    /// [`ConnectError::Config`] ([`ConfigError::InvalidUrl`]) when the URL is
    /// invalid; [`ConnectError::Unavailable`] when the first connection
    /// fails after the client's retries (about 2 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_pinned_window_redis::RedisBackend;
    ///
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379/").await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Ok(Self::new(
            connection::connect::connection_manager(url).await?,
        ))
    }
}

impl RedisBackend<BackgroundConnection> {
    /// A backend on the Redis at `url` that returns at once and connects in
    /// the background.
    ///
    /// Until the first connection is up, every hit fails at once with
    /// [`BackendError::Unavailable`], which the layer's
    /// [`FailurePolicy`](tower_pinned_window::FailurePolicy) turns into a pass (fail-open)
    /// or a 503 (fail-closed); the breaker then answers
    /// [`BackendError::CircuitOpen`]. Attempts are made every 100 ms or so,
    /// and hits are counted from the first one that succeeds. After that the
    /// connection is a [`ConnectionManager`] with
    /// [`connection_manager_config`](connection::connection_manager_config), which reconnects by itself.
    ///
    /// The attempts start at once inside a Tokio runtime, otherwise on the
    /// first command; they stop when the last clone of the backend is
    /// dropped.
    ///
    /// # Errors
    /// [`ConfigError::InvalidUrl`] when `url` is not a Redis URL: the only
    /// error, since nothing is reached here.
    ///
    /// Example: [`RedisBackend`].
    pub fn connect_in_background(url: &str) -> Result<Self, ConfigError> {
        Ok(Self::new(BackgroundConnection::to(url)?))
    }
}

#[cfg(feature = "cluster")]
impl RedisBackend<::redis::cluster_async::ClusterConnection<connection::ClusterNode>> {
    /// Connect to the Redis Cluster that `nodes` belong to, with
    /// [`cluster_client_builder`](connection::cluster_client_builder)'s settings; waits until the slot map is
    /// known. There is one breaker per master (see
    /// [`RedisBackendBuilder::breaker`]).
    ///
    /// It then reads `cluster-require-full-coverage` (`CONFIG GET`, on one
    /// node, for at most 250 ms; a refused or renamed `CONFIG` is passed
    /// over, at debug level) and logs one warning when it is `yes`: in a
    /// failover, every master then refuses every key until the failed
    /// master's replica is promoted (see [`docs/redis.md`](https://docs.rs/tower-pinned-window/latest/tower_pinned_window/guide/redis/index.html)).
    ///
    /// # Errors
    /// [`ConnectError::Config`] when a URL is invalid;
    /// [`ConnectError::Unavailable`] when no node answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_pinned_window_redis::RedisBackend;
    ///
    /// let backend = RedisBackend::connect_cluster([
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    /// ])
    /// .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_cluster<I, T>(nodes: I) -> Result<Self, ConnectError>
    where
        I: IntoIterator<Item = T>,
        T: ::redis::IntoConnectionInfo,
    {
        Ok(Self::new(
            connection::connect::cluster_connection(nodes).await?,
        ))
    }
}

impl<C> Backend for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Future = BackendFuture<Hits>;
    type Refund = BackendFuture<bool>;

    /// Coalesced (the default): every counter of the request in the next
    /// call of the key's lane (see [coalesced hits](RedisBackend#coalesced-hits)).
    /// They join the lane when `hit_all` is called (on a tokio runtime), not
    /// when the future is first polled: a future dropped before its call is
    /// sent withdraws them, one kept unpolled may still be counted.
    /// Otherwise one `EVALSHA` per counter, all sent at once: on one
    /// connection they are pipelined (one round trip of latency); on a
    /// Cluster they go to the one master that holds the key's slot.
    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> BackendFuture<Hits> {
        // One reading of the clock: for the deny cache, and as the time the
        // hits were sent.
        let now = std::time::Instant::now();
        if let Some(deny) = &self.inner.deny
            && let Some(denied) = BackendFuture::denied(counters, 1, |c| {
                deny.hit(c.namespace, key.as_bytes(), c.quota.limit(), now)
            })
        {
            // Denied here, without a round trip; the counters are not hit.
            return denied;
        }
        let work = HitWork {
            counters: counters
                .iter()
                .map(|c| (self.stored(c.namespace, key), c.quota.window().as_millis()))
                .collect(),
            finish: self.finish(counters, now),
        };
        if let Some(lanes) = &self.inner.lanes
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Coalesced: through the key's lane (a driver task, so only on
            // a tokio runtime).
            return through(&lanes.hits, &runtime, work);
        }
        // One call per counter, sent together.
        let this = self.clone();
        BackendFuture::calling(async move {
            let answers = join_all(work.counters.iter().map(|(k, window)| {
                let this = &this;
                async move {
                    let reply = HIT
                        .run_on_key(&mut this.inner.connection.for_write(k), k, Some(*window))
                        .await
                        .map_err(unavailable)?;
                    parse_hit(reply, k)
                }
            }))
            .await
            .into_iter()
            .collect();
            work.finish.answered(&work.counters, answers)
        })
    }

    /// [`amend`](Spending::amend) with a refund of 1.
    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> BackendFuture<bool> {
        self.amend(namespace, key, hit, Amend::Refund(1))
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        let storage_key = self.storage_key(namespace, key);
        let reply = PEEK
            .run_on_key(
                &mut self.inner.connection.for_key(&storage_key),
                &storage_key,
                None,
            )
            .await
            .map_err(unavailable)?;
        parse_peek(reply, &storage_key)
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        let storage_key = self.storage_key(namespace, key);
        if let Some(deny) = &self.inner.deny {
            deny.forget(namespace, key.as_bytes());
        }
        let lock = storage_key::encode_lockout(&self.inner.prefix, namespace, key);
        let marker = storage_key::encode_reset_marker(&self.inner.prefix, namespace, key);
        let size = Size {
            keys: 3,
            args: 3,
            bytes: storage_key.len() + lock.len() + marker.len(),
        };
        let reply = RESET
            .run(
                &mut self.inner.connection.for_write(&storage_key),
                size,
                |cmd| {
                    cmd.arg(&storage_key).arg(&lock).arg(&marker);
                },
            )
            .await
            .map_err(unavailable)?;
        let deleted = match reply {
            ::redis::Value::Int(n) => n,
            other => {
                return Err(BackendError::Unavailable(
                    format!("unexpected reset reply {other:?}").into(),
                ));
            }
        };
        Ok(deleted > 0)
    }
}

impl<C> Spending for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The spend script on the key's counters and their lockouts (one hash
    /// tag, so one slot of a Cluster): all or nothing, as the
    /// [contract](tower_pinned_window::backend#costs-lockouts-and-amends) says.
    /// Coalesced (the default) with the other spends of the key's lane,
    /// many requests in one call (see [spends](RedisBackend#spends)); the
    /// local deny cache answers a request that has a counter no spend can
    /// fit, and remembers such counters. Needs Redis 7.0 (`PEXPIRETIME`).
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> BackendFuture<Hits> {
        let now = std::time::Instant::now();
        if let Some(deny) = &self.inner.deny
            && let Some(denied) = BackendFuture::denied_spend(counters, spend, |c| {
                deny.spend(
                    c.namespace,
                    key.as_bytes(),
                    c.quota.limit(),
                    now,
                    spend.block.is_some(),
                )
            })
        {
            // Denied here, without a round trip: nothing is spent.
            return denied;
        }
        let work = SpendWork {
            counters: counters
                .iter()
                .map(|c| self.stored(c.namespace, key))
                .collect(),
            spend,
            finish: self.finish(counters, now),
        };
        self.send(self.inner.lanes.as_ref().map(|lanes| &lanes.spends), work)
    }

    /// The amend script, which finds the hit's window by the counter's
    /// `PEXPIRETIME` and the reset marker: a [`reset`](Backend::reset) (or
    /// a clear) leaves a marker until the deleted window's deadline, and no
    /// hit of that deadline is amended while it lives. A window opened
    /// after a reset is so never taken for the one before it, even when
    /// both close in the same millisecond; the price is that a window
    /// opened in the same millisecond as the deleted one was (so with the
    /// same deadline) keeps its own hits counted: they are never refunded
    /// or charged. A hit with no deadline (answered by the deny cache,
    /// denied, or counted on a server older than 7.0) is not sent.
    /// Coalesced (the default) with the other amends of the key's lane.
    /// Once Redis has answered, the key is dropped from this instance's
    /// deny cache, so the next hit asks Redis again.
    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> BackendFuture<bool> {
        let Some(deadline) = hit.deadline else {
            return BackendFuture::answered(Ok(false));
        };
        let work = AmendWork {
            counter: self.stored(namespace, key),
            amend,
            deadline,
            forget: self.inner.deny.as_ref().map(|deny| Forget {
                deny: Arc::clone(deny),
                namespace: namespace.as_bytes().into(),
                key: key.clone(),
            }),
        };
        self.send(self.inner.lanes.as_ref().map(|lanes| &lanes.amends), work)
    }
}

/// Each step is one call of its script (`close.lua`, `raise.lua`) on the
/// key's master, through the backend's breaker (and its `WAIT` in the
/// replica-acknowledged mode), as a [`reset`](Backend::reset) is sent: no
/// lane, since a provider speaks rarely. A close names the counter and its
/// lockout, which share the key's hash tag (one Cluster slot); both steps
/// read the server's clock. Needs Redis 7.0 (`PEXPIRETIME`).
impl<C> Heeding for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The lockout is the one a spend sets and reads (`…}:lock`). Once
    /// Redis has answered, this instance's deny cache holds the lockout
    /// until the end Redis named, so its spends on the counter are refused
    /// here, with the new end, without a round trip; other instances learn
    /// the new end from their next spend that reaches Redis.
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<C> {
        let counter = self.storage_key(namespace, key);
        let lock = storage_key::encode_lockout(&self.inner.prefix, namespace, key);
        let (this, namespace, key) = (self.clone(), namespace.to_owned(), key.clone());
        async move {
            let sent = std::time::Instant::now();
            let left = heeds::close(&this.inner.connection, &counter, &lock, span).await?;
            if let Some(deny) = &this.inner.deny {
                deny.remember(
                    &namespace,
                    key.as_bytes(),
                    sent,
                    left,
                    Denied::Locked,
                    false,
                );
            }
            Ok(left)
        }
    }

    /// A raise never lowers a count, so what this instance's deny cache
    /// holds stays true: it is left as it is.
    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<C> {
        let stored = self.storage_key(counter.namespace, key);
        let raise = heeds::Raise {
            count,
            limit: counter.quota.limit(),
            window: counter.quota.window(),
            within,
        };
        let this = self.clone();
        async move { heeds::raise(&this.inner.connection, &stored, raise).await }
    }
}

/// One Redis hash per layer, at
/// [`storage_key::encode_limits`] (`PREFIX LAYER:limits`: no brace, so it
/// never meets a counter or a marker, and one Cluster slot): fields are
/// scopes ([`encode_scope`](tower_pinned_window::backend::encode_scope)),
/// values limits ([`encode_limit`](tower_pinned_window::backend::encode_limit)).
/// A set is one `HSET` or `HDEL`, a read one `HGETALL`, on the hash's
/// master through the backend's breaker (a set with its `WAIT` in the
/// replica-acknowledged mode). A field whose value is not a limit is left
/// out and counted ([`StoredLimits::corrupt`]); a key of another type (a
/// string `SET` there by hand) fails the read and the set with
/// [`BackendError::Corrupt`], and is left as it is. Never touches a
/// counter.
impl<C> Limits for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn set_limit(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Option<Quota>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'static {
        let hash = storage_key::encode_limits(&self.inner.prefix, layer);
        let field = tower_pinned_window::backend::encode_scope(scope);
        let this = self.clone();
        async move { limits::set(&this.inner.connection, &hash, &field, quota).await }
    }

    fn limits(
        &self,
        layer: &str,
    ) -> impl Future<Output = Result<StoredLimits, BackendError>> + Send + 'static {
        let hash = storage_key::encode_limits(&self.inner.prefix, layer);
        let this = self.clone();
        async move { limits::read(&this.inner.connection, &hash).await }
    }
}

/// Takes and give-backs coalesced (the default) in lanes of their own, as
/// hits are: the steps issued while a call is in flight go together in the
/// next call, each exactly as if sent alone; a step alone, or every step of
/// a backend built with `coalesce(false)`, is one script call on the key's
/// master (see [requests in flight](RedisBackend#requests-in-flight)). A
/// count is one call; an extend is one call for every record on a
/// standalone server or Sentinel, one per hash slot on a Cluster, sent
/// together.
impl<C> Leasing for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Take = BackendFuture<Taken>;

    /// Coalesced (the default): the take joins its key's lane when `take`
    /// is called (on a tokio runtime), not when the future is first
    /// polled: a future dropped before its call is sent withdraws it, one
    /// kept unpolled may still take the slot.
    fn take(&self, key: &Key, cap: Cap<'_>, slot: SlotId) -> BackendFuture<Taken> {
        let record = self.slots_record(cap.namespace, key);
        if let Some(lanes) = &self.inner.lanes
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            return through(
                &lanes.slots,
                &runtime,
                SlotWork::take(record, cap.in_flight, slot),
            );
        }
        let this = self.clone();
        BackendFuture::calling(async move {
            leases::take(&this.inner.connection, &record, cap.in_flight, slot).await
        })
    }

    /// One call of the take-all script (`take_all.lua`) on the key's
    /// record of slots and its counters (and their lockouts, for a spend),
    /// which share the key's hash tag: one atomic step, one round trip.
    /// Coalesced (the default) with the other take-alls of the key's lane,
    /// many steps in one call, each exactly as if sent alone; it joins the
    /// lane when `take_all` is called (on a tokio runtime), as
    /// [`take`](Self::take) does. The local deny cache answers a request
    /// it already denies (nothing counted, no slot taken: `taken` is
    /// `None`), and remembers the counters the answer shows full.
    fn take_all(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<Spend>,
    ) -> BackendFuture<Hits> {
        let now = std::time::Instant::now();
        if let Some(deny) = &self.inner.deny {
            let denied = match spend {
                None => BackendFuture::denied(counters, 1, |c| {
                    deny.hit(c.namespace, key.as_bytes(), c.quota.limit(), now)
                }),
                Some(spend) => BackendFuture::denied_spend(counters, spend, |c| {
                    deny.spend(
                        c.namespace,
                        key.as_bytes(),
                        c.quota.limit(),
                        now,
                        spend.block.is_some(),
                    )
                }),
            };
            if let Some(denied) = denied {
                // Denied here, without a round trip: nothing is counted,
                // and no slot is taken.
                return denied;
            }
        }
        let work = TakeAllWork {
            record: self.slots_record(cap.namespace, key),
            slot,
            in_flight: cap.in_flight,
            counters: counters
                .iter()
                .map(|c| self.stored(c.namespace, key))
                .collect(),
            spend,
            finish: self.finish(counters, now),
        };
        self.send(
            self.inner.lanes.as_ref().map(|lanes| &lanes.take_alls),
            work,
        )
    }

    /// Coalesced (the default) with the takes and give-backs of the key's
    /// lane, as [`take`](Self::take) is.
    fn give_back(
        &self,
        namespace: &str,
        key: &Key,
        slot: SlotId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static + use<C> {
        let record = self.slots_record(namespace, key);
        let queued = match (&self.inner.lanes, tokio::runtime::Handle::try_current()) {
            (Some(lanes), Ok(runtime)) => Ok(through(
                &lanes.slots,
                &runtime,
                SlotWork::give_back(record, slot),
            )),
            _ => Err(record),
        };
        let this = self.clone();
        async move {
            match queued {
                Ok(queued) => queued.await.map(|given| given.granted),
                Err(record) => leases::give_back(&this.inner.connection, &record, slot).await,
            }
        }
    }

    /// Coalesced (the default): the give-back joins its key's lane at once,
    /// with nobody waiting for it and no task of its own, and is sent with
    /// the lane's next call (an idle lane starts its driver, which sends
    /// it). Otherwise one call, on a task of the current tokio runtime.
    /// One that fails is left to the lease, never sent again; with no tokio
    /// runtime, nothing is sent.
    fn release(&self, namespace: &str, key: &Key, slot: SlotId) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(
                "no tokio runtime to give a slot in flight back on: its lease frees it"
            );
            return;
        };
        let record = self.slots_record(namespace, key);
        match &self.inner.lanes {
            Some(lanes) => {
                coalesce::detach(&lanes.slots, &runtime, SlotWork::give_back(record, slot))
            }
            None => {
                let this = self.clone();
                runtime.spawn(async move {
                    if let Err(err) = leases::give_back(&this.inner.connection, &record, slot).await
                    {
                        takes::left_to_the_lease(&err);
                    }
                });
            }
        }
    }

    fn extend(
        &self,
        held: &[Held<'_>],
        lease: Window,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send + 'static + use<C> {
        let mut records = leases::Records::default();
        for h in held {
            records.add(self.record(h.namespace, h.key), h.slot);
        }
        let this = self.clone();
        async move {
            let inner = &this.inner;
            leases::extend(&inner.connection, &inner.extends_by_slot, &records, lease).await
        }
    }

    async fn in_use(&self, namespace: &str, key: &Key) -> Result<u64, BackendError> {
        leases::in_use(&self.inner.connection, &self.record(namespace, key)).await
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The key of the record of `key`'s slots in flight under `namespace`
    /// (`storage_key::encode_slots`: the pair's storage key and `:slots`).
    fn record(&self, namespace: &str, key: &Key) -> Vec<u8> {
        storage_key::encode_slots(&self.inner.prefix, namespace, key)
    }

    /// [`record`](Self::record), inline when it fits (no allocation for
    /// most keys).
    fn slots_record(&self, namespace: &str, key: &Key) -> hits::StoredKey {
        let mut record = self.stored(namespace, key);
        record.extend_from_slice(storage_key::SLOTS);
        record
    }

    /// The storage key of `namespace`'s counter for `key`, inline when it
    /// fits (no allocation for most keys).
    fn stored(&self, namespace: &str, key: &Key) -> hits::StoredKey {
        let mut stored = hits::StoredKey::new();
        storage_key::encode_with(&self.inner.prefix, namespace, key, |bytes| {
            stored.extend_from_slice(bytes)
        });
        stored
    }

    /// What makes a request's hits of its answers: its counters' quotas,
    /// and the deny cache that remembers a denial from `sent` on.
    fn finish(&self, counters: &[Counter<'_>], sent: std::time::Instant) -> hits::Finish {
        hits::Finish {
            quotas: counters
                .iter()
                .map(|c| hits::CounterQuota {
                    quota: c.quota,
                    lowers: c.lowers,
                })
                .collect(),
            deny: self.inner.deny.clone(),
            prefix: self.inner.prefix.len(),
            sent,
        }
    }

    /// `work` through its lane when there is one (and a tokio runtime), else
    /// in a call of its own.
    fn send<W: Work>(
        &self,
        lanes: Option<&Arc<Batcher<C, W>>>,
        work: W,
    ) -> BackendFuture<W::Answer> {
        if let Some(lanes) = lanes
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            return through(lanes, &runtime, work);
        }
        let this = self.clone();
        BackendFuture::calling(async move {
            let mut answers = W::run(&this.inner.connection, std::slice::from_ref(&work))
                .await
                .map_err(unavailable)?;
            answers.pop().unwrap_or_else(|| Err(coalesce::dropped()))
        })
    }
}

/// `work` in its lane of `batcher`.
fn through<C, W>(
    batcher: &Arc<Batcher<C, W>>,
    runtime: &tokio::runtime::Handle,
    work: W,
) -> BackendFuture<W::Answer>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    W: Work,
{
    match coalesce::enqueue(batcher, runtime, work) {
        Enqueued::Queued(answer) => answer,
        Enqueued::Alone(alone) => BackendFuture::calling(alone.send()),
    }
}
