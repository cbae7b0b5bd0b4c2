-- tower-pinned-window: the rows of a spend, as they stand (locked).
-- $1 namespaces, $2 key.
SELECT namespace, count, expires_at, blocked_until, statement_timestamp()
FROM {table}
WHERE key = $2 AND namespace = ANY($1::text[])
