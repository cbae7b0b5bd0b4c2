-- tower-pinned-window: the live slots of a key, without changing them.
-- $1 namespace, $2 key. No row when the key has no record; the second
-- column says the record is not of the store's shape (slot_shape.sql).
SELECT (SELECT count(*) FROM unnest(c.slots, c.leases) AS u(slot, lease)
        WHERE u.lease > statement_timestamp()),
       NOT {slot_shape}
FROM {slots} AS c
WHERE c.namespace = $1 AND c.key = $2
