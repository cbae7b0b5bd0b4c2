-- tower-pinned-window: amend the count of the window a hit was counted in.
-- $1 namespace, $2 key, $3 the window's deadline, $4 the change (negative:
-- a refund, never below zero; positive: a charge, never past a count that
-- cannot grow). Never creates a row, never writes expires_at. Nothing is
-- done for a deadline a reset marker names (see migrate.sql).
UPDATE {table}
SET count = CASE WHEN $4::bigint < 0 THEN greatest(count + $4::bigint, 0)
                 ELSE count + least($4::bigint, 9223372036854775806 - count) END
WHERE namespace = $1 AND key = $2
  AND expires_at = $3
  AND expires_at > statement_timestamp()
  AND count >= 0 AND count < 9223372036854775807
  AND (($4::bigint < 0 AND count > 0) OR ($4::bigint > 0))
  AND NOT EXISTS (SELECT 1 FROM {resets} r
                  WHERE r.expires_at = $3 AND r.namespace = $1 AND r.key = $2)
RETURNING count
