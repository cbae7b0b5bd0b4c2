-- tower-pinned-window: give back a slot of a key, in one statement.
-- $1 namespace, $2 key, $3 the slot's name.
--
-- The slot is taken out of the key's record when it is there with a live
-- lease; nothing else changes, and nothing is ever created. A record left
-- with no slot keeps its expires_at, and the cleaner deletes it then.
-- Answers whether the slot was given back, and whether the key's record is
-- not of the store's shape (slot_shape.sql): such a record fails the
-- UPDATE's WHERE, and is left exactly as it is.
WITH given AS (
    UPDATE {slots} AS c
    SET (slots, leases) = (
        SELECT coalesce(array_agg(u.slot ORDER BY u.pos), ARRAY[]::text[]),
               coalesce(array_agg(u.lease ORDER BY u.pos), ARRAY[]::timestamptz[])
        FROM unnest(c.slots, c.leases) WITH ORDINALITY AS u(slot, lease, pos)
        WHERE u.slot <> $3::text)
    WHERE c.namespace = $1 AND c.key = $2
      AND EXISTS (SELECT 1 FROM unnest(c.slots, c.leases) AS u(slot, lease)
                  WHERE u.slot = $3::text AND u.lease > statement_timestamp())
      AND {slot_shape}
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM given),
       EXISTS (SELECT 1 FROM {slots} AS c
               WHERE c.namespace = $1 AND c.key = $2 AND NOT {slot_shape}
              )
