-- tower-pinned-window: delete a counter and its lockout ("unblock this client"). Returns
-- whether it was live (or corrupt) rather than an expired row left for the
-- cleaner. $1 namespace, $2 key.
DELETE FROM {table}
WHERE namespace = $1 AND key = $2
RETURNING expires_at IS NULL OR expires_at > statement_timestamp()
       OR coalesce(blocked_until > statement_timestamp(), false)
