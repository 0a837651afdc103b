-- v3 uploads in progress, shared by the nodes (issue 17): the bytes a node has received of an upload,
-- in pieces keyed by where they start in the file, so the client can resume it through any node.
-- Rows go when the upload ends (stored or refused) or expires (upload_expiry_s after its last piece).
CREATE TABLE nplt_upload_parts (
    upload_id  text NOT NULL,
    start_at   bigint NOT NULL,
    data       bytea NOT NULL,
    touched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (upload_id, start_at)
);
CREATE INDEX nplt_upload_parts_touched ON nplt_upload_parts (touched_at);
