-- tower-pinned-window: the first statement of a take_all's transaction
-- (take_all.sql is its last): the key's record of slots is locked, so that
-- the statements after it read it as the last step of the key left it, and
-- no take, give-back or extend of the key comes in between until COMMIT.
-- A key with no record gets an empty one, with its lifetime now + $3 set in
-- the same step (the cleaner's once that passes, as a record emptied by
-- give-backs is). Nothing else changes: ON CONFLICT ... WHERE false locks
-- the record and writes nothing, so a record not of the store's shape is
-- left exactly as it is (take_all.sql finds it so, and fails the step).
-- $1 namespace, $2 key, $3 the cap's lease (ms).
INSERT INTO {slots} AS c (namespace, key, slots, leases, expires_at)
VALUES ($1, $2, ARRAY[]::text[], ARRAY[]::timestamptz[],
        statement_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (namespace, key) DO UPDATE SET expires_at = c.expires_at WHERE false
