//! Where counters live, behind one contract.
//!
//! # The contract
//!
//! [`Backend::hit`] increments a key's counter and returns the new count and
//! the time left in the key's window, **in one atomic step**: no other hit on
//! the same key, on this process or another, can observe or interleave with a
//! half-done increment.
//!
//! **The lifetime is attached only when the counter is created** (or found
//! without one, which only older code or a crash between two commands can
//! leave behind), **and an existing lifetime is never extended or shortened.**
//! Hits never move a window: it closes a fixed [`Window`] after the hit that
//! opened it, however often the key knocks in between.
//!
//! A counter that does not hold an integer is corrupt state: `hit` fails with
//! [`BackendError::Corrupt`] and leaves the stored value as it is, never
//! resetting it (a reset would hand out free attempts).
//!
//! **A refund takes back one hit, in one atomic step** ([`Backend::refund`]):
//! it never creates a counter or gives one a lifetime, never takes a count
//! below zero, and applies only to the window the hit was counted in, which
//! the hit names by its [deadline](Hit::deadline). Once that window has
//! closed or a new one has opened, a refund does nothing.
//!
//! # Costs, lockouts and amends
//!
//! [`Spending::spend_all`], the second trait's step, is the one atomic step for a request with a
//! [`Spend`]: a cost, a window opened for a charge to come, or a lockout.
//! A spend's cost is per counter: counter `i` is spent `cost_i`
//! ([`Spend::cost_of`]), the spend's `cost` for every counter, except the
//! first when [`Spend::first`] names a unit of its own (a call that spends
//! one request from a requests budget and its tokens from a tokens budget).
//! For each counter, with `c` its count (0 when it has none) and `L` its
//! quota's limit:
//!
//! - a counter under a live lockout does not fit;
//! - otherwise it fits when `c + max(cost_i, 1) <= L`: a cost of 0 is a
//!   check, admitted while the counter is under its limit, as a hit of 1
//!   would be.
//!
//! **All or nothing.** When every counter fits, each one gets its `cost_i`
//! added (a counter it creates gets its quota's window as its lifetime, in
//! the same step; with a `cost_i` of 0 a counter is created, at 0, only
//! when [`Spend::open`] asks for it). When any counter does not fit,
//! nothing is added to any of them: **a denied request spends nothing**.
//! With [`Spend::block`] set, each counter that did not fit and is not yet
//! locked gets a lockout with that lifetime, created in the same step. A
//! spend never extends a lockout: more attempts do not move its end. Only
//! [`Heeding::close`], the provider's word, moves one later (see
//! [the provider's word](self#the-providers-word)).
//!
//! The [`Hits`] report, per counter:
//!
//! - a counter that fits: its count after the step (`c + cost_i`, or `c`
//!   when nothing was added), the time left in its window, and the
//!   window's identity in [`Hit::deadline`] when the counter exists;
//! - a counter that does not fit: `s + max(cost_i, 1)` (saturating), the
//!   count the spend would have made, with `s` what stands in its way: its
//!   count `c`, or, under a lockout (one it had, or one this step set), the
//!   larger of `c` and `L`. That count is above the limit, which says the
//!   counter did not fit, and less `max(cost_i, 1)` it gives what is left,
//!   `L - s` (saturating): what the layer's `RateLimit` header shows on a
//!   denial. With it, the time until it can fit again (the lockout's end
//!   when locked, else its window's end), and `deadline: None`. A local
//!   deny cache that answers for a counter at its limit or locked out
//!   reports `L + max(cost_i, 1)`;
//! - every counter of a denied request: `deadline: None`, since nothing was
//!   counted, so nothing is ever amended.
//!
//! Once the service has answered, [`Spending::amend`] changes the counter a
//! hit was counted in ([`Amend`]): take back a cost, add a response's
//! charge, or clear it. Like a refund, an amend never creates a counter,
//! never gives one a lifetime or changes its lifetime, never takes a count
//! below zero, and applies only to the window named by the hit: a window is
//! named by more than its deadline, so a window opened after a
//! [`reset`](Backend::reset) is never taken for the one before it, even when
//! both close in the same millisecond. A charge may take a count past its
//! limit: later requests are denied until the window closes.
//!
//! [`Backend::reset`] deletes a counter and its lockout.
//!
//! # The provider's word
//!
//! [`Heeding`], the fourth trait, takes a provider's word about an outbound
//! budget: what a [`BudgetLayer`](crate::outbound::BudgetLayer) needs to
//! follow `429`s and rate-limit headers on every instance. Each of its two
//! steps is **one atomic step** on one counter (and, for a close, its
//! lockout), on the store's own clock:
//!
//! - [`Heeding::close`] closes the counter for a `span` from now. Its
//!   **lockout**, the same marker a [`Spend::block`] lockout is, which every
//!   spend already reads in its own atomic step (so honouring a closure
//!   costs no extra store call), is created with the lifetime `span` in the
//!   same step, or, when a live one ends sooner, moved to end `span` from
//!   now. **Deadlines only extend**: a live lockout that ends later is left
//!   as it is, so a later, shorter closure never shortens an earlier one.
//!   The answer is the time left of the lockout after the step. The
//!   counter's count and window are never touched, and no counter is
//!   created. A lockout a spend sets is never extended by more attempts; a
//!   close is the one step that moves a lockout later, and a
//!   [`reset`](Backend::reset) deletes it as any other.
//! - [`Heeding::raise`] raises the counter's count to at least `count`: the
//!   provider says fewer calls remain than the budget thinks. The new count
//!   is `max(c, min(count, L))`, with `c` the count and `L` the quota's
//!   limit: **never past the limit, and never lowered** (a count a charge
//!   took past the limit stays). A live counter keeps its window: its
//!   deadline never moves. A missing counter (or one whose window has
//!   closed) is created at `min(count, L)` with the lifetime
//!   `min(within, window)`, `window` the quota's, set in the same step: the
//!   provider's window resets then; a counter found without a lifetime
//!   (which only older code can leave behind) gets that lifetime too. A
//!   `count` of 0 changes nothing and creates nothing. The answer is the
//!   counter as it stands after the step: a [`Hit`] with its count, its
//!   time left and, when it exists, its [`deadline`](Hit::deadline), the
//!   window's identity as a spend answers it (so an
//!   [amend](Spending::amend) of that window works with it); a missing
//!   counter reads 0, with the lifetime the step would have given it and no
//!   deadline.
//!
//! A counter that is not an integer (or a key of another type), or, for a
//! close, a lockout without a lifetime, is [`BackendError::Corrupt`]: the
//! step writes nothing and leaves it as it is.
//!
//! # Requests in flight
//!
//! [`Leasing`], the third trait, keeps a cap on the requests **in flight**
//! per key ([`InFlight`]), shared by every instance: a request holds a
//! **slot** while it runs. A slot is named by its holder ([`SlotId`]) and
//! exists only with its **lease**, an expiry created with it in the same
//! atomic step, so no slot outlives a holder that died by more than the
//! lease.
//!
//! - [`Leasing::take`], one atomic step: the key's slots whose lease has
//!   run out are dropped; then, when fewer than the cap's `max` are live,
//!   the slot is created with the lease `now + lease` and the key's record
//!   gets a lifetime of at least that lease (never shortened). Otherwise
//!   nothing changes and the take is refused, with the time until the
//!   earliest live lease runs out. Taking a slot the key already holds
//!   changes nothing and is granted: a take retried never takes two.
//! - [`Leasing::give_back`] deletes the slot, one atomic step; it never
//!   creates anything, and a slot given back twice, or one whose lease
//!   ran out, is not found the second time.
//! - [`Leasing::extend`] moves each slot a holder still holds to
//!   `now + lease` and raises its key's lifetime to at least that. A slot
//!   that is gone (given back, or its lease ran out) is **never created
//!   again**: another request may hold its place.
//!
//! A key's record that is not of the store's shape (another type in Redis,
//! a member that is not a slot) is corrupt state, as a counter that is not
//! an integer: [`BackendError::Corrupt`], left as it is. Slots never meet
//! a counter or a lockout, even of the same namespace.
//!
//! ## Quotas and a cap in one step
//!
//! [`Leasing::take_all`] decides a request's slot and its counters in one
//! atomic step, so that neither is spent for a request the other refuses:
//!
//! 1. the key's slots whose lease has run out are dropped;
//! 2. when the key already holds `slot` (a step retried), nothing changes:
//!    the slot is granted and the counters are read, not counted again;
//! 3. when the cap is full, nothing changes: the take is refused, as
//!    [`Leasing::take`] refuses it, and the counters are **read, not
//!    counted** (each [`Hit`] as the counter stands: its count, its time
//!    left, and a `deadline` of `None`; a missing counter reads 0 with its
//!    full window);
//! 4. otherwise the counters are counted as [`Backend::hit_all`] counts
//!    them (`spend` `None`) or as [`Spending::spend_all`] spends (`Some`);
//!    when every hit's count is within its counter's limit, the slot is
//!    created with its lease as [`Leasing::take`] creates it; otherwise **no
//!    slot is taken**.
//!
//! The answer is the counters' [`Hits`] with the cap's answer added by
//! [`Hits::with_taken`] (and read by [`Hits::split_taken`]): `Some` with
//! `granted` for steps 2 and 4 when the slot is held, `Some` refused for
//! step 3, `None` when the counters refused the request in step 4. A corrupt counter or record fails the whole step
//! and changes nothing.
//!
//! They live in a second trait, [`Spending`], as governor adds its extra
//! abilities: a backend that only implements [`Backend`] serves every layer
//! that counts plain hits, and a layer that spends does not compile on it.
//!
//! Backends here:
//!
//! - [`MemoryBackend`], the embedded default: counters in this process;
//! - [`RedisBackend`](https://docs.rs/tower-pinned-window-redis/latest/tower_pinned_window_redis/struct.RedisBackend.html)
//!   (crate `tower-pinned-window-redis`): Redis, Redis Cluster (feature
//!   `cluster`) and Redis behind Sentinel (`sentinel`), shared by every
//!   instance of a service;
//! - [`PostgresBackend`](https://docs.rs/tower-pinned-window-postgres/latest/tower_pinned_window_postgres/struct.PostgresBackend.html)
//!   (crate `tower-pinned-window-postgres`): a PostgreSQL table, shared the
//!   same way.
//!
//! The two remote stores are crates of their own, built only on this
//! module's public contract and its [`toolkit`] (the storage-key codec, the
//! deny cache, the batched future), which a store of your own can use too.
//!
//! [`PrivateKeys`] wraps any of them to store a keyed digest of each key
//! instead of its bytes.
//!
//! A backend of your own is held to the same contract by the
//! `tower-pinned-window-testkit` crate: every scenario, on fresh backends
//! your harness makes, as a test each ([`docs/testing.md`](crate::guide::testing)).
//!
//! # Storage keys
//!
//! A counter is named by a pair: its namespace (the layer's name, or
//! `name:LIMIT/WINDOWms` for a layer's other quotas) and the request's
//! [`Key`]. Two different pairs never share a counter in any backend, whatever
//! bytes a client puts in its key:
//!
//! - the memory backend keeps the pair apart structurally (with the
//!   lengths of the namespace and the key), with no string to build on the
//!   hot path;
//! - PostgreSQL keeps them apart structurally too, in two columns
//!   (`namespace`, `key`), and names a counter in errors and logs by its
//!   canonical storage key;
//! - stores whose keys are byte strings (Redis, or any other later) use one
//!   canonical encoding ([`toolkit::storage_key`]): the prefix, the escaped namespace,
//!   then the escaped key between braces, for example
//!   `tpw:api{203.0.113.7}` and `tpw:api:100/86400000ms{203.0.113.7}`. On a
//!   Redis Cluster the braces make the escaped key the hash tag, chosen by
//!   this crate and never by a client; every counter of one key sits in one
//!   slot.
//!
//! A key longer than [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN) is held as its
//! digest, which is longer than any key kept as it is, so a hashed key and a
//! raw key never meet either. A backend of your own follows the same rule:
//! keep the pair apart structurally, or encode it as this one does (what
//! [`toolkit::storage_key::encode`] gives).

