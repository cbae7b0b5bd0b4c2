-- tower-pinned-window: delete the counter a hit was counted in, only in its
-- window, and leave a reset marker for that window's deadline (see
-- migrate.sql). A live lockout on its row stays: the row is kept as a
-- closed window (count 0, expires_at at the epoch, as spend_lock.sql makes
-- them), which is no counter for peek, reset or the hits.
-- Nothing is done for a deadline a marker names: the hit may be a deleted
-- window's. $1 namespace, $2 key, $3 the window's deadline.
WITH cleared AS (
    DELETE FROM {table}
    WHERE namespace = $1 AND key = $2 AND expires_at = $3
      AND expires_at > statement_timestamp() AND count >= 0
      AND (blocked_until IS NULL OR blocked_until <= statement_timestamp())
      AND NOT EXISTS (SELECT 1 FROM {resets} r
                      WHERE r.expires_at = $3 AND r.namespace = $1 AND r.key = $2)
    RETURNING 1
), zeroed AS (
    UPDATE {table} SET count = 0, expires_at = 'epoch'::timestamptz
    WHERE namespace = $1 AND key = $2 AND expires_at = $3
      AND expires_at > statement_timestamp() AND count >= 0
      AND blocked_until > statement_timestamp()
      AND NOT EXISTS (SELECT 1 FROM {resets} r
                      WHERE r.expires_at = $3 AND r.namespace = $1 AND r.key = $2)
    RETURNING 1
), marked AS (
    INSERT INTO {resets} (expires_at, namespace, key)
    SELECT $3::timestamptz, $1::text, $2::bytea
    WHERE EXISTS (SELECT 1 FROM cleared) OR EXISTS (SELECT 1 FROM zeroed)
    ON CONFLICT DO NOTHING
)
SELECT (SELECT count(*) FROM cleared) + (SELECT count(*) FROM zeroed)
