-- tower-pinned-window: the statement after take_all.sql, in its
-- transaction, before its COMMIT. take_all.sql leaves its verdict in the
-- transaction's setting tpw.take_all: 'ok', or 'failed' when a record or a
-- row not of the store's shape stopped the step (it then wrote nothing).
-- A failed step aborts the transaction here, so its COMMIT rolls back what
-- the locks before it made (an empty record of slots, counters as closed
-- windows): a step that fails changes nothing. Plain SQL raises no error
-- of its own, so a cast that fails raises it, with a message that says why.
SELECT CASE WHEN current_setting('tpw.take_all', true) = 'ok' THEN 0
            ELSE ('tower-pinned-window: a take_all stopped by corrupt state is rolled back ('
                  || coalesce(current_setting('tpw.take_all', true), 'no verdict') || ')')::int
       END
