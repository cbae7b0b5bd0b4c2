-- tower-pinned-window: delete at most {batch} expired counters, at most
-- {batch} reset markers whose deadline passed over a second ago, and at most
-- {batch} records of slots whose expires_at (their latest lease) has passed.
-- Sent as one simple query, so the statements run in one transaction.
--
-- The rows are found through the expires_at index and locked with SKIP
-- LOCKED, so the cleaner never waits for a hit (nor for another instance's
-- cleaner); they are then deleted by their row address. Sequential scans are
-- off for this transaction only: planned from the statistics of a table that
-- was nearly empty when last analyzed, the delete would otherwise read the
-- whole table for every batch just when a flood has filled it. The expiry
-- is checked again on the row being deleted, so a row that a hit has just
-- given a new window (or a record a take has just given a slot) is never
-- deleted. Rows with a negative count, and records of slots not of the
-- store's shape (slot_shape.sql), are corrupt and left for inspection.
--
-- A marker is kept for a second past its deadline: an amend that can still
-- act on its deadline's window started before that deadline (expires_at >
-- statement_timestamp()), and took the snapshot that sees the marker right
-- after it started, not a second later.
SET LOCAL enable_seqscan = off;
DELETE FROM {resets}
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {resets}
        WHERE expires_at <= statement_timestamp() - interval '1 second'
        LIMIT {batch}
        FOR UPDATE SKIP LOCKED))
  AND expires_at <= statement_timestamp() - interval '1 second';
DELETE FROM {table}
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {table}
        WHERE expires_at <= statement_timestamp() AND count >= 0
          AND (blocked_until IS NULL OR blocked_until <= statement_timestamp())
        LIMIT {batch}
        FOR UPDATE SKIP LOCKED))
  AND expires_at <= statement_timestamp()
  AND count >= 0
  AND (blocked_until IS NULL OR blocked_until <= statement_timestamp());
DELETE FROM {slots} AS c
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {slots} AS c
        WHERE c.expires_at <= statement_timestamp() AND {slot_shape}
        LIMIT {batch}
        FOR UPDATE SKIP LOCKED))
  AND c.expires_at <= statement_timestamp()
  AND {slot_shape}
