-- tower-pinned-window: count hits, each counter's in a window pinned to its
-- first hit. One row of the arrays per counter: $1 namespaces, $2 keys,
-- $3 hits on that counter in this statement, $4 windows (ms); $5 the
-- longest window any quota may have (ms). The time is the database's: every
-- app server agrees on it.
--
-- A new row, or one whose window has closed, gets count = hits and
-- expires_at = now + window; a live row gets count + hits and keeps its
-- expires_at. The row lock makes each row's step atomic; rows are taken in
-- one order (namespace, key), so two statements never deadlock.
--
-- A row this backend cannot have written (a negative count, no expiry, an
-- infinite one or one past now + $5, a count that cannot grow) fails the
-- WHERE: it is left exactly as it is and does not come back (corrupt).
INSERT INTO {table} AS c (namespace, key, count, expires_at)
SELECT h.namespace, h.key, h.hits,
       statement_timestamp() + h.window_ms * interval '1 millisecond'
FROM unnest($1::text[], $2::bytea[], $3::bigint[], $4::bigint[])
     AS h(namespace, key, hits, window_ms)
ORDER BY h.namespace, h.key
ON CONFLICT (namespace, key) DO UPDATE SET
    count = CASE WHEN c.expires_at <= statement_timestamp() THEN excluded.count
                 ELSE c.count + excluded.count END,
    expires_at = CASE WHEN c.expires_at <= statement_timestamp() THEN excluded.expires_at
                      ELSE c.expires_at END
WHERE c.count >= 0
  AND c.count <= 9223372036854775807 - excluded.count
  AND isfinite(c.expires_at)
  AND c.expires_at <= statement_timestamp() + $5::bigint * interval '1 millisecond'
RETURNING c.namespace, c.key, c.count, c.expires_at, statement_timestamp()
