-- Session lock claims and releases of one holder connection in one statement (issue 17): the claims
-- and releases a node has waiting for a holder connection while it runs a statement go together in
-- its next one, in the order they were asked. Entry i with sids[i] NULL releases keys[i]
-- (pg_advisory_unlock); otherwise it is nplt_claim_owned(keys[i], sids[i], uids[i]) (migration 0008),
-- whose row, if any, comes back with k = i.
CREATE FUNCTION nplt_lock_ops(keys bigint[], sids text[], uids text[])
RETURNS TABLE (k integer, got boolean, last_id bigint, last_body bytea, model text, title bytea)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    FOR i IN 1 .. coalesce(array_length(keys, 1), 0) LOOP
        IF sids[i] IS NULL THEN
            PERFORM pg_advisory_unlock(keys[i]);
        ELSE
            RETURN QUERY SELECT i, c.got, c.last_id, c.last_body, c.model, c.title
                FROM nplt_claim_owned(keys[i], sids[i], uids[i]) c;
        END IF;
    END LOOP;
END
$$;
