-- The other members who uploaded the same bytes into a group document (docs/knowledge.md
-- "Duplicates"), in upload order: its uploader's delete passes the document to the first of them
-- instead of removing it. Empty for every document stored before.
ALTER TABLE nplt_kb_documents ADD COLUMN IF NOT EXISTS co_uploaders text[] COLLATE "C" NOT NULL DEFAULT '{}';
