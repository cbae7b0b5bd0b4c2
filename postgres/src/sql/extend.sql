-- tower-pinned-window: extend the leases of slots still held, of any keys,
-- in one statement. $1 namespaces, $2 keys, $3 slot names (one element per
-- slot held), $4 the lease (ms).
--
-- The records of the keys named are locked first, in one order (namespace,
-- key), so two extends never deadlock (a take or a give-back locks one
-- record). Then, in each record of the store's shape, every named slot
-- whose lease has not run out gets max(its lease, now + $4), and the
-- record's expires_at is raised to at least now + $4: never lowered. A
-- slot that is gone, or whose lease ran out, is never extended nor created
-- again, and a record is never created. The UPDATE computes each record
-- from the record itself (the version it updates, rechecked if another
-- step changed it since the statement began), never from the lock's read.
-- Answers the number of slots extended, and the first record named that is
-- not of the store's shape (slot_shape.sql), left exactly as it is (NULL
-- when none is); the others are extended all the same.
WITH held AS (
    SELECT h.namespace, h.key, array_agg(h.slot) AS slots
    FROM unnest($1::text[], $2::bytea[], $3::text[]) AS h(namespace, key, slot)
    GROUP BY h.namespace, h.key
), locked AS (
    SELECT c.namespace, c.key, h.slots AS held, {slot_shape} AS ok
    FROM {slots} AS c
    JOIN held AS h ON c.namespace = h.namespace AND c.key = h.key
    ORDER BY c.namespace, c.key
    FOR UPDATE OF c
), written AS (
    UPDATE {slots} AS c
    SET leases = ARRAY(
            SELECT CASE WHEN u.lease > statement_timestamp() AND u.slot = ANY(k.held)
                        THEN greatest(u.lease, statement_timestamp()
                                               + $4::bigint * interval '1 millisecond')
                        ELSE u.lease END
            FROM unnest(c.slots, c.leases) WITH ORDINALITY AS u(slot, lease, pos)
            ORDER BY u.pos),
        expires_at = greatest(c.expires_at, statement_timestamp()
                                            + $4::bigint * interval '1 millisecond')
    FROM locked AS k
    WHERE c.namespace = k.namespace AND c.key = k.key
      AND EXISTS (SELECT 1 FROM unnest(c.slots, c.leases) AS u(slot, lease)
                  WHERE u.lease > statement_timestamp() AND u.slot = ANY(k.held))
      AND {slot_shape}
    RETURNING (SELECT count(*) FROM unnest(c.slots, c.leases) AS u(slot, lease)
               WHERE u.lease > statement_timestamp() AND u.slot = ANY(k.held)) AS extended
)
SELECT (SELECT coalesce(sum(w.extended), 0) FROM written AS w)::bigint, bad.namespace, bad.key
FROM (SELECT 1) AS one
LEFT JOIN (SELECT k.namespace, k.key FROM locked AS k WHERE NOT k.ok
           ORDER BY k.namespace, k.key LIMIT 1) AS bad ON true
