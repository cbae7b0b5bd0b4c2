-- tower-pinned-window: whether the record `c` of a key's slots is of the
-- store's shape: two arrays of one length, each slot's name (32 lowercase
-- hex digits, once) at the place of its lease (a time, never NULL), and a
-- finite expires_at within now + the longest lease any cap may have, and at
-- least every lease. A boolean expression, never NULL, spliced into every
-- statement on the slots' table: a record that is not so is corrupt state,
-- which no statement writes, deletes or counts.
coalesce(
    c.slots IS NOT NULL AND c.leases IS NOT NULL
    AND isfinite(c.expires_at)
    AND c.expires_at <= statement_timestamp() + {window_bound_ms} * interval '1 millisecond'
    AND coalesce(array_ndims(c.slots), 1) = 1 AND coalesce(array_ndims(c.leases), 1) = 1
    AND cardinality(c.slots) = cardinality(c.leases)
    AND NOT EXISTS (
        SELECT 1 FROM unnest(c.slots, c.leases) AS shape(slot, lease)
        WHERE shape.slot IS NULL OR length(shape.slot) <> 32 OR shape.slot !~ '^[0-9a-f]*$'
           OR shape.lease IS NULL OR shape.lease > c.expires_at)
    AND cardinality(c.slots)
        = (SELECT count(DISTINCT shape.slot) FROM unnest(c.slots) AS shape(slot)),
    false)
