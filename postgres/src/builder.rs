//! The builder of a [`PostgresBackend`]: its table, its cleaner, its deny
//! cache, checked as they are set.

use std::fmt;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tower_pinned_window::ConfigError;
use tower_pinned_window::backend::toolkit::Denials;

use crate::db::Db;
use crate::table::{MAX_TABLE_LEN, Sql, identifier};
use crate::{
    DEFAULT_CLEAN_BATCH, DEFAULT_CLEAN_EVERY, DEFAULT_DENY_CACHE, DEFAULT_DENY_CACHE_RECHECK,
    DEFAULT_SCHEMA, DEFAULT_STATEMENTS, DEFAULT_TABLE, PostgresBackend,
};

/// Builds a [`PostgresBackend`].
///
/// # Examples
///
/// Nothing connects before the first hit, so a backend can be built, and
/// its SQL read, with no database up:
///
/// ```
/// use std::num::{NonZeroU32, NonZeroUsize};
/// use std::time::Duration;
/// use tower_pinned_window_postgres::{
///     DEFAULT_SCHEMA, PostgresBackend, deadpool_postgres, tokio_postgres,
/// };
///
/// let config: tokio_postgres::Config = "postgres://postgres@127.0.0.1:5432/test".parse()?;
/// let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
/// let pool = deadpool_postgres::Pool::builder(manager).max_size(8).build()?;
/// let backend = PostgresBackend::builder(pool)
///     .schema(DEFAULT_SCHEMA)
///     .table("api_limits")
///     .statements(NonZeroUsize::new(2).unwrap())
///     .clean_every(Duration::from_secs(5))
///     .clean_batch(NonZeroU32::new(500).unwrap())
///     .deny_cache(10_000)
///     .deny_cache_recheck(Duration::from_millis(50))
///     .build();
/// assert_eq!(backend.table(), "public.api_limits");
/// assert!(backend.migration_sql().contains("CREATE TABLE IF NOT EXISTS \"public\".\"api_limits\""));
/// assert_eq!(backend.pool().status().max_size, 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct PostgresBackendBuilder {
    pool: Pool,
    statements: NonZeroUsize,
    deny_cache: usize,
    deny_cache_recheck: Duration,
    schema: String,
    table: String,
    unlogged: bool,
    clean: Option<(Duration, NonZeroU32)>,
}

impl fmt::Debug for PostgresBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackendBuilder")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("unlogged", &self.unlogged)
            .field("statements", &self.statements)
            .field("deny_cache", &self.deny_cache)
            .field("deny_cache_recheck", &self.deny_cache_recheck)
            .field("clean", &self.clean)
            .finish_non_exhaustive()
    }
}

impl PostgresBackendBuilder {
    /// The defaults, on `pool` ([`PostgresBackend::builder`]).
    pub(crate) fn new(pool: Pool) -> Self {
        Self {
            pool,
            statements: NonZeroUsize::new(DEFAULT_STATEMENTS).expect("not zero"),
            deny_cache: DEFAULT_DENY_CACHE,
            deny_cache_recheck: DEFAULT_DENY_CACHE_RECHECK,
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            unlogged: false,
            clean: Some((DEFAULT_CLEAN_EVERY, default_batch())),
        }
    }

    /// The schema of the table (default [`DEFAULT_SCHEMA`]): 1 to 63
    /// characters from `a-z 0-9 _`, not starting with a digit, so that it
    /// reads the same quoted or not.
    ///
    /// # Panics
    /// On any other name, like `HeaderValue::from_static`; see
    /// [`try_schema`](Self::try_schema).
    ///
    /// Example: [`PostgresBackendBuilder`].
    #[track_caller]
    pub fn schema(self, name: &str) -> Self {
        match self.try_schema(name) {
            Ok(builder) => builder,
            Err(err) => panic!("{err}"),
        }
    }

