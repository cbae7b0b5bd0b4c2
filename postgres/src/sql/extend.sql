-- tower-pinned-window: extend the leases of slots still held, of any keys,
-- in one statement. $1 namespaces, $2 keys, $3 slot names (one element per
-- slot held), $4 the lease (ms).
--
-- The records of the keys named are locked in one order (namespace, key),
-- so two extends never deadlock (a take or a give-back locks one record).
-- In each record of the store's shape, every named slot whose lease has
-- not run out gets max(its lease, now + $4), and the record's expires_at
-- is raised to at least now + $4: never lowered. A slot that is gone, or
-- whose lease ran out, is never extended nor created again, and a record is
-- never created. Answers the number of slots extended, and the first record
-- named that is not of the store's shape (slot_shape.sql), left exactly as
-- it is (NULL when none is); the others are extended all the same.
WITH held AS (
    SELECT h.namespace, h.key, array_agg(h.slot) AS slots
    FROM unnest($1::text[], $2::bytea[], $3::text[]) AS h(namespace, key, slot)
    GROUP BY h.namespace, h.key
), locked AS (
    SELECT c.namespace, c.key, c.slots, c.leases, c.expires_at, h.slots AS held,
           {slot_shape} AS ok
    FROM {slots} AS c
    JOIN held AS h ON c.namespace = h.namespace AND c.key = h.key
    ORDER BY c.namespace, c.key
    FOR UPDATE OF c
), moved AS (
    SELECT k.namespace, k.key, k.expires_at,
           ARRAY(SELECT CASE WHEN u.lease > statement_timestamp() AND u.slot = ANY(k.held)
                             THEN greatest(u.lease, statement_timestamp()
                                                    + $4::bigint * interval '1 millisecond')
                             ELSE u.lease END
                 FROM unnest(k.slots, k.leases) WITH ORDINALITY AS u(slot, lease, pos)
                 ORDER BY u.pos) AS leases,
           (SELECT count(*) FROM unnest(k.slots, k.leases) AS u(slot, lease)
            WHERE u.lease > statement_timestamp() AND u.slot = ANY(k.held)) AS extended
    FROM locked AS k
    WHERE k.ok
), written AS (
    UPDATE {slots} AS c
    SET leases = m.leases,
        expires_at = greatest(m.expires_at, statement_timestamp()
                                            + $4::bigint * interval '1 millisecond')
    FROM moved AS m
    WHERE c.namespace = m.namespace AND c.key = m.key AND m.extended > 0
    RETURNING m.extended
)
SELECT (SELECT coalesce(sum(w.extended), 0) FROM written AS w)::bigint, bad.namespace, bad.key
FROM (SELECT 1) AS one
LEFT JOIN (SELECT k.namespace, k.key FROM locked AS k WHERE NOT k.ok
           ORDER BY k.namespace, k.key LIMIT 1) AS bad ON true
