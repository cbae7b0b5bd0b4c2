//! The counters table: its validated name, and the SQL this backend runs
//! against it, rendered once when the backend is built.

use std::fmt;

use tower_pinned_window::ConfigError;

use super::row::WINDOW_BOUND_MS;

/// The schema used unless [`schema`](super::PostgresBackendBuilder::schema)
/// names another.
///
/// Example: [`PostgresBackendBuilder`](super::PostgresBackendBuilder).
pub const DEFAULT_SCHEMA: &str = "public";

/// The table used unless [`table`](super::PostgresBackendBuilder::table)
/// names another.
///
/// Example: [`PostgresBackendBuilder`](super::PostgresBackendBuilder).
pub const DEFAULT_TABLE: &str = "tpw_counters";

/// The longest schema name: PostgreSQL keeps 63 bytes of an identifier.
const MAX_SCHEMA_LEN: usize = 63;

/// The suffix of the table's `expires_at` index.
const INDEX_SUFFIX: &str = "_expires_at";

/// The suffix of the table of reset markers beside the counters table.
const RESETS_SUFFIX: &str = "_resets";

/// The suffix of the table of slots in flight beside the counters table.
const SLOTS_SUFFIX: &str = "_slots";

/// The suffix of the table of limits held in the store beside the counters
/// table.
const LIMITS_SUFFIX: &str = "_limits";

/// The suffix of the slots table's `expires_at` index (as long as the
/// counters' index suffix, so it fits wherever that one does).
const SLOTS_INDEX_SUFFIX: &str = "_slots_ends";

/// The longest table name: its index name (`{table}_expires_at`) must fit in
/// 63 bytes too (the reset markers' table, `{table}_resets`, the slots'
/// table, `{table}_slots`, and its index, `{table}_slots_ends`, are no
/// longer).
pub(super) const MAX_TABLE_LEN: usize = MAX_SCHEMA_LEN - INDEX_SUFFIX.len();

const _: () = assert!(MAX_TABLE_LEN + RESETS_SUFFIX.len() <= MAX_SCHEMA_LEN);
const _: () = assert!(MAX_TABLE_LEN + SLOTS_SUFFIX.len() <= MAX_SCHEMA_LEN);
const _: () = assert!(MAX_TABLE_LEN + LIMITS_SUFFIX.len() <= MAX_SCHEMA_LEN);
const _: () = assert!(MAX_TABLE_LEN + SLOTS_INDEX_SUFFIX.len() <= MAX_SCHEMA_LEN);

/// `name`, if it is a name this backend accepts for a schema or table: 1 to
/// `max` characters from `a-z 0-9 _`, not starting with a digit. Such a name
/// means the same quoted or not, so the SQL in the docs, `psql` and this
/// backend all agree on it; nothing is folded or changed.
pub(super) fn identifier(name: &str, max: usize) -> Result<&str, ConfigError> {
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= max
        && !bytes[0].is_ascii_digit()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_');
    if valid {
        Ok(name)
    } else {
        Err(ConfigError::InvalidSqlIdentifier(name.to_owned()))
    }
}

/// The SQL of every statement, for one table.
#[derive(Clone)]
pub(super) struct Sql {
    pub(super) table: String,
    pub(super) migrate: String,
    pub(super) hit: String,
    pub(super) peek: String,
    pub(super) reset: String,
    pub(super) clean: String,
    pub(super) refund: String,
    pub(super) audit: String,
    pub(super) stats: String,
    pub(super) repair: String,
    pub(super) spend_lock: String,
    pub(super) spend_read: String,
    pub(super) spend_write: String,
    /// The provider's word: a counter closed, a counter raised.
    pub(super) close: String,
    pub(super) raise: String,
    /// The slots' table, as `schema.table_slots`.
    pub(super) slots_table: String,
    pub(super) take: String,
    /// The first statement of a `take_all`'s transaction: the record locked.
    pub(super) take_lock: String,
    /// Then: the step decided and written.
    pub(super) take_all: String,
    /// And last before the `COMMIT`: a failed step rolled back.
    pub(super) take_end: String,
    pub(super) give_back: String,
    pub(super) extend: String,
    pub(super) in_use: String,
    pub(super) slots_audit: String,
    /// The limits held in the store (`schema.table_limits`): one set, one
    /// removed, a layer's read.
    pub(super) limit_set: String,
    pub(super) limit_remove: String,
    pub(super) limits: String,
}

impl fmt::Debug for Sql {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sql").field("table", &self.table).finish()
    }
}

