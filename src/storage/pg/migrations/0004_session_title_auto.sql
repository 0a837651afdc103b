-- True while a session's title is the automatic one made from its first message: a clear sets it
-- back to "New chat" (the next first message names the session again); a title the user set stays.
ALTER TABLE nplt_sessions ADD COLUMN title_auto boolean NOT NULL DEFAULT false;
