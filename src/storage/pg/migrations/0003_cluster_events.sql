-- Events between server nodes too large for a NOTIFY payload (issue 17): the notification carries
-- the row's id, listeners read the row. Rows are short-lived (deleted after a few minutes), so the
-- table is unlogged: a crash of PostgreSQL may empty it, which only drops events nobody can wait for.
CREATE UNLOGGED TABLE nplt_cluster_events (
    id          bigserial PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    body        bytea NOT NULL        -- the event as JSON
);
CREATE INDEX nplt_cluster_events_age ON nplt_cluster_events (created_at);
