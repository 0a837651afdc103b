-- The session a spilled event between nodes belongs to (migration 0003; NULL for an event of no
-- session), so a session's spilled events are deleted with it when it is purged, deleted or cleared,
-- not only when they are old.
ALTER TABLE nplt_cluster_events ADD COLUMN session_id text;
CREATE INDEX nplt_cluster_events_session ON nplt_cluster_events (session_id) WHERE session_id IS NOT NULL;
