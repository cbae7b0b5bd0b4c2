-- tower-pinned-window: a counter as it stands, without counting.
-- $1 namespace, $2 key.
SELECT count, expires_at, statement_timestamp()
FROM {table}
WHERE namespace = $1 AND key = $2