mod audit;
mod expiring;
mod lease;
mod limits;
mod memory;
mod private;
pub mod toolkit;

pub use audit::AuditReport;
pub use lease::{Cap, Held, InFlight, SlotId, Taken};
pub use limits::{LimitScope, Limits, StoredLimits, decode_limit, encode_limit, encode_scope};
pub use memory::{DEFAULT_MAX_KEYS, MAX_SHARDS, MemoryBackend};
pub use private::{MIN_SECRET_LEN, PrivateKeys};

use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::time::Duration;

use crate::key::Key;
use crate::quota::{Quota, Window};

/// The outcome of one hit on one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// The counter after this hit: 1 for the hit that opened the window.
    pub count: u64,
    /// Time left until the window closes and the counter is gone.
    pub reset: Duration,
    /// The deadline of the window this hit was counted in, in the store's
    /// own clock: nanoseconds since the [`MemoryBackend`] was made, the
    /// counter's absolute expiry in Unix milliseconds in Redis
    /// (`PEXPIRETIME`), or its `expires_at` in Unix microseconds in
    /// PostgreSQL. It names the window for [`Backend::refund`] and
    /// [`Spending::amend`]. Two windows of one key that follow each other
    /// close a window apart; a window opened right after a
    /// [`reset`](Backend::reset) could close in the same instant as the
    /// deleted one, so each backend tells them apart by more than this
    /// number: the memory backend moves the new deadline a nanosecond
    /// earlier; Redis and PostgreSQL refuse amends of a deadline while the
    /// reset's marker lives (a key beside the counter in Redis, a row of
    /// the markers' table in PostgreSQL, written in the same step as the
    /// delete and kept until that deadline).
    ///
    /// `None` when nothing was counted in the store for this hit: an answer
    /// from a local cache (the Redis deny cache), a counter the call did not
    /// reach, or a [`peek`](Backend::peek). Such a hit is never refunded.
    pub deadline: Option<NonZeroU64>,
}

