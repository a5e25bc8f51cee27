-- Provider-native histories (issue 11): a turn keeps the caller's own object when its columns
-- cannot reproduce it, a Responses API item always, a chat message with content parts, a
-- refusal or audio; role developer; the session's tail learns whether parallel Responses calls
-- may still join the open ones. Existing turns and sessions are not rewritten: NULL and false
-- are what they were (plain chat turns).

ALTER TABLE aidb_memory.turn
    ADD COLUMN item jsonb,
    -- The shape the item came in: 'chat' (a Chat Completions message) or 'responses' (a
    -- Responses API item); NULL with the item.
    ADD COLUMN item_format text,
    ADD CONSTRAINT turn_item_format_check CHECK (
        (item IS NULL AND item_format IS NULL)
        OR (item IS NOT NULL AND item_format IN ('chat', 'responses'))
    );
ALTER TABLE aidb_memory.turn DROP CONSTRAINT turn_role_check;
ALTER TABLE aidb_memory.turn ADD CONSTRAINT turn_role_check
    CHECK (role IN ('user', 'assistant', 'system', 'developer', 'tool'));

ALTER TABLE aidb_memory.session
    -- The open calls belong to a Responses model response still in progress (no output has
    -- arrived since they opened): more calls may join them (turns.Tail.joinable).
    ADD COLUMN tail_joinable boolean NOT NULL DEFAULT false,
    -- The Responses type of the session's last turn, NULL after a chat turn (Tail.last_type).
    ADD COLUMN tail_item_type text;
