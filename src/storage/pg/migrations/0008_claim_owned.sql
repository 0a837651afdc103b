-- A turn's claim that also checks whose session it is (issue 17: the turn's separate ownership read
-- folded into the claim, one statement fewer a turn). Nothing is locked, and no row comes back, for
-- a session that does not exist, is deleted or is another user's. Otherwise as nplt_try_claim
-- (migration 0005): the lock if it is free and, only then, the last visible message, read with a
-- snapshot taken after the lock; plus the session's model and title, which the turn needs.
CREATE FUNCTION nplt_claim_owned(lock_key bigint, sid text, uid text)
RETURNS TABLE (got boolean, last_id bigint, last_body bytea, model text, title bytea)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    s_model text;
    s_title bytea;
BEGIN
    SELECT s.model, s.title INTO s_model, s_title FROM nplt_sessions s
    WHERE s.session_id = sid AND s.user_id = uid AND NOT s.deleted;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT pg_try_advisory_lock(lock_key) THEN
        RETURN QUERY SELECT false, NULL::bigint, NULL::bytea, s_model, s_title;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, m.id, m.body, s_model, s_title FROM nplt_sessions s LEFT JOIN LATERAL (
        SELECT n.id, n.body FROM nplt_messages n
        WHERE n.session_id = s.session_id AND n.id > s.cleared_through ORDER BY n.id DESC LIMIT 1) m ON true
    WHERE s.session_id = sid;
END
$$;