pub(crate) use toolkit::refused_count;

/// The deadline that marks the entry [`Hits::with_taken`] adds: no store's
/// window ever ends at it (nanoseconds, or Unix milliseconds or
/// microseconds, all far below).
const TAKEN: NonZeroU64 = NonZeroU64::MAX;

/// A backend could not answer. Which of these a request sees decides its fate:
/// see [`FailurePolicy`](crate::FailurePolicy).
///
/// A request that the layer answers for a backend failure (503 /
/// UNAVAILABLE under [`FailurePolicy::FailClosed`](crate::FailurePolicy),
/// 500 / INTERNAL for corrupt state) carries the error in its response's
/// extensions, where a [`Decision`](crate::Decision) would be: read it with
/// `response.extensions().get::<Arc<BackendError>>()`. The metrics name its
/// kind in the `kind` label ([`kind_name`](Self::kind_name)).
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The store could not be reached or refused the command.
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
    /// The store did not answer within the layer's timeout.
    TimedOut,
    /// The store is full of live counters and will not evict one
    /// (see [`MemoryBackend::max_keys`]).
    AtCapacity,
    /// The store failed repeatedly, and the backend's circuit breaker is
    /// answering at once for a short cool-down instead of waiting on it
    /// (the Redis backend: see
    /// [`RedisBackendBuilder::breaker`](https://docs.rs/tower-pinned-window-redis/latest/tower_pinned_window_redis/struct.RedisBackendBuilder.html#method.breaker)).
    /// An outage like [`Unavailable`](Self::Unavailable): the failure policy
    /// decides.
    CircuitOpen,
    /// The store's node answered, but refused the command for its
    /// Cluster's state: a Redis Cluster answered `CLUSTERDOWN` (no master
    /// serves the key's slot for now: under `cluster-require-full-coverage
    /// yes`, every key from a master's failure until its replica's
    /// promotion), `TRYAGAIN` (the key's slot is being migrated) or
    /// `MASTERDOWN` (a replica cut off from its master), still so after
    /// the client's retries. The detail is the store's answer. Not a slow
    /// or failing store: it opens no circuit breaker, and it is logged and
    /// counted apart (`cluster_down`), but it is an outage like
    /// [`Unavailable`](Self::Unavailable): the failure policy decides
    /// (see [`docs/redis.md`](crate::guide::redis)).
    ClusterDown(Box<dyn std::error::Error + Send + Sync>),
    /// The stored counter is not an integer (or the key holds another type).
    /// The value was left untouched for inspection. Requests on this key are
    /// stopped whatever the failure policy says.
    Corrupt {
        /// The storage key holding the bad value.
        key: String,
        /// What was found there.
        detail: String,
    },
}

