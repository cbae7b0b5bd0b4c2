-- tower-pinned-window: the records of slots no statement may change (the
-- backstop's report): each one not of the store's shape (slot_shape.sql),
-- and whether its expires_at is not usable either (none, infinite, or past
-- now + the longest lease): a record without a lifetime, a leak.
-- $1 the most rows returned.
SELECT c.namespace, c.key,
       c.expires_at IS NULL OR NOT isfinite(c.expires_at)
           OR c.expires_at > statement_timestamp() + {window_bound_ms} * interval '1 millisecond'
           AS without_lifetime
FROM {slots} AS c
WHERE NOT {slot_shape}
ORDER BY c.namespace, c.key
LIMIT $1
