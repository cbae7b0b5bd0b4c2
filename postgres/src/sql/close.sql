-- tower-pinned-window: close a counter for a span from now, the provider's
-- word (see the backend contract, "The provider's word"), in one
-- statement. $1 namespace, $2 key, $3 the span (ms).
--
-- The lockout is the counter row's blocked_until, the one a spend sets and
-- reads (spend.rs): set to now + span when there is none, or when it ends
-- sooner (an ended one too); a live one that ends later is left as it is:
-- deadlines only extend. A missing row is created as a spend's lock
-- creates one, a closed window (count 0, expired: no counter for peek,
-- reset or the hits), with its lockout. count and expires_at are never
-- written. The row lock makes the step atomic; the time is the database's.
--
-- A row no spend may count (a negative count, one that cannot grow, no
-- expiry, an infinite one or one past now + Window::MAX), or a lockout
-- without a lifetime (an infinite blocked_until, or one past
-- now + Window::MAX), fails the WHERE: it is left exactly as it is, the
-- first column is NULL, and the row as it stood before the statement (its
-- snapshot; the last column says whether there was one) says why.
WITH closed AS (
    INSERT INTO {table} AS c (namespace, key, count, expires_at, blocked_until)
    VALUES ($1, $2, 0, 'epoch'::timestamptz,
            statement_timestamp() + $3::bigint * interval '1 millisecond')
    ON CONFLICT (namespace, key) DO UPDATE SET
        blocked_until = CASE WHEN c.blocked_until > excluded.blocked_until
                             THEN c.blocked_until ELSE excluded.blocked_until END
    WHERE c.count >= 0 AND c.count < 9223372036854775807
      AND isfinite(c.expires_at)
      AND c.expires_at <= statement_timestamp() + {window_bound_ms} * interval '1 millisecond'
      AND (c.blocked_until IS NULL
           OR (isfinite(c.blocked_until)
               AND c.blocked_until
                   <= statement_timestamp() + {window_bound_ms} * interval '1 millisecond'))
    RETURNING c.blocked_until
)
SELECT (SELECT blocked_until FROM closed), statement_timestamp(),
       o.count, o.expires_at, o.blocked_until, o.key IS NOT NULL
FROM (SELECT 1) AS one
LEFT JOIN {table} AS o ON o.namespace = $1 AND o.key = $2
