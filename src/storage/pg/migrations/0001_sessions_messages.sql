-- Sessions and their messages. Text columns that are ordered or compared use the "C" collation,
-- so ordering is by code point, as in the JSON backend.
CREATE TABLE nplt_sessions (
    session_id      text COLLATE "C" PRIMARY KEY,
    user_id         text COLLATE "C" NOT NULL,
    title           bytea NOT NULL,              -- UTF-8 (titles may hold NUL characters)
    created_at      text COLLATE "C" NOT NULL,
    updated_at      text COLLATE "C" NOT NULL,
    model           text,
    deleted         boolean NOT NULL DEFAULT false,
    cleared_through bigint NOT NULL DEFAULT 0,   -- messages with id <= this are hidden (clear)
    next_id         bigint NOT NULL DEFAULT 1,
    message_count   integer NOT NULL DEFAULT 0,  -- visible messages
    preview         bytea NOT NULL DEFAULT ''::bytea, -- UTF-8: content may hold NUL characters
    summaries       bytea NOT NULL DEFAULT '\x5b5d'::bytea   -- JSON array of SummaryRecord objects
);
CREATE INDEX nplt_sessions_by_user ON nplt_sessions (user_id, updated_at DESC, session_id DESC);

CREATE TABLE nplt_messages (
    session_id  text COLLATE "C" NOT NULL REFERENCES nplt_sessions ON DELETE CASCADE,
    id          bigint NOT NULL,
    body        bytea NOT NULL,   -- the message as JSON, without its id
    search_text text NOT NULL,    -- casefolded content (NUL as space), for search
    PRIMARY KEY (session_id, id)
);

CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX nplt_messages_trgm ON nplt_messages USING gin (search_text gin_trgm_ops);
