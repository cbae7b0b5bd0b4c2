//! The PostgreSQL backend of [`tower-pinned-window`](tower_pinned_window):
//! counters in a table, shared by every instance of a service that points at
//! the same database.
//!
//! Built only on what `tower-pinned-window` makes public for any store
//! author: its [`Backend`], [`Spending`], [`Leasing`] and [`Heeding`]
//! traits and its
//! [`toolkit`](tower_pinned_window::backend::toolkit) (the deny cache, the
//! remote future, the storage key that names a counter in errors). The
//! guide is
//! [`docs/postgres.md`](https://docs.rs/tower-pinned-window/latest/tower_pinned_window/guide/postgres/index.html).
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_pinned_window::{Quota, RateLimitLayer, key::ClientIp};
//! use tower_pinned_window_postgres::PostgresBackend;
//!
//! # async fn build() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! backend.migrate().await?; // CREATE TABLE IF NOT EXISTS (or run `migration_sql()` yourself)
//! let layer = RateLimitLayer::new("api", Quota::new(100, Duration::from_secs(60))?)
//!     .key(ClientIp::new())
//!     .backend(backend);
//! # Ok(()) }
//! ```
//!
//! # One statement per hit, at most
//!
//! Hits are counted by a prepared `INSERT ... ON CONFLICT DO UPDATE`
//! (`sql/hit.sql` in the source). Atomically for each counter (the row lock orders
//! concurrent hits), it
//! - creates the row with the count and `expires_at = now + window` when
//!   there is none or its window has closed;
//! - otherwise adds to the count and leaves `expires_at` as it is;
//! - returns the count, `expires_at` and the time it read.
//!
//! So a counter's deadline is written only by the statement that opens its
//! window, and no crash can land between the count and the deadline: a
//! statement commits whole or not at all. "Now" is the database's clock
//! (`statement_timestamp()`), so app servers with skewed clocks agree on
//! every window. Windows are whole milliseconds, as for every backend, and
//! stored to the microsecond.
//!
//! A hit alone is one statement, sent at once. Hits that arrive while this
//! instance already has [`statements`](PostgresBackendBuilder::statements)
//! hit statements running go out together in the next one (up to 128
//! counters), with no timer: hits on one counter in it are one row, and each
//! hit gets its own count from the row's new count, so exactly `limit` of
//! them are admitted, in the order they were queued. Under load this makes
//! far fewer statements than hits (the README's benchmark: 1.9 to 2.9 times
//! the hits per second of pgbench running one statement per hit, at 64 in
//! flight). A hit whose
//! future is dropped before its statement is sent is not counted; one
//! dropped after is counted, as a statement already sent would be.
//!
//! # Spends and amends
//!
//! [Spends](Spending::spend_all) (a cost, a check that opens a window, a
//! lockout) and [amends](Spending::amend) (refunds, charges, clears) are
//! batched the way hits are, on a queue of their own with up to
//! [`statements`](PostgresBackendBuilder::statements) senders and no timer:
//! a lone request is sent at once, and those that arrive while the senders
//! are busy go out together in the next batch (up to 128 requests). A
//! request whose future is dropped before its batch is sent is not sent.
//! A batch is one transaction of two round trips:
//!
//! 1. `BEGIN`; `sql/spend_lock.sql`, which locks the rows of every counter
//!    of the batch in one order (`namespace, key`, as the hit statement does,
//!    so nothing deadlocks), creating a missing one that a spend names as a
//!    closed window; `sql/spend_read.sql`, which reads them with the
//!    database's clock and the reset markers of the amends' deadlines:
//!    pipelined, one round trip;
//! 2. the batch is decided in the backend, request by request in the order
//!    they were queued, each on the rows as the requests before it left them,
//!    with the [contract's](tower_pinned_window::backend#costs-lockouts-and-amends) rules: a spend
//!    all or nothing across its counters, a counter it creates given its
//!    window as its lifetime, a lockout set on its first denial and never
//!    extended; an amend only in its hit's window while it is open and no
//!    reset marker names it. Then `sql/spend_write.sql` writes every changed
//!    row (and deletes those a clear deleted, and writes their markers), and
//!    `COMMIT`: pipelined, one round trip.
//!
//! The rows stay locked from the read to the commit, so requests on the same
//! counter in one batch are applied as if sent one after the other, and
//! across batches, instances and hit statements the admitted costs never
//! pass a limit and add up to the stored count. Under load a transaction
//! carries many requests: `bench/postgres.sh` measured 0.07 transactions
//! (0.34 statements, `BEGIN` and `COMMIT` included) a request on a cost-1
//! route over 10,000 keys at 64 in flight, and 0.14 (0.68) on a charged
//! route (a check, then a charge).
//!
//! **Faults.** A counter's row no spend may count (see [Corrupt
//! rows](self#corrupt-rows)) fails the spends that name it with
//! [`BackendError::Corrupt`] and is left as it is; the amends that name it
//! answer `false`; the rest of the batch is decided as usual. A transaction
//! commits whole or not at all and is never sent again: a batch cut by a
//! lost connection fails its requests (the failure policy decides), and
//! each of them was counted once or not at all. Its connection is dropped,
//! never handed out in the middle of a transaction. When the `COMMIT`'s
//! reply was lost, `txid_status` (the transaction's id is read with its
//! rows) says whether it committed, and its spends are then given back
//! under the refund rules, as is an admitted spend whose caller was gone
//! when its batch committed.
//!
//! # The local deny cache
//!
//! Once a hit comes back over its limit, the counter is remembered on this
//! instance, and further hits on it are denied here, with no statement.
//! Spends use it the same way: a counter a spend was denied on that even a
//! check would be denied on (its count at its limit or over) is remembered,
//! as is one under a lockout, and spends on it are denied here. A spend
//! denied only because its cost does not fit is not remembered. A spend
//! that would lock a counter out is answered here only by a lockout: a
//! counter merely over its limit goes to the database, which locks it. Hits
//! never read the lockouts. An amend drops its counter from this
//! instance's cache.
//!
//! How long a denial is held depends on whether the counter's count can go
//! down. One that only goes up is held until its window closes (a lockout
//! until it ends): exact, because the window is pinned and its deadline
//! cannot move. One that [lowers](tower_pinned_window::backend::Counter::lowers) (its
//! layer has a `reserve`, a `count_if` or a `reset_if`; a `BudgetLayer` has
//! a `reserve`) may be freed at any moment by a settle, refund or clear on
//! another instance, so it is held at most
//! [`deny_cache_recheck`](PostgresBackendBuilder::deny_cache_recheck)
//! (default [`DEFAULT_DENY_CACHE_RECHECK`]), never past its window: no
//! instance denies a request here that the table has room for for longer
//! than that bound and a round trip ([`docs/guarantees.md`](https://docs.rs/tower-pinned-window/latest/tower_pinned_window/guide/guarantees/index.html)). Deadlines are
//! measured from when the request was queued, before the database read its
//! clock, so they never outlast the window in the table. Such denials
//! report a count of `limit + 1` (a spend's: the limit plus its cost on
//! that counter, as the spend contract says), and are not counted in the
//! table. The trade-off left is a [`reset`](Backend::reset) or
//! [`refund`](Backend::refund) your own code calls on a counter that does
//! not lower: it clears this instance's cache, but other instances keep
//! denying the counter until the window they cached closes; turn the cache
//! off with [`deny_cache(0)`](PostgresBackendBuilder::deny_cache) where that
//! must take effect everywhere at once. The cache is keyed by the counter's
//! [canonical storage key](tower_pinned_window::backend#storage-keys).
//!
//! # Refunds
//!
//! [`Backend::refund`] is one `UPDATE` that takes one off the count of the
//! row whose `expires_at` is the hit's [deadline](Hit::deadline) (its Unix
//! microseconds), only while that window is open and the count is positive:
//! it never creates a row, never writes `expires_at`, never goes below zero,
//! and does nothing once the window has closed or a new one (another
//! `expires_at`) has opened. A count of 0 is a window whose every hit was
//! refunded; the next hit counts on from it.
//!
//! A window is named by more than its `expires_at`. [`reset`](Backend::reset)
//! and [`Amend::Clear`] delete a window's row and, in the same statement (or
//! transaction), write a **reset marker** (namespace, key, the deleted `expires_at`) to a
//! table beside the counters (`{table}_resets`), kept until that deadline
//! has passed. A refund, charge or clear of a hit whose deadline a marker
//! names does nothing and answers `false`: a window opened after the reset
//! with the same `expires_at` (to the microsecond) cannot be told from the
//! deleted one by its hits, so neither is amended. The price is the new
//! window's own amends in that microsecond, never a wrong one. The marker
//! check is one primary-key probe in the refund's statement, or in the read
//! of an amend's batch; hits never read the markers. The cleaner deletes a marker a second after
//! its deadline. A clear under a live lockout keeps the row for its lockout
//! as a closed window (count 0, `expires_at` at the epoch): no counter, as
//! for the other backends, and a marker too. An instance of the previous
//! release resets without a marker: this holds once every instance runs
//! this one.
//!
//! # The provider's word
//!
//! [`Heeding`] (a `429`, a `Retry-After` or a rate-limit header that an
//! outbound budget follows; see the
//! [contract](tower_pinned_window::backend#the-providers-word)) is one
//! statement a step on the counter's row, under its row lock, on the
//! database's clock, sent at once (a provider speaks rarely: nothing to
//! batch with):
//!
//! - a close (`sql/close.sql`) writes only the row's `blocked_until`, the
//!   lockout a spend sets and reads: `now + span` when there is none or it
//!   ends sooner, left as it is when it ends later. A missing row is made as
//!   a spend's lock makes one, a closed window (count 0, `expires_at` at the
//!   epoch), with that lockout; the cleaner keeps it until the lockout ends;
//! - a raise (`sql/raise.sql`) is an `INSERT ... ON CONFLICT DO UPDATE`:
//!   a live row's count becomes `greatest(count, least(n, limit))`, its
//!   `expires_at` kept; a missing row, or one whose window has closed, gets
//!   `least(n, limit)` and `expires_at = now + least(within, window)`, its
//!   lockout kept. A raise of 0 writes nothing.
//!
//! A row no hit may count, or (for a close) a `blocked_until` past
//! [`Window::MAX`] or infinite (a lockout without a lifetime), fails the
//! statement's `WHERE`: it is left as it is, and the step fails with
//! [`BackendError::Corrupt`], described from the row as the statement's
//! snapshot read it, in the same round trip.
//!
//! # Requests in flight
//!
//! [Slots on leases](tower_pinned_window::backend#requests-in-flight)
//! ([`Leasing`]) live in a table beside the counters, `{table}_slots`: one
//! **record** per key that holds slots, with each slot's name (its holder's
//! [`SlotId`], 32 lowercase hex digits) and its lease at the same place of
//! two arrays, and the record's `expires_at`, at least its latest lease and
//! never lowered. Each step is one round trip (one statement, but for a
//! `take_all`'s transaction) on the key's record under its row lock:
//!
//! - a take (`sql/take.sql`) is an `INSERT ... ON CONFLICT DO UPDATE`
//!   whose `SET` reads the record as the last step left it: it drops the
//!   slots whose lease has run out and adds this one, with the lease
//!   `now + lease`, when it is not held and fewer than `max` are live. Takes
//!   of one key from any number of connections and instances are applied
//!   one after the other, so no more than `max` are ever granted;
//! - a take with counters ([`take_all`](Leasing::take_all): a layer with
//!   quotas and a cap) is one transaction sent in one round trip,
//!   pipelined: the record locked (made empty, with its lifetime, when
//!   missing), the counters' rows locked in one order (a missing one made
//!   a closed window, as a spend makes it), then `sql/take_all.sql`, which
//!   reads them as the locks hold them, drops the slots whose lease has run
//!   out, and either reads the counters (the slot already held, or the cap
//!   full: nothing counted) or counts them as a hit statement or a batch's
//!   spend would, adding the slot when they admit the request. A record or
//!   a counter no step may change rolls the whole transaction back;
//! - a give-back takes the slot out of the record when its lease is live;
//!   a record left empty is the cleaner's when its `expires_at` passes;
//! - an extend is one statement for every slot held, whatever their keys:
//!   it locks their records in one order (`namespace, key`), so two extends
//!   never deadlock, and moves each slot still live to at least
//!   `now + lease`. A slot that is gone is never created again.
//!
//! "Now" is the database's clock, as for the counters. Each step rewrites
//! the key's record (a refused take too): its cost grows with the key's
//! slots, which suits caps of tens, not of thousands. A slot per row would
//! not do it in one statement: under `READ COMMITTED` a statement reads
//! from the snapshot it started with, so a lock it waits for inside itself
//! would not show it the slots the lock's holder had just written.
//!
//! **A record no take can have written** is corrupt state: a name that is
//! not 32 lowercase hex digits or appears twice, a slot without a lease or
//! with a `NULL` one, a lease past the record's `expires_at`, or no usable
//! `expires_at` (`NULL`, infinite, or past [`Window::MAX`]: a record without
//! a lifetime, a leak). Every statement checks the record
//! (`sql/slot_shape.sql`): the key's takes, give-backs, extends and
//! [`in_use`](Leasing::in_use) fail with [`BackendError::Corrupt`], naming
//! it `{table}_slots namespace{key}:slots`, and it is left exactly as it is
//! (an extend still extends the other keys it names). The table's `CHECK`
//! constraints refuse such records unless someone drops them; the cleaner
//! never deletes one, and the [audit](PostgresBackend::audit) lists them.
//!
//! # Corrupt rows
//!
//! A row no hit can have written (a negative count, no `expires_at`, an
//! infinite one or one further away than [`Window::MAX`], a count that
//! cannot grow) fails the statement's `WHERE`: the row is left exactly as it
//! is, and the hit fails with [`BackendError::Corrupt`] (500, whatever the
//! failure policy). The table's `CHECK` constraints make such rows
//! impossible unless someone drops them; the [`audit`](PostgresBackend::audit)
//! finds any that got in anyway.
//!
//! # The table
//!
//! [`migrate`](PostgresBackend::migrate) creates it (and its schema and
//! index) if missing; teams that run their own migrations take the same SQL
//! from [`migration_sql`](PostgresBackend::migration_sql). For the default
//! `public.tpw_counters`:
//!
//! ```sql
//! CREATE SCHEMA IF NOT EXISTS "public";
//! CREATE TABLE IF NOT EXISTS "public"."tpw_counters" (
//!     namespace  text        NOT NULL,
//!     key        bytea       NOT NULL,
//!     count      bigint      NOT NULL CHECK (count >= 0),
//!     expires_at timestamptz NOT NULL CHECK (isfinite(expires_at)),
//!     PRIMARY KEY (namespace, key)
//! ) WITH (fillfactor = 80);
//! CREATE INDEX IF NOT EXISTS "tpw_counters_expires_at" ON "public"."tpw_counters" (expires_at);
//! ALTER TABLE "public"."tpw_counters" ADD COLUMN IF NOT EXISTS blocked_until timestamptz
//!     CHECK (isfinite(blocked_until));
//! CREATE TABLE IF NOT EXISTS "public"."tpw_counters_resets" (
//!     expires_at timestamptz NOT NULL CHECK (isfinite(expires_at)),
//!     namespace  text        NOT NULL,
//!     key        bytea       NOT NULL,
//!     PRIMARY KEY (expires_at, namespace, key)
//! );
//! CREATE TABLE IF NOT EXISTS "public"."tpw_counters_slots" (
//!     namespace  text          NOT NULL,
//!     key        bytea         NOT NULL,
//!     slots      text[]        NOT NULL CONSTRAINT slot_names CHECK (
//!         array_to_string(slots, ',', 'NULL')
//!             ~ ('^(' || repeat('[0-9a-f]', 32) || '(,' || repeat('[0-9a-f]', 32) || ')*)?$')),
//!     leases     timestamptz[] NOT NULL
//!         CONSTRAINT slot_leases CHECK (array_position(leases, NULL) IS NULL),
//!     expires_at timestamptz   NOT NULL
//!         CONSTRAINT record_lifetime CHECK (isfinite(expires_at)),
//!     PRIMARY KEY (namespace, key),
//!     CONSTRAINT a_lease_per_slot CHECK (cardinality(slots) = cardinality(leases))
//! ) WITH (fillfactor = 80);
//! CREATE INDEX IF NOT EXISTS "tpw_counters_slots_ends" ON "public"."tpw_counters_slots" (expires_at);
//! CREATE TABLE IF NOT EXISTS "public"."tpw_counters_limits" (
//!     layer text  NOT NULL,
//!     scope bytea NOT NULL,
//!     value text  NOT NULL,
//!     PRIMARY KEY (layer, scope)
//! );
//! ```
//!
//! The last table holds the limits held in the store
//! ([`Limits`]), never `UNLOGGED`: a
//! limit is configuration.
//!
//! A table made by an earlier release is migrated in place by running it
//! again: the lockout column is added (nullable: no rewrite) and the reset
//! markers', slots' and limits' tables created beside it. Run the migration before
//! instances of this release start: their refunds, amends and resets name
//! the markers' table, their caps in flight the slots' table, and fail (as
//! [`BackendError::Unavailable`]) where it is missing. Both are `UNLOGGED`
//! when the counters' table is made so (a crash empties all three: the
//! slots held are forgotten, and as many again may be taken).
//!
//! The layer's name and the client's key are two columns, so no byte of a
//! key can reach another layer's counter, and `WHERE namespace = 'login'`
//! reads one layer's counters. A count of 0 is a window whose every hit was
//! refunded. `fillfactor = 80` leaves room on each page for the updates of a
//! busy key to stay on its page.
//!
//! **`UNLOGGED`** ([`unlogged(true)`](PostgresBackendBuilder::unlogged)):
//! hits skip the write-ahead log, which makes them cheaper, but PostgreSQL
//! empties an unlogged table after a crash (not after a clean restart), and
//! an unlogged table is not copied to replicas. After a crash every client
//! gets a fresh window: a burst of up to a full limit per key, all at once.
//! The default is a logged table.
//!
//! # A bounded table, with nothing to schedule
//!
//! Expired rows are deleted by the backend: a task it owns (started by the
//! first call, stopped when the last clone of the backend is dropped) runs
//! every [`clean_every`](PostgresBackendBuilder::clean_every) (1 s by
//! default) and deletes expired rows in batches of at most
//! [`clean_batch`](PostgresBackendBuilder::clean_batch) (1,000), through the
//! index on `expires_at`, going on while batches come back full; in the
//! same transaction, the records of slots whose `expires_at` (their latest
//! lease) has passed, through their own index. Rows are
//! locked with `SKIP LOCKED`: the cleaner never waits for a hit, and the
//! cleaners of several instances share the work. A hit never waits for more
//! than one batch. The table holds about (new keys per second) ×
//! (window + interval) rows.
//!
//! # The pool
//!
//! Connections come from a [deadpool-postgres](deadpool_postgres) pool. It
//! was chosen over bb8 because it keeps a per-connection statement cache
//! (`prepare_cached`: each statement is prepared once per connection, not
//! once per hit), drops a connection that has closed before handing it out
//! again (so a restarted or killed server costs only the hits in flight,
//! with no call to reconnect), and adds little on top of tokio-postgres.
//! Hand [`builder`](PostgresBackend::builder) your own
//! [`deadpool_postgres::Pool`] to choose its size and timeouts, or let
//! [`connect`](PostgresBackend::connect) build one.
//!
//! # Requirements
//!
//! PostgreSQL 9.5 or later (`ON CONFLICT`); tested against 15. Hits need
//! `SELECT, INSERT, UPDATE` on the table (so do a close and a raise), the
//! cleaner and [`reset`](Backend::reset) `DELETE`, spends and amends all
//! four (their batch's statement may delete a cleared row); on the markers' table
//! (`{table}_resets`), refunds need `SELECT`, spends and amends `SELECT,
//! INSERT`, resets `INSERT`, the cleaner `DELETE`; on the slots' table
//! (`{table}_slots`), caps in flight need `SELECT, INSERT, UPDATE`, the
//! cleaner `DELETE`; `migrate` needs the right to create the
//! schema (if missing) and the tables.

