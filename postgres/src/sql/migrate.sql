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
-- lockout, never extended; kept on the counter's row, so it never meets
-- another counter.
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
