-- tower-pinned-window: the rows of a batch of spends and amends, as they
-- stand, locked (the first statement locked them; FOR UPDATE also locks a
-- row that only amends name and that appeared since), with the database's
-- clock, and the reset markers among the deadlines the batch's amends name
-- (see migrate.sql). The batch is decided from these, in the order its
-- requests were queued, and written back by spend_write.sql.
-- The transaction's id comes last: should the COMMIT's reply be lost,
-- txid_status says whether it committed (see spend.rs, "Lost replies").
-- $1 namespaces, $2 keys (each counter once), $3 the amends' deadlines.
SELECT c.namespace, c.key, c.count, c.expires_at, c.blocked_until, statement_timestamp(),
       ARRAY(SELECT r.expires_at FROM {resets} r
             WHERE r.expires_at = ANY($3::timestamptz[])
               AND r.namespace = c.namespace AND r.key = c.key),
       txid_current()
FROM {table} c
JOIN unnest($1::text[], $2::bytea[]) AS h(namespace, key)
  ON c.namespace = h.namespace AND c.key = h.key
ORDER BY c.namespace, c.key
FOR UPDATE OF c
