-- tower-pinned-window: the first statement of a batch of spends and amends
-- (one transaction). Locks the rows of every counter of the batch, in one
-- order (namespace, key), as the hit statement does, so that two batches,
-- or a batch and a hit statement, never deadlock. A missing counter that a
-- spend of the batch names is created as a closed window (count 0, expired:
-- no counter for peek, reset or the hits); one that only amends name is
-- not created (an amend never creates a counter).
-- $1 namespaces, $2 keys (each counter once), $3 whether a spend names it.
INSERT INTO {table} AS c (namespace, key, count, expires_at)
SELECT h.namespace, h.key, 0, 'epoch'::timestamptz
FROM unnest($1::text[], $2::bytea[], $3::bool[]) AS h(namespace, key, spends)
WHERE h.spends
   OR EXISTS (SELECT 1 FROM {table} e WHERE e.namespace = h.namespace AND e.key = h.key)
ORDER BY h.namespace, h.key
ON CONFLICT (namespace, key) DO UPDATE SET count = c.count WHERE false