impl BackendError {
    /// Whether this is corrupt state rather than an outage.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::Corrupt { .. })
    }

    /// The name of its kind, in snake case: `unavailable`, `timed_out`,
    /// `circuit_open`, `cluster_down`, `at_capacity`, `corrupt`: the
    /// metrics' `kind` label.
    ///
    /// ```
    /// use tower_pinned_window::backend::BackendError;
    ///
    /// let refused = BackendError::ClusterDown("CLUSTERDOWN The cluster is down".into());
    /// assert_eq!(refused.kind_name(), "cluster_down");
    /// assert!(!refused.is_corrupt(), "an outage: the failure policy decides");
    /// ```
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        Self::KIND_NAMES[self.kind_index()]
    }

    /// Every [`kind_name`](Self::kind_name), in [`kind_index`](Self::kind_index)'s order.
    pub(crate) const KIND_NAMES: [&'static str; 6] = [
        "unavailable",
        "timed_out",
        "at_capacity",
        "corrupt",
        "circuit_open",
        "cluster_down",
    ];

    /// Its kind's place in [`KIND_NAMES`](Self::KIND_NAMES).
    pub(crate) fn kind_index(&self) -> usize {
        match self {
            Self::Unavailable(_) => 0,
            Self::TimedOut => 1,
            Self::AtCapacity => 2,
            Self::Corrupt { .. } => 3,
            Self::CircuitOpen => 4,
            Self::ClusterDown(_) => 5,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(err) => write!(f, "rate-limit backend unavailable: {err}"),
            Self::TimedOut => f.write_str("rate-limit backend timed out"),
            Self::CircuitOpen => {
                f.write_str("rate-limit backend failed repeatedly: circuit open, not waiting on it")
            }
            Self::ClusterDown(err) => write!(
                f,
                "rate-limit backend refused by its cluster (down, failing over or resharding): {err}"
            ),
            Self::AtCapacity => f.write_str("rate-limit backend is at its key capacity"),
            Self::Corrupt { key, detail } => {
                write!(
                    f,
                    "corrupt rate-limit counter at {key:?}: {detail} (left untouched)"
                )
            }
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unavailable(err) | Self::ClusterDown(err) => Some(&**err),
            _ => None,
        }
    }
}

/// One counter a request is charged to: the namespace (the layer's name, or
/// the name of one of its extra quotas) and the quota whose window a new
/// counter gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter<'a> {
    /// Names the counter together with the key.
    pub namespace: &'a str,
    /// The counter's quota: its window is the lifetime of a new counter; its
    /// limit is a hint a backend may use (the Redis backend's deny cache).
    pub quota: Quota,
    /// An answer may lower this counter later: a settle, a refund, a clear
    /// (the layer that hits it has a [`reserve`](crate::RateLimitLayer::reserve),
    /// a [`count_if`](crate::RateLimitLayer::count_if) or a
    /// [`reset_if`](crate::RateLimitLayer::reset_if); a
    /// [`BudgetLayer`](crate::outbound::BudgetLayer) with a
    /// [`reserve`](crate::outbound::BudgetLayer::reserve)). A backend that
    /// caches denials holds one of this counter only for its recheck bound,
    /// not until the window closes, so that what another instance frees is
    /// seen. `false` for a counter whose count only goes up.
    pub lowers: bool,
}

/// What a request spends in [`Spending::spend_all`]: see
/// [costs, lockouts and amends](self#costs-lockouts-and-amends).
///
/// ```
/// use tower_pinned_window::Window;
/// use tower_pinned_window::backend::Spend;
/// use std::time::Duration;
///
/// let check = Spend::cost(0);
/// assert!(!check.open && check.block.is_none());
/// let login = Spend::cost(1).block(Window::new(Duration::from_secs(3600)).unwrap());
/// assert_eq!(login.cost, 1);
/// let charged_later = Spend::cost(0).open();
/// assert!(charged_later.open);
///
/// // One call to a provider that limits requests and tokens: 1 from the
/// // requests counter (the first), its 700 tokens from the tokens counter.
/// let call = Spend::cost(700).first(1);
/// assert_eq!((call.cost_of(0), call.cost_of(1)), (1, 700));
/// // Without `first`, every counter is spent the cost.
/// assert_eq!((login.cost_of(0), login.cost_of(1)), (1, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Spend {
    /// Added to every counter when all of them fit; to every counter but
    /// the first when [`first`](Self::first) is set.
    pub cost: u64,
    /// With a cost of 0, still create a missing counter (at 0, with its
    /// window): the window is pinned to this request, and a charge after
    /// the answer has a counter to add to.
    pub open: bool,
    /// Lock a counter that does not fit for this long, counted from that
    /// first denial.
    pub block: Option<crate::quota::Window>,
    /// What the first counter is spent instead of [`cost`](Self::cost);
    /// `None` (what [`Spend::cost`] makes): the cost, as every counter.
    pub first: Option<u64>,
}

