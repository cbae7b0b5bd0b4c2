-- tower-pinned-window: give back one hit, in the window it was counted in.
-- $1 namespace, $2 key, $3 the window's deadline (expires_at) from the hit.
-- One statement: an UPDATE never creates a row; expires_at is never written;
-- the count never goes below zero; a window that has closed, or been
-- replaced by a new one (another expires_at), is left alone, and so is a
-- deadline a reset marker names (a window of that deadline was deleted: the
-- hit may be its, see migrate.sql).
UPDATE {table}
SET count = count - 1
WHERE namespace = $1 AND key = $2
  AND expires_at = $3
  AND expires_at > statement_timestamp()
  AND count > 0
  AND NOT EXISTS (SELECT 1 FROM {resets} r
                  WHERE r.expires_at = $3 AND r.namespace = $1 AND r.key = $2)
RETURNING count