mod audit;
mod batch;
mod builder;
mod cleaner;
mod db;
mod error;
mod heed;
mod lease;
mod limit;
mod lost;
mod row;
mod spend;
mod table;
mod take_all;

pub use batch::DEFAULT_STATEMENTS;
pub use builder::PostgresBackendBuilder;
pub use table::{DEFAULT_SCHEMA, DEFAULT_TABLE};

/// The pool this backend takes its connections from (re-exported, so its
/// version is the one this crate uses).
pub use deadpool_postgres;
/// The PostgreSQL client underneath (re-exported, for its `Config`).
pub use tokio_postgres;

use std::fmt;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tokio_postgres::NoTls;

use self::batch::{Batcher, Pending};
use self::db::Db;
use self::error::{pg_error, pool_error};
use self::row::{deadline_time, describe, read_row};
use self::spend::{Cached, Op, Request, Spent};
use tower_pinned_window::Quota;
use tower_pinned_window::Window;
use tower_pinned_window::backend::toolkit::{BackendFuture, Denials, Denied};
use tower_pinned_window::backend::{
    Amend, AuditReport, Backend, BackendError, Cap, Counter, Heeding, Held, Hit, Hits, Leasing,
    LimitScope, Limits, SlotId, Spend, Spending, StoredLimits, Taken,
};
use tower_pinned_window::key::Key;

