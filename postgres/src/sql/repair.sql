-- tower-pinned-window: give a window to a counter that has no usable expiry
-- (none, infinite, or past now + $4 ms), starting now; its count is kept.
-- Never a negative count: a lifetime would make corrupt state vanish.
-- $1 namespace, $2 key, $3 the window (ms), $4 the longest window (ms).
UPDATE {table}
SET expires_at = statement_timestamp() + $3::bigint * interval '1 millisecond'
WHERE namespace = $1 AND key = $2
  AND count >= 0 AND count < 9223372036854775807
  AND (expires_at IS NULL OR NOT isfinite(expires_at)
       OR expires_at > statement_timestamp() + $4::bigint * interval '1 millisecond')
