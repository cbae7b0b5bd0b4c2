-- tower-pinned-window: the counters table and the index its cleaner reads.
-- {table} is the schema-qualified, quoted table name; {unlogged} is empty or
-- UNLOGGED. Safe to run again: everything is created only if missing.
CREATE SCHEMA IF NOT EXISTS {schema};

CREATE {unlogged} TABLE IF NOT EXISTS {table} (
    -- The layer's name (or one of its quotas' names) and the client's key:
    -- two columns, so no byte of a key can reach another layer's counter.
    namespace  text        NOT NULL,
    key        bytea       NOT NULL,
    -- Hits counted in the current window; 0 only after every hit of the
    -- window was refunded.
    count      bigint      NOT NULL CHECK (count >= 0),
    -- When the window closes: set by the hit that opens it, never moved.
    expires_at timestamptz NOT NULL CHECK (isfinite(expires_at)),
    PRIMARY KEY (namespace, key)
) WITH (fillfactor = 80);

-- The cleaner deletes expired rows in bounded batches through this index.
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);

-- Added in the release with costs and lockouts (a table of an earlier
-- release is migrated in place; NULL for every existing row, no rewrite):
-- the end of the counter's lockout, set by the first denied spend with a
-- lockout and never extended by a spend (a close, the provider's word, may
-- move it later, never sooner); kept on the counter's row, so it never
-- meets another counter.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS blocked_until timestamptz
    CHECK (isfinite(blocked_until));

-- Added in the release with reset markers (created in place next to a table
-- of an earlier release): a window deleted while open (by a reset, or a
-- clear) leaves its deadline here until that deadline has passed. A window
-- opened later for the same key with the same expires_at (to the
-- microsecond) cannot be told from the deleted one by its hits' deadlines,
-- so no refund, charge or clear of that deadline is applied while its marker
-- is here: never the wrong window, at the price of the new window's own
-- amends. The primary key leads with expires_at: it serves both the amends'
-- lookup and the cleaner's scan of expired markers. Hits never read it.
CREATE {unlogged} TABLE IF NOT EXISTS {resets} (
    expires_at timestamptz NOT NULL CHECK (isfinite(expires_at)),
    namespace  text        NOT NULL,
    key        bytea       NOT NULL,
    PRIMARY KEY (expires_at, namespace, key)
);

-- Added in the release with caps on requests in flight (created in place
-- next to a table of an earlier release): one record per key that holds
-- slots. A slot is its holder's name for it (32 lowercase hex digits) and
-- its lease (when it runs out), at the same place of two arrays, written
-- together by one statement; expires_at is the record's lifetime, at least
-- its latest lease and never lowered, so the cleaner never deletes a live
-- slot and never leaves a record past its last lease. Counters never meet
-- it: another table. A record these constraints refuse (or that a dropped
-- constraint let in) is corrupt state, left as it is (slot_shape.sql).
CREATE {unlogged} TABLE IF NOT EXISTS {slots} (
    namespace  text          NOT NULL,
    key        bytea         NOT NULL,
    slots      text[]        NOT NULL CONSTRAINT slot_names CHECK (
        array_to_string(slots, ',', 'NULL')
            ~ ('^(' || repeat('[0-9a-f]', 32) || '(,' || repeat('[0-9a-f]', 32) || ')*)?$')),
    leases     timestamptz[] NOT NULL
        CONSTRAINT slot_leases CHECK (array_position(leases, NULL) IS NULL),
    expires_at timestamptz   NOT NULL
        CONSTRAINT record_lifetime CHECK (isfinite(expires_at)),
    PRIMARY KEY (namespace, key),
    CONSTRAINT a_lease_per_slot CHECK (cardinality(slots) = cardinality(leases))
) WITH (fillfactor = 80);

-- The cleaner deletes the records whose last lease has run out through this
-- index.
CREATE INDEX IF NOT EXISTS {slots_index} ON {slots} (expires_at);

-- Added in the release with limits held in the store (created in place next
-- to a table of an earlier release): one row per layer and scope, the scope
-- as encode_scope makes it (`layer`, `tier:NAME`, `key:BYTES`), the value as
-- encode_limit makes it (`LIMIT/WINDOWms`). Never UNLOGGED: a limit is
-- configuration, and must outlive a crash. Counters never meet it: another
-- table. A value that is not a limit (written by hand) is left out of a
-- read and counted, never read as "no limit".
CREATE TABLE IF NOT EXISTS {limits} (
    layer text  NOT NULL,
    scope bytea NOT NULL,
    value text  NOT NULL,
    PRIMARY KEY (layer, scope)
);