impl Sql {
    /// The statements for `schema.table` (both already validated).
    pub(super) fn new(schema: &str, table: &str, unlogged: bool) -> Self {
        let qualified = format!("\"{schema}\".\"{table}\"");
        let render = |sql: &str| {
            // The fragment first: its own placeholders are rendered below.
            sql.replace("{slot_shape}", include_str!("sql/slot_shape.sql"))
                .replace("{table}", &qualified)
                .replace("{schema}", &format!("\"{schema}\""))
                .replace("{index}", &format!("\"{table}{INDEX_SUFFIX}\""))
                .replace(
                    "{resets}",
                    &format!("\"{schema}\".\"{table}{RESETS_SUFFIX}\""),
                )
                .replace(
                    "{slots}",
                    &format!("\"{schema}\".\"{table}{SLOTS_SUFFIX}\""),
                )
                .replace(
                    "{limits}",
                    &format!("\"{schema}\".\"{table}{LIMITS_SUFFIX}\""),
                )
                .replace("{slots_index}", &format!("\"{table}{SLOTS_INDEX_SUFFIX}\""))
                .replace("{window_bound_ms}", &WINDOW_BOUND_MS.to_string())
                .replace("{unlogged}", if unlogged { "UNLOGGED" } else { "" })
        };
        Self {
            table: format!("{schema}.{table}"),
            migrate: render(include_str!("sql/migrate.sql"))
                .replace("CREATE  TABLE", "CREATE TABLE"),
            hit: render(include_str!("sql/hit.sql")),
            peek: render(include_str!("sql/peek.sql")),
            reset: render(include_str!("sql/reset.sql")),
            clean: render(include_str!("sql/clean.sql")),
            refund: render(include_str!("sql/refund.sql")),
            audit: render(include_str!("sql/audit.sql")),
            stats: render(include_str!("sql/stats.sql")),
            repair: render(include_str!("sql/repair.sql")),
            spend_lock: render(include_str!("sql/spend_lock.sql")),
            spend_read: render(include_str!("sql/spend_read.sql")),
            spend_write: render(include_str!("sql/spend_write.sql")),
            close: render(include_str!("sql/close.sql")),
            raise: render(include_str!("sql/raise.sql")),
            slots_table: format!("{schema}.{table}{SLOTS_SUFFIX}"),
            take: render(include_str!("sql/take.sql")),
            take_lock: render(include_str!("sql/take_lock.sql")),
            take_all: render(include_str!("sql/take_all.sql")),
            take_end: render(include_str!("sql/take_end.sql")),
            give_back: render(include_str!("sql/give_back.sql")),
            extend: render(include_str!("sql/extend.sql")),
            in_use: render(include_str!("sql/in_use.sql")),
            slots_audit: render(include_str!("sql/slots_audit.sql")),
            limit_set: render(include_str!("sql/limit_set.sql")),
            limit_remove: render(include_str!("sql/limit_remove.sql")),
            limits: render(include_str!("sql/limits.sql")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_lowercase_words_that_fit() {
        let long_schema = "s".repeat(63);
        let long_table = "t".repeat(MAX_TABLE_LEN);
        let ok: &[(&str, &str, usize)] = &[
            ("simple", "counters", 63),
            ("underscore first", "_x", 63),
            ("digits after", "rate_limit_2", 63),
            ("63 bytes", &long_schema, 63),
            ("table at its bound", &long_table, MAX_TABLE_LEN),
        ];
        for (case, name, max) in ok {
            assert_eq!(identifier(name, *max), Ok(*name), "{case}");
        }
        let too_long = "t".repeat(MAX_TABLE_LEN + 1);
        let bad: &[(&str, &str, usize)] = &[
            ("empty", "", 63),
            ("digit first", "1abc", 63),
            ("upper case (folded by SQL, not by us)", "Counters", 63),
            ("a quote", "a\"b", 63),
            ("a dot", "public.t", 63),
            ("a space", "a b", 63),
            ("a semicolon", "t;drop", 63),
            ("a dash", "a-b", 63),
            ("non-ASCII", "zähler", 63),
            ("a NUL", "a\0", 63),
            ("past the table bound", &too_long, MAX_TABLE_LEN),
            ("64 bytes", &"s".repeat(64), 63),
        ];
        for (case, name, max) in bad {
            assert_eq!(
                identifier(name, *max),
                Err(ConfigError::InvalidSqlIdentifier((*name).to_owned())),
                "{case}"
            );
        }
    }

    #[test]
    fn the_sql_names_the_table_quoted_everywhere() {
        let sql = Sql::new("rate", "hits", false);
        assert_eq!(sql.table, "rate.hits");
        for (name, text) in [
            ("hit", &sql.hit),
            ("peek", &sql.peek),
            ("reset", &sql.reset),
            ("clean", &sql.clean),
            ("refund", &sql.refund),
            ("audit", &sql.audit),
            ("stats", &sql.stats),
            ("repair", &sql.repair),
            ("migrate", &sql.migrate),
            ("spend_lock", &sql.spend_lock),
            ("spend_read", &sql.spend_read),
            ("spend_write", &sql.spend_write),
            ("take_all", &sql.take_all),
            ("close", &sql.close),
            ("raise", &sql.raise),
        ] {
            assert!(text.contains("\"rate\".\"hits\""), "{name}: {text}");
            let left = text.replace("{batch}", "");
            assert!(!left.contains('{'), "{name}: a placeholder is left: {text}");
        }
        assert!(sql.migrate.contains("CREATE TABLE IF NOT EXISTS"));
        assert!(sql.migrate.contains("\"hits_expires_at\""));
        for (name, text) in [
            ("migrate", &sql.migrate),
            ("reset", &sql.reset),
            ("clean", &sql.clean),
            ("refund", &sql.refund),
            ("spend_read", &sql.spend_read),
            ("spend_write", &sql.spend_write),
        ] {
            assert!(
                text.contains("\"rate\".\"hits_resets\""),
                "{name}: the reset markers"
            );
        }
        for (name, text) in [("take_lock", &sql.take_lock), ("take_all", &sql.take_all)] {
            assert!(
                text.contains("\"rate\".\"hits_slots\""),
                "{name}: the slots"
            );
            assert!(!text.contains('{'), "{name}: a placeholder is left: {text}");
        }
        assert!(
            !sql.hit.contains("hits_resets"),
            "hits never read the markers"
        );
        let unlogged = Sql::new("rate", "hits", true);
        assert!(
            unlogged
                .migrate
                .contains("CREATE UNLOGGED TABLE IF NOT EXISTS")
        );
    }

    #[test]
    fn the_slots_statements_name_their_table_and_check_each_record() {
        let sql = Sql::new("rate", "hits", false);
        assert_eq!(sql.slots_table, "rate.hits_slots");
        for (name, text) in [
            ("take", &sql.take),
            ("give_back", &sql.give_back),
            ("extend", &sql.extend),
            ("in_use", &sql.in_use),
            ("slots_audit", &sql.slots_audit),
            ("clean", &sql.clean),
        ] {
            assert!(text.contains("\"rate\".\"hits_slots\""), "{name}: {text}");
            assert!(
                text.contains("cardinality(c.slots) = cardinality(c.leases)")
                    && text.contains("3155760000000 * interval"),
                "{name}: the record's shape is checked, with the bound: {text}"
            );
            let left = text.replace("{batch}", "");
            assert!(!left.contains('{'), "{name}: a placeholder is left: {text}");
        }
        assert!(
            sql.migrate
                .contains("CREATE TABLE IF NOT EXISTS \"rate\".\"hits_slots\"")
        );
        assert!(
            sql.migrate
                .contains("\"hits_slots_ends\" ON \"rate\".\"hits_slots\"")
        );
        for (name, text) in [
            ("hit", &sql.hit),
            ("peek", &sql.peek),
            ("reset", &sql.reset),
            ("refund", &sql.refund),
            ("spend_lock", &sql.spend_lock),
            ("spend_read", &sql.spend_read),
            ("spend_write", &sql.spend_write),
            ("close", &sql.close),
            ("raise", &sql.raise),
        ] {
            assert!(
                !text.contains("hits_slots"),
                "{name}: counters never meet slots"
            );
        }
        // A take raises the record's lifetime, never lowers it; extends lock
        // their records in one order.
        assert!(
            sql.take
                .contains("THEN greatest(c.expires_at, excluded.expires_at)")
        );
        assert!(
            sql.extend
                .contains("ORDER BY c.namespace, c.key\n    FOR UPDATE OF c")
        );
        let unlogged = Sql::new("rate", "hits", true);
        assert!(
            unlogged
                .migrate
                .contains("CREATE UNLOGGED TABLE IF NOT EXISTS \"rate\".\"hits_slots\"")
        );
    }

    #[test]
    fn the_limits_statements_name_their_table_and_it_is_never_unlogged() {
        let sql = Sql::new("rate", "hits", true);
        for (name, text) in [
            ("limit_set", &sql.limit_set),
            ("limit_remove", &sql.limit_remove),
            ("limits", &sql.limits),
        ] {
            assert!(text.contains("\"rate\".\"hits_limits\""), "{name}: {text}");
            assert!(!text.contains('{'), "{name}: a placeholder is left: {text}");
        }
        assert!(
            sql.migrate
                .contains("CREATE TABLE IF NOT EXISTS \"rate\".\"hits_limits\""),
            "limits are configuration: logged even when the counters are not"
        );
        for (name, text) in [
            ("hit", &sql.hit),
            ("reset", &sql.reset),
            ("clean", &sql.clean),
            ("spend_write", &sql.spend_write),
        ] {
            assert!(
                !text.contains("hits_limits"),
                "{name}: counters never meet limits"
            );
        }
    }
}
