-- tower-pinned-window: delete at most {batch} expired counters.
-- Sent as one simple query, so both statements run in one transaction.
--
-- The rows are found through the expires_at index and locked with SKIP
-- LOCKED, so the cleaner never waits for a hit (nor for another instance's
-- cleaner); they are then deleted by their row address. Sequential scans are
-- off for this transaction only: planned from the statistics of a table that
-- was nearly empty when last analyzed, the delete would otherwise read the
-- whole table for every batch just when a flood has filled it. The expiry
-- is checked again on the row being deleted, so a row that a hit has just
-- given a new window is never deleted. Rows with a negative count are
-- corrupt and left for inspection.
SET LOCAL enable_seqscan = off;
DELETE FROM {table}
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {table}
        WHERE expires_at <= statement_timestamp() AND count >= 0
          AND (blocked_until IS NULL OR blocked_until <= statement_timestamp())
        LIMIT {batch}
        FOR UPDATE SKIP LOCKED))
  AND expires_at <= statement_timestamp()
  AND count >= 0
  AND (blocked_until IS NULL OR blocked_until <= statement_timestamp())
