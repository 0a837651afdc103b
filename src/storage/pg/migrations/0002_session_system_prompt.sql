-- A system prompt per session (NULL: the server's configured prompt). UTF-8 bytes, like titles,
-- so a prompt may hold NUL characters as in the JSON backend.
ALTER TABLE nplt_sessions ADD COLUMN system_prompt bytea;
