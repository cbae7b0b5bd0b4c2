-- tower-pinned-window: the rows no hit may count (the backstop's report),
-- each with what is wrong: a count that is not one (corrupt), and a deadline
-- that is not usable (no lifetime). Either or both.
-- $1 the longest window any quota may have (ms), $2 the most rows returned.
SELECT namespace, key, count, expires_at, corrupt, without_lifetime
FROM (
    SELECT namespace, key, count, expires_at,
           count IS NULL OR count < 0 OR count = 9223372036854775807 AS corrupt,
           expires_at IS NULL OR NOT isfinite(expires_at)
               OR expires_at > statement_timestamp() + $1::bigint * interval '1 millisecond'
               AS without_lifetime
    FROM {table}
) AS checked
WHERE corrupt OR without_lifetime
ORDER BY namespace, key
LIMIT $2