/// Denied keys remembered locally, unless configured otherwise.
///
/// Example: [`PostgresBackendBuilder`].
pub const DEFAULT_DENY_CACHE: usize = 65_536;

/// The longest this instance holds a denial of a counter whose count can
/// go down (a [`Counter::lowers`]) before it asks the database again,
/// unless configured otherwise
/// ([`PostgresBackendBuilder::deny_cache_recheck`]): a counter denied on a
/// busy route then costs the database at most ten statements a second per
/// instance, and a denial outlives the room another instance freed by at
/// most this and a round trip.
pub const DEFAULT_DENY_CACHE_RECHECK: Duration = Duration::from_millis(100);

/// How often the cleaner runs, unless configured otherwise.
///
/// Example: [`PostgresBackendBuilder`].
pub const DEFAULT_CLEAN_EVERY: Duration = Duration::from_secs(1);

/// The most rows one cleaner statement deletes, unless configured otherwise.
///
/// Example: [`PostgresBackendBuilder`].
pub const DEFAULT_CLEAN_BATCH: u32 = 1_000;

/// Counters in a PostgreSQL table, shared by every instance of a service,
/// and slots in flight in a table beside it ([`Leasing`]). See the
/// [module docs](self) for the statements, the tables and the cleaner, and
/// [requests in flight](self#requests-in-flight) for the slots.
///
/// Clones share one pool and one cleaner.
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// The pool and the table's statements, shared with the hit senders,
    /// the cleaner and the audit.
    db: Arc<Db>,
    /// The queue of hits and its senders.
    batcher: Arc<Batcher>,
    /// The queue of spends and amends and its senders.
    spender: Arc<Batcher<Request>>,
    /// Counters over their limit until their window closes or their
    /// recheck bound passes (hits and spends without a lockout are denied
    /// here), and counters locked out until a deadline (spends are denied
    /// here; hits do not read lockouts).
    deny: Option<Denials>,
    clean: Option<(Duration, NonZeroU32)>,
    cleaner: OnceLock<cleaner::Handle>,
}

