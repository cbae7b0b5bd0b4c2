//! What an audit found: one report for the Redis and the PostgreSQL
//! backends.

/// What an audit found: [`RedisBackend::audit`] and
/// [`PostgresBackend::audit`] (each has an example) both answer one.
///
/// An audit is the backstop for state that no hit of this crate writes: a
/// counter with no lifetime, whose window would never close, and a value
/// that is not a counter at all. It reads every counter, lists what it
/// found, and, when given a repair window, gives each counter without a
/// lifetime that window, its count kept. A value that is not a counter is
/// never repaired, reset or deleted: a lifetime would make corrupt state
/// vanish, and a reset would hand out free attempts. Inspect it.
///
/// Each counter is named as [`BackendError::Corrupt`] names it, so a name
/// in the report is the one in the errors and the logs:
///
/// - Redis: the storage key (`tpw:login{203.0.113.7}`), escaped as
///   [`<[u8]>::escape_ascii`](slice::escape_ascii) writes it (a key this
///   crate wrote is printable ASCII, so only `\`, `'` and `"` gain a
///   backslash);
/// - PostgreSQL: the table, then the namespace and the escaped key as a
///   Redis storage key has them (`public.tpw_counters login{203.0.113.7}`).
///
/// [`RedisBackend::audit`]: https://docs.rs/tower-pinned-window-redis/latest/tower_pinned_window_redis/struct.RedisBackend.html#method.audit
/// [`PostgresBackend::audit`]: https://docs.rs/tower-pinned-window-postgres/latest/tower_pinned_window_postgres/struct.PostgresBackend.html#method.audit
/// [`BackendError::Corrupt`]: crate::backend::BackendError::Corrupt
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditReport {
    /// Servers scanned: every master of a Redis Cluster; 1 for a Redis
    /// server and for a PostgreSQL table.
    pub nodes: usize,
    /// Counters scanned: the keys under the prefix (Redis), the rows in the
    /// table (PostgreSQL).
    pub scanned: u64,
    /// Of those, counters whose window has closed and that wait to be
    /// deleted: the rows waiting for the PostgreSQL cleaner. Always 0 on
    /// Redis, which deletes a key when its lifetime ends.
    pub expired: u64,
    /// Counters with no usable lifetime, by name. On Redis, keys with no
    /// lifetime: such a counter counts on and its window never closes. On
    /// PostgreSQL, rows with no deadline, an infinite one, or one further
    /// away than [`Window::MAX`](crate::Window::MAX): hits on such a row
    /// fail with [`BackendError::Corrupt`](crate::backend::BackendError::Corrupt)
    /// until it is repaired.
    ///
    /// Corrupt values without a lifetime are listed here too, and in
    /// [`corrupt`](Self::corrupt).
    pub without_lifetime: Vec<String>,
    /// Of [`without_lifetime`](Self::without_lifetime), the counters this
    /// audit gave the repair window, by name: empty without one. A counter is
    /// repaired atomically, only if it still has no usable lifetime, and its
    /// count is kept.
    pub repaired: Vec<String>,
    /// Values that are not counters, by name, never repaired: on Redis, a
    /// key without a lifetime that holds another type or a string that is
    /// not a non-negative integer (read by the audit, with or without a
    /// repair window; a key with a lifetime is not read); on PostgreSQL, a
    /// row whose count is `NULL`, negative, or cannot grow, whatever its
    /// deadline.
    ///
    /// PostgreSQL lists at most 10,000 rows in all, in
    /// [`without_lifetime`](Self::without_lifetime) and here.
    pub corrupt: Vec<String>,
}

impl AuditReport {
    /// Whether the audit found nothing that needs a look: no counter without
    /// a lifetime, and nothing corrupt.
    ///
    /// Example: [`PostgresBackend::audit`](https://docs.rs/tower-pinned-window-postgres/latest/tower_pinned_window_postgres/struct.PostgresBackend.html#method.audit).
    pub fn is_clean(&self) -> bool {
        self.without_lifetime.is_empty() && self.corrupt.is_empty()
    }
}
