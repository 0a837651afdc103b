-- The knowledge base's server-wide chunk count (docs/knowledge.md "Limits", max_total_chunks), kept
-- in one row so that an upload checks the limit exactly without summing every document: the insert
-- transaction (storage.pg.documents.PgDocuments.insert) locks the row last, FOR UPDATE, and checks
-- it; the trigger below adds a document's chunks when its insert commits and takes them off when its
-- delete commits (a deferred constraint trigger: it runs at the commit, so the row stays unlocked
-- while a document's chunks and bytes are being written). Starts from the documents stored before.
CREATE TABLE nplt_kb_totals (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),   -- a single row
    chunks  bigint NOT NULL
);
INSERT INTO nplt_kb_totals (chunks) SELECT coalesce(sum(chunks), 0) FROM nplt_kb_documents;

CREATE FUNCTION nplt_kb_count_chunks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE nplt_kb_totals SET chunks = chunks + NEW.chunks;
    ELSE
        UPDATE nplt_kb_totals SET chunks = chunks - OLD.chunks;
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER nplt_kb_documents_chunks AFTER INSERT OR DELETE ON nplt_kb_documents
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION nplt_kb_count_chunks();
