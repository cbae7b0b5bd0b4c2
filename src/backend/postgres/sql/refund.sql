-- tower-pinned-window: give back one hit, in the window it was counted in.
-- $1 namespace, $2 key, $3 the window's deadline (expires_at) from the hit.
-- One statement: an UPDATE never creates a row; expires_at is never written;
-- the count never goes below zero; a window that has closed, or been
-- replaced by a new one (another expires_at), is left alone.
UPDATE {table}
SET count = count - 1
WHERE namespace = $1 AND key = $2
  AND expires_at = $3
  AND expires_at > statement_timestamp()
  AND count > 0
RETURNING count
