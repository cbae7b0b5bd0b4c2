-- tower-pinned-window: the first statement of a spend's transaction. Locks
-- the rows of every counter of the spend, in one order, creating a missing
-- one as a closed window (count 0, expired: no counter for peek, reset or the
-- hits), so the decision that follows sees every row locked.
-- $1 namespaces, $2 keys.
INSERT INTO {table} AS c (namespace, key, count, expires_at)
SELECT h.namespace, h.key, 0, 'epoch'::timestamptz
FROM unnest($1::text[], $2::bytea[]) AS h(namespace, key)
ORDER BY h.namespace, h.key
ON CONFLICT (namespace, key) DO UPDATE SET count = c.count WHERE false
