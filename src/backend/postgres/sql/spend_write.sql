-- tower-pinned-window: the writes of a spend, on rows it holds locked.
-- $1 namespace, $2 key, $3 the new count (NULL: keep it), $4 open a new window of $4 ms
-- (NULL: keep expires_at), $5 lock until now + $5 ms (NULL: keep it).
UPDATE {table}
SET count = coalesce($3::bigint, count),
    expires_at = CASE WHEN $4::bigint IS NULL THEN expires_at
                      ELSE statement_timestamp() + $4::bigint * interval '1 millisecond' END,
    blocked_until = CASE WHEN $5::bigint IS NULL THEN blocked_until
                         ELSE statement_timestamp() + $5::bigint * interval '1 millisecond' END
WHERE namespace = $1 AND key = $2
RETURNING expires_at, statement_timestamp()
