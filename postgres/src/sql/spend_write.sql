-- tower-pinned-window: the writes of a batch of spends and amends, on rows
-- its transaction holds locked: each changed counter's row as the batch
-- left it, the rows its clears deleted, and their reset markers.
-- $1 namespaces, $2 keys, $3 counts, $4 expires_at, $5 blocked_until (NULL:
-- none), $6 whether the row is deleted (then $3 to $5 are not read);
-- $7 the markers' deadlines, $8 their namespaces, $9 their keys.
WITH w AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::bigint[], $4::timestamptz[],
                         $5::timestamptz[], $6::bool[])
             AS w(namespace, key, count, expires_at, blocked_until, gone)
), updated AS (
    UPDATE {table} c
    SET count = w.count, expires_at = w.expires_at, blocked_until = w.blocked_until
    FROM w
    WHERE c.namespace = w.namespace AND c.key = w.key AND NOT w.gone
    RETURNING 1
), deleted AS (
    DELETE FROM {table} c
    USING w
    WHERE c.namespace = w.namespace AND c.key = w.key AND w.gone
    RETURNING 1
), marked AS (
    INSERT INTO {resets} (expires_at, namespace, key)
    SELECT * FROM unnest($7::timestamptz[], $8::text[], $9::bytea[])
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM updated) + (SELECT count(*) FROM deleted)