impl Clone for PostgresBackend {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.db.sql.table)
            .field("pool", &self.inner.db.pool.status())
            .field("statements", &self.inner.batcher.statements())
            .field(
                "deny_cache",
                &self.inner.deny.as_ref().map_or(0, |d| d.capacity()),
            )
            .field("clean", &self.inner.clean)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// A backend on `db`, as its builder configured it: `statements` in
    /// flight per queue, a deny cache or none, a cleaner or none.
    pub(crate) fn from_parts(
        db: Arc<Db>,
        statements: NonZeroUsize,
        deny: Option<Denials>,
        clean: Option<(Duration, NonZeroU32)>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                batcher: Arc::new(Batcher::new(statements, Arc::clone(&db))),
                spender: Arc::new(Batcher::new(statements, Arc::clone(&db))),
                db,
                deny,
                clean,
                cleaner: OnceLock::new(),
            }),
        }
    }

    /// Connect to the database at `url` (`postgres://user@host:port/db`, or
    /// `host=... user=...`) through a new pool of deadpool's default size
    /// (4 connections a core), and check that a connection can be made.
    /// Connections are named `tower-pinned-window` in `pg_stat_activity`
    /// unless the URL names them.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when the URL is invalid or the first
    /// connection fails.
    ///
    /// Example: the [module docs](self).
    pub async fn connect(url: &str) -> Result<Self, BackendError> {
        let pool = pool(url, None)?;
        drop(pool.get().await.map_err(pool_error)?);
        Ok(Self::new(pool))
    }

    /// A backend on `pool`, on the default table, with the default cleaner.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn new(pool: Pool) -> Self {
        Self::builder(pool).build()
    }

    /// Choose the table and the cleaner.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn builder(pool: Pool) -> PostgresBackendBuilder {
        PostgresBackendBuilder::new(pool)
    }

    /// The pool the backend uses.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn pool(&self) -> &Pool {
        &self.inner.db.pool
    }

    /// The table, as `schema.table`.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn table(&self) -> &str {
        &self.inner.db.sql.table
    }

    /// The SQL [`migrate`](Self::migrate) runs, for teams that run their own
    /// migrations.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn migration_sql(&self) -> &str {
        &self.inner.db.sql.migrate
    }

    /// Create the schema, the table, its index, the reset markers' table
    /// and the slots' table (with its index) if they are missing, and add the columns of later releases to
    /// an existing table (its rows are left as they are). Instances that start together may
    /// all call it: it runs under a transaction-scoped advisory lock.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when the database cannot be reached or
    /// refuses (the role may not create tables, say).
    ///
    /// Example: the [module docs](self).
    pub async fn migrate(&self) -> Result<(), BackendError> {
        let mut client = self.inner.db.pool.get().await.map_err(pool_error)?;
        let transaction = client.transaction().await.map_err(pg_error)?;
        // "already exists, skipping" notices are no news on every start.
        transaction
            .batch_execute(
                "SET LOCAL client_min_messages = warning; \
                 SELECT pg_advisory_xact_lock(hashtext('tower-pinned-window migrate'))",
            )
            .await
            .map_err(pg_error)?;
        transaction
            .batch_execute(&self.inner.db.sql.migrate)
            .await
            .map_err(pg_error)?;
        transaction.commit().await.map_err(pg_error)
    }

    /// Delete at most `batch` expired rows, now, as the cleaner does, at
    /// most `batch` reset markers whose deadline passed over a second ago,
    /// and at most `batch` records of slots whose latest lease has run out;
    /// the number of rows deleted, all counted. Rows a hit holds are
    /// skipped, never waited for.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when the database cannot be reached.
    ///
    /// Example: the [module docs](self).
    pub async fn clean_expired(&self, batch: NonZeroU32) -> Result<u64, BackendError> {
        self.inner.db.clean_expired(batch).await
    }

    /// The backstop: scan the table for rows that no hit may count (which
    /// only a hand-written row, or a table whose `CHECK` constraints were
    /// dropped, can hold), and count the rows waiting for the cleaner. Rows
    /// with no usable deadline are reported in
    /// [`AuditReport::without_lifetime`], rows with a bad count in
    /// [`AuditReport::corrupt`], each named as [`BackendError::Corrupt`]
    /// names it. With `repair`, each such row that has a usable count but no
    /// usable deadline gets one, `repair` from now, in one statement that
    /// checks the row again; its count is kept. Rows with a bad count are
    /// never touched: inspect them.
    ///
    /// The slots' table is scanned too: each record no take may change (see
    /// [requests in flight](self#requests-in-flight)) is listed in
    /// [`AuditReport::corrupt`], and also in
    /// [`AuditReport::without_lifetime`] when its `expires_at` is not usable;
    /// records are never repaired, and not counted in `scanned` or
    /// `expired` (which count counters).
    ///
    /// It reads the whole of both tables: run it from a job, not on a request.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when the database cannot be reached.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_pinned_window::Window;
    /// use tower_pinned_window_postgres::PostgresBackend;
    ///
    /// let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1:5432/test").await?;
    /// let report = backend
    ///     .audit(Some(Window::new(Duration::from_secs(3600))?))
    ///     .await?;
    /// for row in &report.without_lifetime {
    ///     println!("{row}: repaired {}", report.repaired.contains(row));
    /// }
    /// for row in &report.corrupt {
    ///     println!("{row}: corrupt, left as it is");
    /// }
    /// if !report.is_clean() {
    ///     std::process::exit(1);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn audit(&self, repair: Option<Window>) -> Result<AuditReport, BackendError> {
        audit::run(&self.inner.db, repair).await
    }

    fn describe(&self, namespace: &str, key: &Key) -> String {
        describe(&self.inner.db.sql.table, namespace, key.as_bytes())
    }

    async fn refund_in_window(
        &self,
        namespace: &str,
        key: &Key,
        expires_at: SystemTime,
    ) -> Result<bool, BackendError> {
        let client = self.inner.db.pool.get().await.map_err(pool_error)?;
        let statement = client
            .prepare_cached(&self.inner.db.sql.refund)
            .await
            .map_err(pg_error)?;
        let refunded = client
            .execute(&statement, &[&namespace, &key.as_bytes(), &expires_at])
            .await
            .map_err(pg_error)?;
        Ok(refunded == 1)
    }

    fn start_cleaner(&self) {
        if self.inner.cleaner.get().is_none()
            && let Some((every, batch)) = self.inner.clean
        {
            self.inner
                .cleaner
                .get_or_init(|| cleaner::spawn(Arc::downgrade(&self.inner.db), every, batch));
        }
    }
}