    /// [`schema`](Self::schema), for a name read from configuration.
    ///
    /// # Errors
    /// [`ConfigError::InvalidSqlIdentifier`] for a name `schema` rejects.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn try_schema(mut self, name: &str) -> Result<Self, ConfigError> {
        self.schema = identifier(name, 63)?.to_owned();
        Ok(self)
    }

    /// The table's name (default [`DEFAULT_TABLE`]): 1 to 52 characters from
    /// `a-z 0-9 _`, not starting with a digit (its index is named
    /// `{table}_expires_at`, and PostgreSQL keeps 63 bytes of a name).
    ///
    /// # Panics
    /// On any other name; see [`try_table`](Self::try_table).
    ///
    /// Example: [`PostgresBackendBuilder`].
    #[track_caller]
    pub fn table(self, name: &str) -> Self {
        match self.try_table(name) {
            Ok(builder) => builder,
            Err(err) => panic!("{err}"),
        }
    }

    /// [`table`](Self::table), for a name read from configuration.
    ///
    /// # Errors
    /// [`ConfigError::InvalidSqlIdentifier`] for a name `table` rejects.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn try_table(mut self, name: &str) -> Result<Self, ConfigError> {
        self.table = identifier(name, MAX_TABLE_LEN)?.to_owned();
        Ok(self)
    }

    /// Whether [`migrate`](PostgresBackend::migrate) creates an `UNLOGGED`
    /// table (default `false`): faster hits, but **emptied after a database
    /// crash**, which hands every client a fresh window, and not replicated.
    /// It changes only the table `migrate` creates, not an existing one.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn unlogged(mut self, unlogged: bool) -> Self {
        self.unlogged = unlogged;
        self
    }

    /// How often the cleaner looks for expired rows (default
    /// [`DEFAULT_CLEAN_EVERY`]).
    ///
    /// # Panics
    /// On a zero interval; see [`try_clean_every`](Self::try_clean_every).
    ///
    /// Example: [`PostgresBackendBuilder`].
    #[track_caller]
    pub fn clean_every(self, every: Duration) -> Self {
        match self.try_clean_every(every) {
            Ok(builder) => builder,
            Err(err) => panic!("{err}"),
        }
    }

    /// [`clean_every`](Self::clean_every), for a value read from
    /// configuration. It turns the cleaner back on after
    /// [`no_cleaner`](Self::no_cleaner).
    ///
    /// # Errors
    /// [`ConfigError::ZeroCleanInterval`] for zero.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn try_clean_every(mut self, every: Duration) -> Result<Self, ConfigError> {
        if every.is_zero() {
            return Err(ConfigError::ZeroCleanInterval);
        }
        let batch = self.clean.map_or(default_batch(), |(_, batch)| batch);
        self.clean = Some((every, batch));
        Ok(self)
    }

    /// The most rows one cleaner statement deletes (default
    /// [`DEFAULT_CLEAN_BATCH`]); a smaller batch holds its row locks for less
    /// time. A full batch is followed at once by another.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn clean_batch(mut self, batch: NonZeroU32) -> Self {
        let every = self.clean.map_or(DEFAULT_CLEAN_EVERY, |(every, _)| every);
        self.clean = Some((every, batch));
        self
    }

    /// How many hit statements this instance runs at once (default
    /// [`DEFAULT_STATEMENTS`], and never more than the pool has
    /// connections), and as many transactions of spends and amends. Hits
    /// that arrive while they are all running are sent together in the next
    /// statement, up to 128 counters in one; spends and amends in the next
    /// transaction, up to 128 requests ([spends](crate#spends-and-amends)). More
    /// statements at once lower the latency a hit can wait for its turn;
    /// fewer make bigger statements, which cost the database less per hit.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn statements(mut self, statements: NonZeroUsize) -> Self {
        self.statements = statements;
        self
    }

    /// How many denied counters this instance remembers (default
    /// [`DEFAULT_DENY_CACHE`]), and as many locked-out ones; 0 turns the local
    /// deny cache off. See [the module docs](crate#the-local-deny-cache).
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// The longest a denial of a counter that can go down (a
    /// [`Counter::lowers`](tower_pinned_window::backend::Counter::lowers): a layer with a `reserve`, a `count_if` or a
    /// `reset_if`) is held here before the database is asked again
    /// (default [`DEFAULT_DENY_CACHE_RECHECK`]); a counter that only goes
    /// up is held until its window closes. See [the module
    /// docs](crate#the-local-deny-cache).
    ///
    /// # Panics
    /// On zero (turn the cache off with [`deny_cache(0)`](Self::deny_cache)
    /// instead); see [`try_deny_cache_recheck`](Self::try_deny_cache_recheck).
    ///
    /// Example: [`PostgresBackendBuilder`].
    #[track_caller]
    pub fn deny_cache_recheck(self, recheck: Duration) -> Self {
        match self.try_deny_cache_recheck(recheck) {
            Ok(builder) => builder,
            Err(err) => panic!("{err}"),
        }
    }

    /// [`deny_cache_recheck`](Self::deny_cache_recheck), for a value read
    /// from configuration.
    ///
    /// # Errors
    /// [`ConfigError::ZeroDenyCacheRecheck`] for zero.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn try_deny_cache_recheck(mut self, recheck: Duration) -> Result<Self, ConfigError> {
        if recheck.is_zero() {
            return Err(ConfigError::ZeroDenyCacheRecheck);
        }
        self.deny_cache_recheck = recheck;
        Ok(self)
    }

    /// No cleaner on this instance: expired rows stay until a hit on their
    /// key reuses them, or another instance's cleaner (or
    /// [`PostgresBackend::clean_expired`]) deletes them.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn no_cleaner(mut self) -> Self {
        self.clean = None;
        self
    }

    /// The backend. Its cleaner starts with the first hit (on the runtime
    /// that polls it); nothing connects before then.
    ///
    /// Example: [`PostgresBackendBuilder`].
    pub fn build(self) -> PostgresBackend {
        let connections =
            NonZeroUsize::new(self.pool.status().max_size).unwrap_or(NonZeroUsize::MIN);
        let db = Arc::new(Db {
            pool: self.pool,
            sql: Sql::new(&self.schema, &self.table, self.unlogged),
        });
        let deny =
            (self.deny_cache > 0).then(|| Denials::new(self.deny_cache, self.deny_cache_recheck));
        PostgresBackend::from_parts(db, self.statements.min(connections), deny, self.clean)
    }
}

fn default_batch() -> NonZeroU32 {
    NonZeroU32::new(DEFAULT_CLEAN_BATCH).expect("the default batch is not zero")
}