impl Spend {
    /// A spend of `cost` on every counter, with no lockout.
    pub const fn cost(cost: u64) -> Self {
        Self {
            cost,
            open: false,
            block: None,
            first: None,
        }
    }

    /// Open a missing counter even at a cost of 0.
    pub const fn open(mut self) -> Self {
        self.open = true;
        self
    }

    /// Lock a counter that does not fit for `block`.
    pub const fn block(mut self, block: crate::quota::Window) -> Self {
        self.block = Some(block);
        self
    }

    /// Spend `unit` from the first counter instead of the cost, in the
    /// same atomic step: a call that takes one request from a requests
    /// budget (the first counter) and its tokens from a tokens budget.
    /// Each counter fits, and is reported, by its own amount
    /// ([`cost_of`](Self::cost_of)); `first(0)` makes the first counter a
    /// check.
    #[must_use]
    pub const fn first(mut self, unit: u64) -> Self {
        self.first = Some(unit);
        self
    }

    /// What this spend adds to the counter at `index` (from 0) of its
    /// counters: [`first`](Self::first)'s unit for the first one when it is
    /// set, else [`cost`](Self::cost).
    #[must_use]
    pub const fn cost_of(self, index: usize) -> u64 {
        match (index, self.first) {
            (0, Some(unit)) => unit,
            _ => self.cost,
        }
    }
}

/// What [`Spending::amend`] does to the counter a hit was counted in, once the
/// answer is known: see [costs, lockouts and amends](self#costs-lockouts-and-amends).
///
/// Exhaustive on purpose: every store matches on it (the crate's own are
/// crates of their own, as yours is), so a new kind of amend is a change of
/// the contract that each store must answer, not one it may miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amend {
    /// Take back this much (a request's cost, when its answer does not
    /// count); never below zero.
    Refund(u64),
    /// Add this much (a response's charge); it may take the count past
    /// the limit.
    Charge(u64),
    /// Delete the counter (a success that resets a run of failures).
    Clear,
}

/// The outcome of one [`Backend::hit_all`]: a [`Hit`] per counter, in order.
/// Up to two hits are held inline, with no heap allocation; more go in a
/// `Vec`.
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::backend::{Hit, Hits};
///
/// let hit = |count| Hit { count, reset: Duration::from_secs(1), deadline: None };
/// let hits: Hits = [hit(1), hit(2)].into_iter().collect();
/// assert_eq!(hits.len(), 2);
/// assert_eq!(hits.first().map(|h| h.count), Some(1));
/// assert_eq!(hits.iter().map(|h| h.count).sum::<u64>(), 3);
/// ```
///
/// The answer of a [`Leasing::take_all`] carries the cap's answer too, as
/// one more entry at its end: a store adds it with
/// [`with_taken`](Hits::with_taken), and [`split_taken`](Hits::split_taken)
/// takes it off, so that `Hits` stays the size of two `Hit`s.
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::backend::{Hit, Hits, Taken};
///
/// let hit = Hit { count: 1, reset: Duration::from_secs(60), deadline: None };
/// let taken = Taken { granted: true, in_use: 2, retry: Duration::ZERO };
/// let answer = Hits::one(hit).with_taken(Some(taken));
/// let (hits, cap) = answer.split_taken();
/// assert_eq!((hits.as_slice(), cap), (&[hit][..], Some(taken)));
/// // No slot asked for (the counters refused): nothing to split.
/// assert_eq!(Hits::one(hit).with_taken(None).split_taken().1, None);
/// ```
#[derive(Debug, Clone)]
pub struct Hits(Repr);

/// One or two hits inline, as for a policy of one quota or of two (`also`);
/// more on the heap. `Hit`'s `Duration` leaves room for the tag, so the
/// answer is the size of two `Hit`s: small enough that a caller which builds
/// it in its own frame (the memory backend's `hit_all` is inlined there) need
/// not read it back from memory the backend wrote a few bytes at a time.
#[derive(Debug, Clone)]
enum Repr {
    One(Hit),
    Two([Hit; 2]),
    Many(Vec<Hit>),
}

impl Hits {
    /// No hits.
    pub fn new() -> Self {
        Self(Repr::Many(Vec::new()))
    }

    /// No hits, with room for `capacity`.
    pub fn with_capacity(capacity: usize) -> Self {
        Self(Repr::Many(if capacity > 2 {
            Vec::with_capacity(capacity)
        } else {
            Vec::new()
        }))
    }

    /// One hit.
    pub fn one(hit: Hit) -> Self {
        Self(Repr::One(hit))
    }

    /// Two hits, in order.
    pub(crate) fn two(first: Hit, second: Hit) -> Self {
        Self(Repr::Two([first, second]))
    }

    /// Add the next counter's hit.
    #[inline]
    pub fn push(&mut self, hit: Hit) {
        match &mut self.0 {
            Repr::One(first) => self.0 = Repr::Two([*first, hit]),
            Repr::Two([a, b]) => self.0 = Repr::Many(vec![*a, *b, hit]),
            Repr::Many(hits) if hits.is_empty() && hits.capacity() == 0 => self.0 = Repr::One(hit),
            Repr::Many(hits) => hits.push(hit),
        }
    }