fn pool(url: &str, size: Option<usize>) -> Result<Pool, BackendError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(pg_error)?;
    if config.get_application_name().is_none() {
        config.application_name("tower-pinned-window");
    }
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let mut builder = Pool::builder(manager)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)));
    if let Some(size) = size {
        builder = builder.max_size(size);
    }
    builder
        .build()
        .map_err(|err| BackendError::Unavailable(Box::new(err)))
}

impl Backend for PostgresBackend {
    type Future = BackendFuture<Hits>;
    type Refund = BackendFuture<bool>;

    /// The counters go out in the next hit statement (see the module docs),
    /// one row each; a counter in the local deny cache answers at once, and
    /// then none of them is sent.
    fn hit_all(&self, key: &Key, counters: &[Counter<'_>]) -> BackendFuture<Hits> {
        if let Some(denied) = self.denied_hit(key, counters) {
            // Denied here, with no statement; the counters are not hit.
            return denied;
        }
        let backend = self.clone();
        let limits: Vec<(u64, bool)> = counters
            .iter()
            .map(|c| (c.quota.limit(), c.lowers))
            .collect();
        let namespaces: Vec<Box<str>> = counters.iter().map(|c| c.namespace.into()).collect();
        let denied_key = key.clone();
        let mut receivers = Vec::with_capacity(counters.len());
        let mut pending = Vec::with_capacity(counters.len());
        for counter in counters {
            let (reply, receiver) = oneshot::channel();
            receivers.push(receiver);
            pending.push(Pending {
                namespace: counter.namespace.into(),
                key: key.clone(),
                // Window::MAX keeps every window inside i64 milliseconds.
                window_ms: counter.quota.window().as_millis() as i64,
                reply,
            });
        }
        BackendFuture::calling(async move {
            // Queued on the first poll, on the runtime that polls it: a hit
            // dropped before then is never sent.
            let queued = std::time::Instant::now();
            backend.start_cleaner();
            batch::submit(&backend.inner.batcher, pending);
            let mut hits = Hits::with_capacity(receivers.len());
            for ((receiver, namespace), (limit, lowers)) in
                receivers.into_iter().zip(namespaces).zip(limits)
            {
                let counted = receiver.await.unwrap_or_else(|_| {
                    Err(BackendError::Unavailable(
                        "the PostgreSQL sender stopped before answering".into(),
                    ))
                })?;
                let hit = counted.hit();
                if let Some(deny) = backend.inner.deny.as_ref().filter(|_| hit.count > limit) {
                    // From when the hit was queued, before the database read
                    // its clock: the entry never outlasts the window.
                    let key = denied_key.as_bytes();
                    deny.remember(
                        &namespace,
                        key,
                        queued,
                        hit.reset,
                        Denied::AtLimit { limit },
                        lowers,
                    );
                }
                hits.push(hit);
            }
            Ok(hits)
        })
    }

    /// One `UPDATE` ([`refund.sql`](self#refunds)) that takes one off the
    /// count only in the row whose `expires_at` is the hit's deadline, while
    /// that window is open, the count is positive and no reset marker names
    /// that deadline. A hit with no deadline
    /// (answered by the deny cache) is not sent. The counter is dropped from
    /// this instance's deny cache, so its next hit asks the database again.
    fn refund(&self, namespace: &str, key: &Key, hit: &Hit) -> BackendFuture<bool> {
        let Some(deadline) = hit.deadline else {
            return BackendFuture::answered(Ok(false));
        };
        let (backend, namespace, key) = (self.clone(), namespace.to_owned(), key.clone());
        BackendFuture::calling(async move {
            let refunded = backend
                .refund_in_window(&namespace, &key, deadline_time(deadline))
                .await;
            if let Some(deny) = &backend.inner.deny {
                deny.forget_hit(&namespace, key.as_bytes());
            }
            refunded
        })
    }

    async fn peek(&self, namespace: &str, key: &Key) -> Result<Option<Hit>, BackendError> {
        self.start_cleaner();
        let client = self.inner.db.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_opt(
                self.inner.db.sql.peek.as_str(),
                &[&namespace, &key.as_bytes()],
            )
            .await
            .map_err(pg_error)?;
        match row {
            None => Ok(None),
            Some(row) => read_row(&row).map_err(|detail| BackendError::Corrupt {
                key: self.describe(namespace, key),
                detail,
            }),
        }
    }

    async fn reset(&self, namespace: &str, key: &Key) -> Result<bool, BackendError> {
        if let Some(deny) = &self.inner.deny {
            deny.forget(namespace, key.as_bytes());
        }
        let client = self.inner.db.pool.get().await.map_err(pool_error)?;
        let row = client
            .query_opt(
                self.inner.db.sql.reset.as_str(),
                &[&namespace, &key.as_bytes()],
            )
            .await
            .map_err(pg_error)?;
        Ok(row.is_some_and(|row| row.get::<_, Option<bool>>(0).unwrap_or(true)))
    }
}

impl Spending for PostgresBackend {
    /// Queued with the spends and amends in flight, and decided in the next
    /// batch's transaction ([spends](self#spends-and-amends)); a counter the
    /// local deny cache knows to deny every spend answers at once, and then
    /// nothing is sent.
    fn spend_all(&self, key: &Key, counters: &[Counter<'_>], spend: Spend) -> BackendFuture<Hits> {
        if counters.is_empty() {
            return BackendFuture::answered(Ok(Hits::new()));
        }
        if let Some(denied) = self.denied_spend(key, counters, spend) {
            return denied;
        }
        let backend = self.clone();
        let lowers: SmallVec<[bool; 2]> = counters.iter().map(|c| c.lowers).collect();
        let (reply, receiver) = oneshot::channel();
        let request = Request {
            key: key.clone(),
            op: Op::Spend {
                counters: counters
                    .iter()
                    .map(|c| (c.namespace.into(), c.quota))
                    .collect(),
                spend,
                reply,
            },
        };
        BackendFuture::calling(async move {
            // Queued on the first poll, on the runtime that polls it: a
            // spend dropped before then is never sent.
            let queued = std::time::Instant::now();
            backend.start_cleaner();
            let key = request.key.clone();
            let namespaces: SmallVec<[Box<str>; 2]> = match &request.op {
                Op::Spend { counters, .. } => counters.iter().map(|(n, _)| n.clone()).collect(),
                Op::Amend { .. } => SmallVec::new(),
            };
            batch::submit(&backend.inner.spender, [request]);
            let Spent { hits, cache } = receiver.await.unwrap_or_else(|_| {
                Err(BackendError::Unavailable(
                    "the PostgreSQL sender stopped before answering".into(),
                ))
            })?;
            backend.remember(&key, &namespaces, &cache, &lowers, queued);
            Ok(hits)
        })
    }

    /// Queued with the spends and amends in flight, and applied in the
    /// next batch's transaction, only in the row whose `expires_at` is the
    /// hit's deadline while that window is open and no reset marker names
    /// that deadline; a clear leaves such a marker in the same transaction.
    /// A hit with no deadline is not sent. The counter is dropped from this
    /// instance's deny cache.
    fn amend(&self, namespace: &str, key: &Key, hit: &Hit, amend: Amend) -> BackendFuture<bool> {
        let nothing = matches!(amend, Amend::Refund(0) | Amend::Charge(0));
        let (Some(deadline), false) = (hit.deadline, nothing) else {
            return BackendFuture::answered(Ok(false));
        };
        let backend = self.clone();
        let (reply, receiver) = oneshot::channel();
        let request = Request {
            key: key.clone(),
            op: Op::Amend {
                namespace: namespace.into(),
                expires_at: deadline_time(deadline),
                amend,
                reply,
            },
        };
        let namespace: Box<str> = namespace.into();
        BackendFuture::calling(async move {
            backend.start_cleaner();
            let key = request.key.clone();
            batch::submit(&backend.inner.spender, [request]);
            let changed = receiver.await.unwrap_or_else(|_| {
                Err(BackendError::Unavailable(
                    "the PostgreSQL sender stopped before answering".into(),
                ))
            });
            if let Some(deny) = &backend.inner.deny {
                deny.forget(&namespace, key.as_bytes());
            }
            changed
        })
    }
}

/// Limits in their own table beside the counters' (`{table}_limits`, made
/// by [`migrate`](PostgresBackend::migrate); never `UNLOGGED`: a limit is
/// configuration), one row per layer and scope: a set is one statement (an
/// upsert, or a `DELETE`), a read one `SELECT`. A stored value that is not
/// a limit is left out and counted ([`StoredLimits::corrupt`]). Never
/// touches a counter.
impl Limits for PostgresBackend {
    fn set_limit(
        &self,
        layer: &str,
        scope: LimitScope<'_>,
        quota: Option<Quota>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'static {
        let (backend, layer) = (self.clone(), layer.to_owned());
        let scope = tower_pinned_window::backend::encode_scope(scope);
        async move { limit::set(&backend.inner.db, &layer, &scope, quota).await }
    }

