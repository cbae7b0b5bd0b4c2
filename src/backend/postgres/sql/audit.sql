-- tower-pinned-window: the rows no hit may count (the backstop's report).
-- $1 the longest window any quota may have (ms), $2 the most rows returned.
SELECT namespace, key, count, expires_at
FROM {table}
WHERE count IS NULL OR count < 0 OR count = 9223372036854775807
   OR expires_at IS NULL OR NOT isfinite(expires_at)
   OR expires_at > statement_timestamp() + $1::bigint * interval '1 millisecond'
ORDER BY namespace, key
LIMIT $2