    /// The hits, in the order of the counters.
    pub fn as_slice(&self) -> &[Hit] {
        match &self.0 {
            Repr::One(hit) => std::slice::from_ref(hit),
            Repr::Two(hits) => hits,
            Repr::Many(hits) => hits,
        }
    }

    /// These hits with the cap's answer after them: what a store's
    /// [`Leasing::take_all`] answers. `None` (the counters refused: no
    /// slot was asked for) adds nothing.
    #[must_use]
    pub fn with_taken(mut self, taken: Option<Taken>) -> Self {
        if let Some(taken) = taken {
            self.push(Hit {
                count: taken.in_use | u64::from(taken.granted) << 63,
                reset: taken.retry,
                deadline: Some(TAKEN),
            });
        }
        self
    }

    /// The hits of the counters, and the cap's answer when
    /// [`with_taken`](Self::with_taken) added one: the slot taken
    /// (`granted`), or refused by a full cap with nothing counted; `None`
    /// when no slot was asked for (the counters refused the request, and
    /// any step but a `take_all`).
    #[must_use]
    pub fn split_taken(mut self) -> (Self, Option<Taken>) {
        let Some(last) = self.as_slice().last().copied() else {
            return (self, None);
        };
        if last.deadline != Some(TAKEN) {
            return (self, None);
        }
        self.0 = match std::mem::replace(&mut self.0, Repr::Many(Vec::new())) {
            Repr::One(_) => Repr::Many(Vec::new()),
            Repr::Two([first, _]) => Repr::One(first),
            Repr::Many(mut hits) => {
                hits.pop();
                Repr::Many(hits)
            }
        };
        let taken = Taken {
            granted: last.count >> 63 == 1,
            in_use: last.count & !(1 << 63),
            retry: last.reset,
        };
        (self, Some(taken))
    }
}

impl Default for Hits {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for Hits {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Hits {}

/// The slice's methods: `len`, `iter`, `get`, `first`, ...
impl Deref for Hits {
    type Target = [Hit];

    fn deref(&self) -> &[Hit] {
        self.as_slice()
    }
}

impl FromIterator<Hit> for Hits {
    fn from_iter<I: IntoIterator<Item = Hit>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut hits = Self::with_capacity(iter.size_hint().0);
        hits.extend(iter);
        hits
    }
}

impl Extend<Hit> for Hits {
    fn extend<I: IntoIterator<Item = Hit>>(&mut self, iter: I) {
        for hit in iter {
            self.push(hit);
        }
    }
}

impl<'a> IntoIterator for &'a Hits {
    type Item = &'a Hit;
    type IntoIter = std::slice::Iter<'a, Hit>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

/// A counter store that keeps the [contract](self#the-contract).
///
/// Implementations hold their state behind an `Arc`, so clones share it.
///
/// [`hit_all`](Backend::hit_all) and [`refund`](Backend::refund) return
/// associated futures, while [`peek`](Backend::peek) and
/// [`reset`](Backend::reset) return `impl Future`: the layer polls a hit
/// once inline and keeps it in its response future (and will do the same with
/// a refund after the response), so those futures must be nameable, `Unpin`
/// and `'static`; `peek` and `reset` are never on the request path.
pub trait Backend: Clone + Send + Sync + 'static {
    /// What [`hit_all`](Backend::hit_all) returns (`Unpin`: box it if need
    /// be). The in-memory backend answers with an already completed future,
    /// so a hit costs no allocation; the layer polls it once as soon as it is
    /// made and decides there and then when it is ready.
    type Future: Future<Output = Result<Hits, BackendError>> + Unpin + Send + 'static;

    /// What [`refund`](Backend::refund) returns; like
    /// [`Future`](Backend::Future), already complete when the store is in
    /// this process.
    type Refund: Future<Output = Result<bool, BackendError>> + Unpin + Send + 'static;

    /// Count one hit on `key` in each of `counters`, each in one atomic step;
    /// a new counter's window is its quota's window, an existing counter's
    /// window is left as it is. Every counter is hit, whatever the others
    /// say. A backend that can reach all of them in one round trip does.
    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> Self::Future;

    /// [`hit_all`](Backend::hit_all) for one counter.
    fn hit(
        &self,
        namespace: &str,
        key: &Key,
        quota: Quota,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Unpin + Send + 'static + use<Self> {
        FirstHit(self.hit_all(
            key,
            &[Counter {
                namespace,
                quota,
                lowers: false,
            }],
        ))
    }

    /// Take back `hit`, which [`hit_all`](Backend::hit_all) counted on
    /// `namespace`'s counter for `key`, in one atomic step: `Ok(true)` when
    /// the count went down by one.
    ///
    /// It never creates a counter and never gives one a lifetime; it never
    /// takes a count below zero; it applies only to the window `hit` was
    /// counted in, named by [`Hit::deadline`], and does nothing (`Ok(false)`)
    /// once that window has closed or a new one has opened, or when the hit
    /// was not counted in the store (`deadline` is `None`). A counter that is
    /// not an integer is [`BackendError::Corrupt`] and left as it is.
    ///
    /// Refund each hit at most once: units of a count are alike, so the
    /// store cannot tell a second refund of one hit from the refund of
    /// another.
    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> Self::Refund;

