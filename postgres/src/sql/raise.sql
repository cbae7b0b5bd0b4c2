-- tower-pinned-window: raise a counter's count to at least a number, the
-- provider's word (see the backend contract, "The provider's word"), in
-- one statement. $1 namespace, $2 key, $3 the count, $4 the quota's limit,
-- $5 its window (ms), $6 the provider's reset, `within` (ms).
--
-- The count becomes greatest(count, least($3, $4)): never past the limit,
-- never lowered. A live row keeps its expires_at. A missing row, or one
-- whose window has closed, gets count = least($3, $4) and
-- expires_at = now + least($5, $6), in the same statement (its lockout,
-- blocked_until, is kept). A count of 0 inserts nothing, so changes
-- nothing. The row lock makes the step atomic; the time is the database's.
--
-- A row no hit can have written (a negative count, one that cannot grow,
-- no expiry, an infinite one or one past now + Window::MAX) fails the
-- WHERE: it is left exactly as it is. The row as it stood before the
-- statement (its snapshot; the last column says whether there was one)
-- comes beside the answer: what a count of 0 reads, and why a refused row
-- is corrupt.
WITH raised AS (
    INSERT INTO {table} AS c (namespace, key, count, expires_at)
    SELECT $1, $2, least($3::bigint, $4::bigint),
           statement_timestamp() + least($5::bigint, $6::bigint) * interval '1 millisecond'
    WHERE $3::bigint > 0
    ON CONFLICT (namespace, key) DO UPDATE SET
        count = CASE WHEN c.expires_at <= statement_timestamp() THEN excluded.count
                     ELSE greatest(c.count, excluded.count) END,
        expires_at = CASE WHEN c.expires_at <= statement_timestamp() THEN excluded.expires_at
                          ELSE c.expires_at END
    WHERE c.count >= 0 AND c.count < 9223372036854775807
      AND isfinite(c.expires_at)
      AND c.expires_at <= statement_timestamp() + {window_bound_ms} * interval '1 millisecond'
    RETURNING c.count, c.expires_at
)
SELECT r.count, r.expires_at, statement_timestamp(), o.count, o.expires_at,
       o.key IS NOT NULL
FROM (SELECT 1) AS one
LEFT JOIN raised AS r ON true
LEFT JOIN {table} AS o ON o.namespace = $1 AND o.key = $2
