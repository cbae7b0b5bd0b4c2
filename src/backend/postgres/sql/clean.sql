-- tower-pinned-window: delete at most $1 expired counters.
-- The rows are found through the expires_at index and locked with SKIP
-- LOCKED, so the cleaner never waits for a hit (nor for another instance's
-- cleaner). The expiry is checked again on the row being deleted, so a row
-- that a hit has just given a new window is never deleted. Rows with a
-- negative count are corrupt and left for inspection.
DELETE FROM {table}
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {table}
        WHERE expires_at <= statement_timestamp() AND count >= 0
        LIMIT $1
        FOR UPDATE SKIP LOCKED))
  AND expires_at <= statement_timestamp()
  AND count >= 0