    /// The counter as it stands, without counting; `None` when there is no
    /// live counter.
    fn peek(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Hit>, BackendError>> + Send;

    /// Delete the counter ("unblock this client"); `true` when one existed.
    fn reset(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send;
}

/// A [`Backend`] that also spends: costs, lockouts and amends, the extra
/// ability a layer with a [`cost`](crate::RateLimitLayer::cost), a
/// [`charge`](crate::RateLimitLayer::charge), a
/// [`block_for`](crate::RateLimitLayer::block_for) or a
/// [`reset_if`](crate::RateLimitLayer::reset_if) needs. Every backend of this
/// crate implements it; a layer that spends does not compile on a backend
/// that does not.
///
/// See [costs, lockouts and amends](self#costs-lockouts-and-amends) for the
/// contract.
pub trait Spending: Backend {
    /// The one atomic step for a request with a [`Spend`]: see
    /// [costs, lockouts and amends](self#costs-lockouts-and-amends).
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> Self::Future;

    /// Change the counter `hit` was counted in, in one atomic step and only
    /// in that window: `Ok(true)` when it changed. See
    /// [costs, lockouts and amends](self#costs-lockouts-and-amends).
    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> Self::Refund;
}

/// A [`Backend`] that also caps requests **in flight** per key, with slots
/// on leases: what an [`InFlightLayer`](crate::InFlightLayer) needs. Every
/// backend of this crate implements it; a layer with a cap does not
/// compile on a backend that does not.
///
/// See [requests in flight](self#requests-in-flight) for the contract.
pub trait Leasing: Backend {
    /// What [`take`](Leasing::take) returns (`Unpin`, as
    /// [`Backend::Future`]: the layer polls it inline). Already complete
    /// when the store is in this process.
    type Take: Future<Output = Result<Taken, BackendError>> + Unpin + Send + 'static;

    /// Take the slot `slot` of `cap` for `key`, in one atomic step: see
    /// [requests in flight](self#requests-in-flight).
    fn take(&self, key: &Key, cap: Cap<'_>, slot: SlotId) -> Self::Take;

    /// Take the slot `slot` of `cap` for `key` **and** count `counters`,
    /// in one atomic step: what a [`RateLimitLayer`](crate::RateLimitLayer)
    /// with quotas and an [`in_flight`](crate::RateLimitLayer::in_flight)
    /// cap asks, one round trip for both. `spend` is `None` for plain hits
    /// ([`hit_all`](Backend::hit_all)); a layer passes `Some` only when it
    /// spends, which builds only on a store that implements [`Spending`]
    /// ([`spend_all`](Spending::spend_all)). See
    /// [quotas and a cap in one step](self#quotas-and-a-cap-in-one-step).
    fn take_all(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<Spend>,
    ) -> Self::Future;

    /// Give back `slot`, taken for `key` under `namespace`, in one atomic
    /// step: `Ok(true)` when it was there.
    fn give_back(
        &self,
        namespace: &str,
        key: &Key,
        slot: SlotId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static + use<Self>;

    /// Give back `slot` without waiting for the store's answer: what a
    /// layer does when a request ends (its body over, its call dropped). A
    /// give-back that fails is left to the lease, never retried, so this
    /// answers nothing.
    ///
    /// The default polls [`give_back`](Leasing::give_back) once, which
    /// finishes a store in this process, and leaves any other to a task on
    /// the current tokio runtime (none: to the lease). A store that batches
    /// its calls may queue the give-back with no task of its own.
    fn release(&self, namespace: &str, key: &Key, slot: SlotId) {
        let mut call = Box::pin(self.give_back(namespace, key, slot));
        let report = |result: Result<bool, BackendError>| {
            if let Err(err) = result {
                tracing::debug!(error = %err, "a slot in flight could not be given back: its lease frees it");
            }
        };
        match call
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
        {
            Poll::Ready(result) => report(result),
            Poll::Pending => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move { report(call.await) });
                }
                Err(_) => tracing::debug!(
                    "no tokio runtime to give a slot in flight back on: its lease frees it"
                ),
            },
        }
    }

    /// Extend every slot of `held` that is still there to `now + lease`,
    /// each key's record to at least that: the number extended. A slot
    /// that is gone is never created again. A backend that can reach them
    /// all in one round trip does (one per node of a Cluster).
    fn extend(
        &self,
        held: &[Held<'_>],
        lease: Window,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send + 'static + use<Self>;

    /// The live slots of `key` under `namespace`, without changing them.
    fn in_use(
        &self,
        namespace: &str,
        key: &Key,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send;
}

/// A [`Spending`] store that also takes a provider's word about an outbound
/// budget (what a `BudgetLayer` needs to follow 429s and rate-limit headers
/// on every instance). Every backend of this crate implements it.
///
/// See [the provider's word](self#the-providers-word) for the contract.
///
/// ```
/// use std::time::Duration;
/// use tower_pinned_window::backend::{Counter, Heeding, MemoryBackend, Spend, Spending};
/// use tower_pinned_window::key::Key;
/// use tower_pinned_window::{Quota, Window};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryBackend::new();
/// let key = Key::new("openai");
/// let quota = Quota::new(100, Duration::from_secs(60)).unwrap();
/// let counter = Counter { namespace: "requests", quota, lowers: false };
///
/// // `x-ratelimit-remaining-requests: 10`, resetting in 6 s: 90 are spent.
/// let six = Window::new(Duration::from_secs(6)).unwrap();
/// let raised = store.raise(&key, counter, 90, six).await.unwrap();
/// assert_eq!(raised.count, 90);
/// assert!(raised.reset <= Duration::from_secs(6), "the provider's window");
/// // Never lowered: a later, larger remaining changes nothing.
/// assert_eq!(store.raise(&key, counter, 20, six).await.unwrap().count, 90);
///
/// // `429` with `Retry-After: 3`: closed for every instance, 3 s from now.
/// let three = Window::new(Duration::from_secs(3)).unwrap();
/// let left = store.close("requests", &key, three).await.unwrap();
/// assert_eq!(left, Duration::from_secs(3));
/// let denied = store.spend_all(&key, &[counter], Spend::cost(1)).await.unwrap()[0];
/// assert!(denied.count > 100 && denied.reset <= left, "refused until it opens");
/// // A shorter closure never shortens it.
/// let one = Window::new(Duration::from_secs(1)).unwrap();
/// assert!(store.close("requests", &key, one).await.unwrap() > Duration::from_secs(2));
/// # }
/// ```
pub trait Heeding: Spending {
    /// Close `namespace`'s counter for `key` for `span` from now, in one
    /// atomic step: the counter's lockout (the same marker a
    /// [`Spend::block`] lockout is, which every spend already reads in its
    /// own atomic step, so honouring a closure costs no extra store call)
    /// is created with the lifetime `span` in the same step, or, when one
    /// is live and ends sooner, moved to end `span` from now. Deadlines
    /// only extend: a live lockout that ends later is left as it is.
    /// Answers the time left of the lockout after the step.
    ///
    /// A lockout without a lifetime, or a counter that is not an integer,
    /// is [`BackendError::Corrupt`] and left as it is. See
    /// [the provider's word](self#the-providers-word).
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<Self>;

    /// Raise `counter`'s count for `key` to at least `count`, in one atomic
    /// step, never past the counter's quota limit and never lowered: a
    /// provider says fewer calls remain than the budget thinks. A live
    /// counter keeps its window (its deadline never moves). A missing one
    /// is created at `min(count, limit)` with the lifetime
    /// `min(within, window)` (the quota's window), set in the same step
    /// (the provider's window resets then). A `count` of 0 changes nothing
    /// and creates nothing.
    ///
    /// Answers the counter as it stands after the step: a [`Hit`] with its
    /// count, time left and, when it exists, its
    /// [`deadline`](Hit::deadline) (the window's identity, as a spend
    /// answers it). A counter that is not an integer (or a key of another
    /// type) is [`BackendError::Corrupt`] and left as it is. See
    /// [the provider's word](self#the-providers-word).
    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<Self>;
}

/// The future of [`Backend::hit`]: the one [`Hit`] of a one-counter
/// [`hit_all`](Backend::hit_all).
struct FirstHit<F>(F);

impl<F> Future for FirstHit<F>
where
    F: Future<Output = Result<Hits, BackendError>> + Unpin,
{
    type Output = Result<Hit, BackendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|hits| {
            hits.and_then(|hits| {
                // The error is built only when needed: it allocates.
                hits.first()
                    .copied()
                    .ok_or_else(|| BackendError::Unavailable("the backend answered no hit".into()))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hit(count: u64) -> Hit {
        Hit {
            count,
            reset: Duration::from_millis(count),
            deadline: NonZeroU64::new(count),
        }
    }

    #[test]
    fn hits_take_the_room_of_two_hits() {
        // The tag sits in a `Duration`'s nanoseconds: `Hits` adds no word.
        assert_eq!(size_of::<Hits>(), 2 * size_of::<Hit>());
    }

    proptest! {
        /// However they are built, hits read back as the list they were
        /// given, in order, forwards and backwards.
        #[test]
        fn hits_keep_what_they_were_given(
            counts in proptest::collection::vec(0..u64::MAX, 0..5),
            capacity in 0..4usize,
        ) {
            let given: Vec<Hit> = counts.iter().copied().map(hit).collect();
            let mut pushed = Hits::with_capacity(capacity);
            for &h in &given {
                pushed.push(h);
            }
            let collected: Hits = given.iter().copied().collect();
            let mut extended = Hits::new();
            extended.extend(given.iter().copied());
            let mut built = vec![pushed.clone(), collected.clone(), extended.clone()];
            if let [a, b] = given[..] {
                built.push(Hits::two(a, b));
            }
            if let [a] = given[..] {
                built.push(Hits::one(a));
            }
            for hits in &built {
                prop_assert_eq!(hits.as_slice(), &given[..]);
                prop_assert_eq!(hits, &pushed);
                prop_assert_eq!(hits.iter().len(), given.len());
                prop_assert_eq!(hits.iter().copied().collect::<Vec<_>>(), given.clone());
                prop_assert_eq!(
                    hits.iter().rev().copied().collect::<Vec<_>>(),
                    given.iter().rev().copied().collect::<Vec<_>>()
                );
                prop_assert_eq!(hits.iter().collect::<Vec<_>>(), given.iter().collect::<Vec<_>>());
            }
            // Held inline up to two.
            prop_assert_eq!(given.len() == 1, matches!(collected.0, Repr::One(_)));
            prop_assert_eq!(given.len() == 2, matches!(collected.0, Repr::Two(_)));
        }
    }
}
