-- tower-pinned-window: count one hit in a window pinned to the first hit.
-- $1 namespace, $2 key, $3 the window (ms), $4 the longest window any quota
-- may have (ms). The time is the database's: every app server agrees on it.
--
-- A new row, or one whose window has closed, gets count 1 and
-- expires_at = now + window; a live row gets count + 1 and keeps its
-- expires_at. All in one statement: the row lock makes it atomic per key.
--
-- A row this backend cannot have written (a negative count, no expiry, an
-- infinite one or one past now + $4, a count that cannot grow) fails the
-- WHERE: it is left exactly as it is and no row comes back (corrupt).
INSERT INTO {table} AS c (namespace, key, count, expires_at)
VALUES ($1, $2, 1, statement_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (namespace, key) DO UPDATE SET
    count = CASE WHEN c.expires_at <= statement_timestamp() THEN 1
                 ELSE c.count + 1 END,
    expires_at = CASE WHEN c.expires_at <= statement_timestamp() THEN excluded.expires_at
                      ELSE c.expires_at END
WHERE c.count >= 0
  AND c.count < 9223372036854775807
  AND isfinite(c.expires_at)
  AND c.expires_at <= statement_timestamp() + $4::bigint * interval '1 millisecond'
RETURNING c.count, c.expires_at, statement_timestamp()