    fn limits(
        &self,
        layer: &str,
    ) -> impl Future<Output = Result<StoredLimits, BackendError>> + Send + 'static {
        let (backend, layer) = (self.clone(), layer.to_owned());
        async move { limit::read(&backend.inner.db, &layer).await }
    }
}

/// Each step is one statement on the counter's row
/// ([the provider's word](self#the-providers-word)), sent at once: not
/// batched, since a provider speaks rarely.
impl Heeding for PostgresBackend {
    /// `sql/close.sql`: the row's `blocked_until`, the lockout a spend sets
    /// and reads, raised to `now + span` and never lowered; a missing row
    /// made a closed window with that lockout. Once the database has
    /// answered, this instance's deny cache holds the lockout until the end
    /// the database named, so its spends on the counter are refused here,
    /// with the new end, without a statement; other instances learn it from
    /// their next spend that reaches the database.
    fn close(
        &self,
        namespace: &str,
        key: &Key,
        span: Window,
    ) -> impl Future<Output = Result<Duration, BackendError>> + Send + 'static + use<> {
        let (backend, namespace, key) = (self.clone(), namespace.to_owned(), key.clone());
        async move {
            backend.start_cleaner();
            let sent = std::time::Instant::now();
            let left = heed::close(&backend.inner.db, &namespace, &key, span).await?;
            if let Some(deny) = &backend.inner.deny {
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

    /// `sql/raise.sql`: an `INSERT ... ON CONFLICT DO UPDATE` that raises a
    /// live row's count and keeps its `expires_at`, or opens a window for a
    /// missing (or closed) one. A raise never lowers a count, so what this
    /// instance's deny cache holds stays true: it is left as it is.
    fn raise(
        &self,
        key: &Key,
        counter: Counter<'_>,
        count: u64,
        within: Window,
    ) -> impl Future<Output = Result<Hit, BackendError>> + Send + 'static + use<> {
        let (backend, namespace, key) = (self.clone(), counter.namespace.to_owned(), key.clone());
        let raise = heed::Raise {
            count,
            limit: counter.quota.limit(),
            window: counter.quota.window(),
            within,
        };
        async move {
            backend.start_cleaner();
            heed::raise(&backend.inner.db, &namespace, &key, raise).await
        }
    }
}

impl Leasing for PostgresBackend {
    type Take = BackendFuture<Taken>;

