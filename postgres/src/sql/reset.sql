-- tower-pinned-window: delete a counter and its lockout ("unblock this client"). Returns
-- whether it was live (or corrupt) rather than an expired row left for the
-- cleaner. $1 namespace, $2 key.
--
-- In the same statement, a window deleted while open leaves a reset marker
-- for its deadline (see migrate.sql), so that no refund or amend of its hits
-- can reach a window opened later with the same expires_at.
WITH deleted AS (
    DELETE FROM {table}
    WHERE namespace = $1 AND key = $2
    RETURNING namespace, key, expires_at,
              expires_at IS NULL OR expires_at > statement_timestamp()
              OR coalesce(blocked_until > statement_timestamp(), false) AS live
), marked AS (
    INSERT INTO {resets} (expires_at, namespace, key)
    SELECT expires_at, namespace, key FROM deleted
    WHERE isfinite(expires_at) AND expires_at > statement_timestamp()
    ON CONFLICT DO NOTHING
)
SELECT live FROM deleted
