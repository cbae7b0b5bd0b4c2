-- tower-pinned-window: take a slot of a key, in one statement.
-- $1 namespace, $2 key, $3 the slot's name, $4 the cap's max, $5 its lease
-- (ms). The time is the database's.
--
-- A key with no record gets one holding this slot alone. Otherwise, on the
-- record locked by ON CONFLICT (concurrent takes, give-backs and extends of
-- the key wait for each other; the SET reads the record as the last of them
-- left it): the slots whose lease has run out are dropped; the slot is
-- added with the lease now + $5 when it is not held and fewer than $4 are
-- live, and the record's expires_at raised to at least that lease (never
-- lowered). A slot already held is left as it is: a take retried never
-- takes two. A refused take writes the record back with its live slots.
--
-- A record not of the store's shape (slot_shape.sql) fails the WHERE: it is
-- left exactly as it is and nothing comes back (corrupt).
INSERT INTO {slots} AS c (namespace, key, slots, leases, expires_at)
VALUES ($1, $2, ARRAY[$3::text],
        ARRAY[statement_timestamp() + $5::bigint * interval '1 millisecond'],
        statement_timestamp() + $5::bigint * interval '1 millisecond')
ON CONFLICT (namespace, key) DO UPDATE SET
    (slots, leases, expires_at) = (
        SELECT CASE WHEN live.room THEN live.slots || excluded.slots ELSE live.slots END,
               CASE WHEN live.room THEN live.leases || excluded.leases ELSE live.leases END,
               CASE WHEN live.room THEN greatest(c.expires_at, excluded.expires_at)
                    ELSE c.expires_at END
        FROM (SELECT coalesce(array_agg(u.slot ORDER BY u.pos), ARRAY[]::text[]) AS slots,
                     coalesce(array_agg(u.lease ORDER BY u.pos), ARRAY[]::timestamptz[])
                         AS leases,
                     count(*) < $4::bigint AND NOT coalesce(bool_or(u.slot = $3::text), false)
                         AS room
              FROM unnest(c.slots, c.leases) WITH ORDINALITY AS u(slot, lease, pos)
              WHERE u.lease > statement_timestamp()) AS live)
WHERE {slot_shape}
RETURNING $3::text = ANY(c.slots) AS granted,
          cardinality(c.slots)::bigint AS in_use,
          (SELECT min(u.lease) FROM unnest(c.leases) AS u(lease)) AS earliest,
          statement_timestamp()
