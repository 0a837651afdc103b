-- Long-term user memory on PostgreSQL (issue 18, item 2; docs/memory.md "Long-term user memory"):
-- one row per user holding the document the JSON backend keeps in a file (items, learned positions,
-- tombstones of forgotten items, sessions being forgotten), so every node sees the same memory.
-- ``version`` counts writes: a node writes only over the version it read (compare and set).
CREATE TABLE nplt_user_memory (
    user_id  text COLLATE "C" PRIMARY KEY,
    doc      jsonb NOT NULL,
    version  bigint NOT NULL
);
