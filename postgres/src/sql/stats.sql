-- tower-pinned-window: rows in the table, and how many of them have expired
-- and wait for the cleaner.
SELECT count(*), count(*) FILTER (WHERE expires_at <= statement_timestamp())
FROM {table}
