-- Group commit of appends (issue 17): the appends a node has waiting while one is in flight go to
-- PostgreSQL together, in one statement and one transaction (one commit, one WAL flush), instead of
-- one round trip each. Entry k is the append of message bodies[k] to session sids[k], exactly as the
-- single-statement append does it (the next id, the counters, updated_at and the preview). Entries
-- are applied in the order of their session ids (entries of one session in the order given), so two
-- batches of different nodes lock their session rows in the same order and cannot deadlock.
--
-- One row comes back per appended entry (none for a session that does not exist): its index k, the
-- new message's id and the session's columns after the append (summaries and system prompt only for
-- an entry that reads, below). An entry with afters[k] not NULL also reads the visible messages with
-- an id above afters[k], its own excepted: one row each, in id order (id and body), or one row with
-- a NULL id when there are none. That is what the memory layer reads at the start of a turn.
CREATE FUNCTION nplt_append_many(sids text[], stamps text[], previews bytea[], bodies bytea[],
                                 texts text[], afters bigint[])
RETURNS TABLE (k integer, mid bigint, session_id text, user_id text, title bytea, created_at text,
               updated_at text, message_count integer, deleted boolean, model text, preview bytea,
               summaries bytea, system_prompt bytea, title_auto boolean, cleared_through bigint,
               id bigint, body bytea)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    i integer;
    s nplt_sessions%ROWTYPE;
BEGIN
    FOR i IN SELECT u.o FROM unnest(sids) WITH ORDINALITY AS u(sid, o) ORDER BY u.sid COLLATE "C", u.o LOOP
        UPDATE nplt_sessions n SET next_id = n.next_id + 1, message_count = n.message_count + 1,
               updated_at = stamps[i], preview = previews[i]
        WHERE n.session_id = sids[i] RETURNING n.* INTO s;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO nplt_messages (session_id, id, body, search_text)
        VALUES (sids[i], s.next_id - 1, bodies[i], texts[i]);
        RETURN QUERY SELECT i, s.next_id - 1, s.session_id, s.user_id, s.title, s.created_at, s.updated_at,
               s.message_count, s.deleted, s.model, s.preview,
               CASE WHEN afters[i] IS NULL THEN NULL ELSE s.summaries END,
               CASE WHEN afters[i] IS NULL THEN NULL ELSE s.system_prompt END, s.title_auto,
               s.cleared_through, m.id, m.body
        FROM (SELECT 1) one LEFT JOIN LATERAL (
            SELECT n.id, n.body FROM nplt_messages n
            WHERE afters[i] IS NOT NULL AND n.session_id = sids[i]
              AND n.id > greatest(s.cleared_through, afters[i]) AND n.id < s.next_id - 1
            ORDER BY n.id) m ON true;
    END LOOP;
END
$$;