    /// One statement on the key's record of slots
    /// ([requests in flight](self#requests-in-flight)).
    fn take(&self, key: &Key, cap: Cap<'_>, slot: SlotId) -> BackendFuture<Taken> {
        let (backend, namespace, key) = (self.clone(), cap.namespace.into(), key.clone());
        BackendFuture::calling(async move {
            backend.start_cleaner();
            lease::take(
                Arc::clone(&backend.inner.db),
                namespace,
                key,
                cap.in_flight,
                slot,
            )
            .await
        })
    }

    /// One transaction, sent in one round trip, on the key's record of
    /// slots and the counters' rows
    /// ([requests in flight](self#requests-in-flight)); a request the local
    /// deny cache denies (as [`hit_all`](Backend::hit_all) or
    /// [`spend_all`](Spending::spend_all) would be denied) answers at once,
    /// with no slot taken and nothing sent.
    fn take_all(
        &self,
        key: &Key,
        cap: Cap<'_>,
        slot: SlotId,
        counters: &[Counter<'_>],
        spend: Option<Spend>,
    ) -> BackendFuture<Hits> {
        let denied = match spend {
            None => self.denied_hit(key, counters),
            Some(spend) => self.denied_spend(key, counters, spend),
        };
        if let Some(denied) = denied {
            // Denied here: no slot taken, no counter counted.
            return denied;
        }
        let backend = self.clone();
        let lowers: SmallVec<[bool; 2]> = counters.iter().map(|c| c.lowers).collect();
        let step = take_all::Step {
            namespace: cap.namespace.into(),
            key: key.clone(),
            cap: cap.in_flight,
            slot,
            counters: counters
                .iter()
                .map(|c| (c.namespace.into(), c.quota))
                .collect(),
            spend,
        };
        BackendFuture::calling(async move {
            // From the first poll, before the database read its clock: a
            // denial remembered never outlasts its window.
            let queued = std::time::Instant::now();
            backend.start_cleaner();
            let key = step.key.clone();
            let namespaces: SmallVec<[Box<str>; 2]> =
                step.counters.iter().map(|(n, _)| n.clone()).collect();
            let Spent { hits, cache } = take_all::run(Arc::clone(&backend.inner.db), step).await?;
            backend.remember(&key, &namespaces, &cache, &lowers, queued);
            Ok(hits)
        })
    }

    /// One `UPDATE` of the key's record: the slot is taken out when it is
    /// there with a live lease.
    fn give_back(
        &self,
        namespace: &str,
        key: &Key,
        slot: SlotId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send + 'static + use<> {
        let (backend, namespace, key) = (self.clone(), namespace.into(), key.clone());
        async move {
            backend.start_cleaner();
            lease::give_back(Arc::clone(&backend.inner.db), namespace, key, slot).await
        }
    }

    /// One statement for every slot of `held`, whatever their keys: the
    /// records are locked in one order, so two extends never deadlock. A
    /// record that is not of the store's shape fails the call with
    /// [`BackendError::Corrupt`] (named), after the others were extended.
    fn extend(
        &self,
        held: &[Held<'_>],
        lease: Window,
    ) -> impl Future<Output = Result<u64, BackendError>> + Send + 'static + use<> {
        let backend = self.clone();
        let held: Vec<lease::HeldSlot> = held
            .iter()
            .map(|h| (h.namespace.into(), h.key.clone(), h.slot.to_string()))
            .collect();
        async move {
            backend.start_cleaner();
            lease::extend(Arc::clone(&backend.inner.db), held, lease).await
        }
    }

    async fn in_use(&self, namespace: &str, key: &Key) -> Result<u64, BackendError> {
        self.start_cleaner();
        lease::in_use(&self.inner.db, namespace, key).await
    }
}

impl PostgresBackend {
    /// The local deny cache's answer to a hit of `counters`, when it knows
    /// one of them over its limit: nothing is sent then, and nothing
    /// counted.
    fn denied_hit(&self, key: &Key, counters: &[Counter<'_>]) -> Option<BackendFuture<Hits>> {
        let deny = self.inner.deny.as_ref()?;
        let now = std::time::Instant::now();
        BackendFuture::denied(counters, 1, |c| {
            deny.hit(c.namespace, key.as_bytes(), c.quota.limit(), now)
        })
    }

    /// What the local deny cache learns from a request's answer, one entry
    /// per counter (`cache`), held from `queued`: when the request was
    /// queued, before the database read its clock, so an entry never
    /// outlasts the window or the lockout.
    fn remember(
        &self,
        key: &Key,
        namespaces: &[Box<str>],
        cache: &[Option<Cached>],
        lowers: &[bool],
        queued: std::time::Instant,
    ) {
        let Some(deny) = &self.inner.deny else {
            return;
        };
        for ((namespace, cached), &lowers) in namespaces.iter().zip(cache).zip(lowers) {
            let (denied, left) = match *cached {
                Some(Cached::Over(left, limit)) => (Denied::AtLimit { limit }, left),
                Some(Cached::Locked(left)) => (Denied::Locked, left),
                None => continue,
            };
            deny.remember(namespace, key.as_bytes(), queued, left, denied, lowers);
        }
    }

    /// The local deny cache's answer to a spend, when it knows one of its
    /// counters denies every spend: locked out, or (for a spend that would
    /// not lock it out) at its limit until its window closes. Nothing is
    /// sent then, and nothing counted.
    fn denied_spend(
        &self,
        key: &Key,
        counters: &[Counter<'_>],
        spend: Spend,
    ) -> Option<BackendFuture<Hits>> {
        let deny = self.inner.deny.as_ref()?;
        let now = std::time::Instant::now();
        BackendFuture::denied_spend(counters, spend, |c| {
            deny.spend(
                c.namespace,
                key.as_bytes(),
                c.quota.limit(),
                now,
                spend.block.is_some(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::row::{WINDOW_BOUND_MS, deadline_id};
    use super::*;

    #[test]
    fn the_bound_is_window_max_and_deadlines_convert_exactly() {
        assert_eq!(WINDOW_BOUND_MS, 3_155_760_000_000);
        let at = UNIX_EPOCH + Duration::from_micros(1_764_543_210_123_456);
        assert_eq!(
            deadline_time(deadline_id(at).unwrap()),
            at,
            "exact to the microsecond"
        );
        assert_eq!(deadline_id(UNIX_EPOCH), None);
    }

    #[test]
    fn the_statement_attaches_the_deadline_only_when_it_opens_a_window() {
        // The deadline is written from `excluded` (the new window) only in the
        // branch that also starts the count over.
        const HIT_SQL: &str = include_str!("sql/hit.sql");
        let open = "WHEN c.expires_at <= statement_timestamp() THEN";
        assert_eq!(HIT_SQL.matches("excluded.expires_at").count(), 1);
        assert!(HIT_SQL.contains(&format!("{open} excluded.count\n")));
        assert!(HIT_SQL.contains(&format!("{open} excluded.expires_at\n")));
        assert!(HIT_SQL.contains("ELSE c.expires_at END"));
    }
}
