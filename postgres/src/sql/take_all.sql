-- tower-pinned-window: a take_all decided and written, the last statement
-- of its transaction. Before it, take_lock.sql locked the key's record of
-- slots and spend_lock.sql every counter's row (a missing one created as a
-- closed window), so this statement's snapshot, taken after both, reads
-- them exactly as they stand, and nothing changes them until COMMIT. The
-- time is this statement's (statement_timestamp()), as for take.sql and the
-- hits.
--
-- $1 the cap's namespace, $2 the key, $3 the slot's name, $4 the cap's max,
-- $5 its lease (ms); one element of the arrays per counter, in order:
-- $6 namespaces, $7 windows (ms), $8 limits; $9 whether it spends (else
-- its counters are hit); $10 the spend's cost, $11 its `open`, $12 its
-- lockout (ms, NULL: none); $13 the longest window any quota may have (ms);
-- $14 the first counter's own amount, spent instead of the cost (NULL:
-- the cost, as every counter).
--
-- The step (the contract's "quotas and a cap in one step"):
-- 1. the record's slots whose lease has run out are dropped;
-- 2. the slot is held already: the counters are read, not counted;
-- 3. fewer than $4 live slots: no; the take is refused and the counters
--    read, not counted;
-- 4. otherwise the counters are counted, as hit.sql counts a hit or as
--    spend.rs decides a spend (all or nothing, a lockout on a first
--    denial), and the slot is added with the lease now + $5, as take.sql
--    adds it, when every counter admits the request.
-- The record is written back with its live slots in every step, as a take
-- writes it. A record not of the store's shape, or a counter's row no hit
-- may count (hit.sql's WHERE), fails the whole step: nothing is written,
-- `ok` comes back false with what was read, for the error to name, and
-- take_end.sql rolls the transaction back.
--
-- One row per counter, in order (one with NULL counter columns when there
-- are none): the step (whether the record was found, is of the store's
-- shape, and the step could be taken; the slot held, the live slots, the
-- earliest lease; whether the counters were counted, the slot taken, and
-- the rows written), the time, then the counter as read (namespace, whether
-- its row was there, whether it is corrupt, count, expires_at,
-- blocked_until), then, for hits, its count and expires_at after the step.
WITH rec AS (
    SELECT c.expires_at, c.slots, c.leases, {slot_shape} AS fine
    FROM {slots} AS c
    WHERE c.namespace = $1 AND c.key = $2
), live AS (
    SELECT coalesce(array_agg(u.slot ORDER BY u.pos), ARRAY[]::text[]) AS slots,
           coalesce(array_agg(u.lease ORDER BY u.pos), ARRAY[]::timestamptz[]) AS leases,
           coalesce(bool_or(u.slot = $3::text), false) AS held,
           count(*) AS in_use,
           min(u.lease) AS earliest
    FROM rec, unnest(rec.slots, rec.leases) WITH ORDINALITY AS u(slot, lease, pos)
    WHERE rec.fine AND u.lease > statement_timestamp()
), seen AS (
    -- Each counter as it stands: its live count (0 without a live window),
    -- whether its window is live, whether it is locked out; and what a
    -- spend adds to it (the first counter's own amount, or the cost).
    SELECT h.i, h.namespace, h.window_ms, h.lim,
           CASE WHEN h.i = 1 AND $14::bigint IS NOT NULL THEN $14::bigint
                ELSE $10::bigint END AS cost,
           c.namespace IS NOT NULL AS was,
           c.count, c.expires_at, c.blocked_until,
           c.namespace IS NOT NULL AND NOT coalesce(
               c.count >= 0 AND c.count < 9223372036854775807
               AND isfinite(c.expires_at)
               AND c.expires_at <= statement_timestamp() + $13::bigint * interval '1 millisecond'
               AND (c.blocked_until IS NULL OR isfinite(c.blocked_until)),
               false) AS bad,
           coalesce(c.expires_at > statement_timestamp(), false) AS open,
           CASE WHEN c.expires_at > statement_timestamp() THEN c.count ELSE 0 END AS live,
           coalesce(c.blocked_until > statement_timestamp(), false) AS locked
    FROM unnest($6::text[], $7::bigint[], $8::bigint[]) WITH ORDINALITY
         AS h(namespace, window_ms, lim, i)
    LEFT JOIN {table} AS c ON c.namespace = h.namespace AND c.key = $2
), counters AS (
    -- Each row once (a counter named twice is hit twice, as a batch of
    -- hits counts it), with what the step would make of it: whether a
    -- spend fits it (each naming's cost, at least 1, within its limit),
    -- and what it adds (as spend.rs decides it: the cost of the last
    -- naming that writes the row, one whose cost is not 0 or that opens
    -- the window, on the count as read).
    SELECT s.namespace, count(*) AS n, (array_agg(s.window_ms ORDER BY s.i))[1] AS window_ms,
           min(s.lim) AS lim, bool_or(s.open) AS open, max(s.live) AS live,
           bool_or(s.locked) AS locked,
           bool_and(NOT s.locked AND greatest(s.cost, 1) <= s.lim - s.live) AS fits,
           coalesce((array_agg(s.cost ORDER BY s.i DESC)
                     FILTER (WHERE s.cost > 0 OR (NOT s.open AND $11::bool)))[1], 0) AS cost
    FROM seen AS s
    GROUP BY s.namespace
), hits AS (
    SELECT k.namespace,
           CASE WHEN k.open THEN k.live + k.n ELSE k.n END AS count,
           CASE WHEN k.open THEN NULL
                ELSE statement_timestamp() + k.window_ms * interval '1 millisecond' END AS opens
    FROM counters AS k
), step AS (
    SELECT coalesce((SELECT rec.fine FROM rec), false)
               AND NOT EXISTS (SELECT 1 FROM seen AS s WHERE s.bad OR NOT s.was) AS ok,
           coalesce((SELECT rec.fine FROM rec), false) AS fine,
           (SELECT count(*) FROM rec) = 1 AS found,
           live.held, live.in_use, live.earliest,
           NOT live.held AND live.in_use < $4::bigint AS counts,
           CASE WHEN $9::bool
                THEN coalesce((SELECT bool_and(k.fits) FROM counters AS k), true)
                ELSE coalesce((SELECT bool_and(h.count <= k.lim)
                               FROM hits AS h JOIN counters AS k USING (namespace)), true)
           END AS admits
    FROM live
), writes AS (
    -- Each counter's row as the step leaves it, for the rows it changes.
    SELECT k.namespace,
           CASE WHEN NOT $9::bool THEN h.count
                WHEN NOT step.admits THEN NULL
                WHEN k.cost >= 9223372036854775806 - k.live THEN 9223372036854775806
                ELSE k.live + k.cost END AS count,
           CASE WHEN NOT $9::bool THEN h.opens
                WHEN step.admits AND NOT k.open
                    THEN statement_timestamp() + k.window_ms * interval '1 millisecond' END
               AS opens,
           CASE WHEN $9::bool AND NOT step.admits AND NOT k.fits AND NOT k.locked
                THEN statement_timestamp() + $12::bigint * interval '1 millisecond' END
               AS blocks
    FROM counters AS k JOIN hits AS h USING (namespace), step
    WHERE step.ok AND step.counts
      AND (NOT $9::bool
           OR (step.admits AND ((k.cost > 0) OR (NOT k.open AND $11::bool)))
           OR (NOT step.admits AND NOT k.fits AND NOT k.locked AND $12::bigint IS NOT NULL))
), counted AS (
    UPDATE {table} AS c
    SET count = coalesce(w.count, c.count),
        expires_at = coalesce(w.opens, c.expires_at),
        blocked_until = coalesce(w.blocks, c.blocked_until)
    FROM writes AS w
    WHERE c.namespace = w.namespace AND c.key = $2
    RETURNING 1
), taken AS (
    UPDATE {slots} AS c
    SET (slots, leases, expires_at) = (
        SELECT CASE WHEN t.takes THEN live.slots || ARRAY[$3::text] ELSE live.slots END,
               CASE WHEN t.takes
                    THEN live.leases
                         || (statement_timestamp() + $5::bigint * interval '1 millisecond')
                    ELSE live.leases END,
               CASE WHEN t.takes
                    THEN greatest(c.expires_at,
                                  statement_timestamp() + $5::bigint * interval '1 millisecond')
                    ELSE c.expires_at END
        FROM live)
    FROM (SELECT step.ok, step.counts AND step.admits AS takes FROM step) AS t
    WHERE c.namespace = $1 AND c.key = $2 AND t.ok
    RETURNING t.takes
)
SELECT step.found, step.fine, step.ok, step.held, step.in_use, step.earliest,
       step.counts, coalesce((SELECT taken.takes FROM taken), false),
       (SELECT count(*) FROM counted), statement_timestamp(),
       s.namespace, s.was, s.bad, s.count, s.expires_at, s.blocked_until,
       h.count, coalesce(h.opens, s.expires_at),
       -- The verdict, for take_end.sql: a failed step is rolled back.
       set_config('tpw.take_all', CASE WHEN step.ok THEN 'ok' ELSE 'failed' END, true)
FROM step
LEFT JOIN seen AS s ON true
LEFT JOIN hits AS h ON h.namespace = s.namespace
ORDER BY s.i
