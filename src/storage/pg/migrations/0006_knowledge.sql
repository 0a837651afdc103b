-- The knowledge base on PostgreSQL (issue 17; docs/knowledge.md "Storage"): documents, their chunks,
-- their original bytes in blocks, and chunk vectors when embeddings are configured. A document and
-- all its rows are written in one transaction (whole or absent after a crash); deleting the
-- document row deletes the rest (ON DELETE CASCADE).
CREATE TABLE nplt_kb_documents (
    doc_id       text COLLATE "C" PRIMARY KEY,
    collection   text COLLATE "C" NOT NULL,     -- user:<id> or group:<name>
    name         text NOT NULL,                 -- the cleaned base name (metadata, never a path)
    uploader     text COLLATE "C" NOT NULL,
    md5          text NOT NULL,
    sha256       text NOT NULL,
    size         bigint NOT NULL,
    chunks       integer NOT NULL,
    uploaded_at  text COLLATE "C" NOT NULL,     -- ISO 8601, as DocumentInfo.uploaded_at
    created      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (collection, sha256)                 -- the same bytes in one collection are one document
);
CREATE INDEX nplt_kb_documents_uploader ON nplt_kb_documents (uploader);
CREATE INDEX nplt_kb_documents_md5 ON nplt_kb_documents (collection, md5);

CREATE TABLE nplt_kb_chunks (
    doc_id    text COLLATE "C" NOT NULL REFERENCES nplt_kb_documents ON DELETE CASCADE,
    ordinal   integer NOT NULL,
    text      text NOT NULL,                    -- NUL characters stored as U+FFFD
    location  jsonb NOT NULL,                   -- {"heading": [...], "page": n, "lines": [a, b]}
    PRIMARY KEY (doc_id, ordinal)
);
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX nplt_kb_chunks_trgm ON nplt_kb_chunks USING gin (text gin_trgm_ops);

-- The original bytes, in blocks of 1 MiB (seq 0, 1, ...): a download reads one block at a time.
CREATE TABLE nplt_kb_blocks (
    doc_id  text COLLATE "C" NOT NULL REFERENCES nplt_kb_documents ON DELETE CASCADE,
    seq     integer NOT NULL,
    data    bytea NOT NULL,
    PRIMARY KEY (doc_id, seq)
);

-- Chunk embeddings: pgvector's type when the extension can be created, else float4[]. Both read
-- back as float4[] (embedding::float4[]).
DO $$
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS vector;
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'pgvector is not available (%): chunk vectors are stored as float4[]', SQLERRM;
    END;
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector') THEN
        CREATE TABLE nplt_kb_vectors (
            doc_id     text COLLATE "C" NOT NULL REFERENCES nplt_kb_documents ON DELETE CASCADE,
            ordinal    integer NOT NULL,
            embedding  vector NOT NULL,
            PRIMARY KEY (doc_id, ordinal));
    ELSE
        CREATE TABLE nplt_kb_vectors (
            doc_id     text COLLATE "C" NOT NULL REFERENCES nplt_kb_documents ON DELETE CASCADE,
            ordinal    integer NOT NULL,
            embedding  float4[] NOT NULL,
            PRIMARY KEY (doc_id, ordinal));
    END IF;
END
$$;
