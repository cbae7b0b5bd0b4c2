-- tower-pinned-window: delete the counter a hit was counted in, only in its
-- window. A live lockout on its row stays: the row is kept with a count of 0.
-- $1 namespace, $2 key, $3 the window's deadline.
WITH cleared AS (
    DELETE FROM {table}
    WHERE namespace = $1 AND key = $2 AND expires_at = $3
      AND expires_at > statement_timestamp() AND count >= 0
      AND (blocked_until IS NULL OR blocked_until <= statement_timestamp())
    RETURNING 1
), zeroed AS (
    UPDATE {table} SET count = 0
    WHERE namespace = $1 AND key = $2 AND expires_at = $3
      AND expires_at > statement_timestamp() AND count > 0
      AND blocked_until > statement_timestamp()
    RETURNING 1
)
SELECT (SELECT count(*) FROM cleared) + (SELECT count(*) FROM zeroed)
