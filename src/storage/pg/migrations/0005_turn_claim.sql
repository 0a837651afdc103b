-- One round trip for what a turn does when it claims its session (issue 17, cluster): take the
-- session's advisory lock if it is free and, only then, read the session's last visible message (a
-- turn cut short by a dead node leaves an unanswered user message there). In a VOLATILE function
-- each query takes a new snapshot, so the read sees everything the previous holder committed before
-- it let the lock go. No row for a session that does not exist (the lock is taken all the same).
CREATE FUNCTION nplt_try_claim(lock_key bigint, sid text)
RETURNS TABLE (got boolean, last_id bigint, last_body bytea)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT pg_try_advisory_lock(lock_key) THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::bytea;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, m.id, m.body FROM nplt_sessions s LEFT JOIN LATERAL (
        SELECT id, body FROM nplt_messages
        WHERE session_id = s.session_id AND id > s.cleared_through ORDER BY id DESC LIMIT 1) m ON true
    WHERE s.session_id = sid;
END
$$;
