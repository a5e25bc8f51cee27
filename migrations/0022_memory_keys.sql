-- A memory's key (issue 34): the application's name for it, unique among the actor's current
-- memories, so that remember with a key it used before replaces that memory in place. Keyed
-- memories are the application's items: two of them may say the same thing (two keys, one text),
-- so the one-current-memory-per-text rule is now the keyless memories' (remember without a key
-- and extraction still find an exact duplicate on it, as before).
ALTER TABLE aidb_memory.memory ADD COLUMN key text;
DROP INDEX aidb_memory.memory_current_hash_idx;
CREATE UNIQUE INDEX memory_current_hash_idx
    ON aidb_memory.memory (actor_key, namespace_id, actor_id, content_hash)
    WHERE valid_to IS NULL AND key IS NULL;
CREATE UNIQUE INDEX memory_key_idx
    ON aidb_memory.memory (actor_key, namespace_id, actor_id, key)
    WHERE valid_to IS NULL AND key IS NOT NULL;

-- Each version of a memory in its history: its metadata, who made the change and why
-- (memory_history). Rows written before have none of them (NULL).
ALTER TABLE aidb_memory.memory_history ADD COLUMN metadata jsonb;
ALTER TABLE aidb_memory.memory_history ADD COLUMN by_role text;
ALTER TABLE aidb_memory.memory_history ADD COLUMN reason text;

-- search and list_memories return the key last (a type's attribute is added in place; the
-- functions that return it are replaced by sql/60_memories.sql). get_memory returns
-- list_memories' row.
ALTER TYPE aidb_memory.search_result ADD ATTRIBUTE key text;
ALTER TYPE aidb_memory.list_memories_result ADD ATTRIBUTE key text;

-- memory_history's rows: its argument id and a result column would share a name.
CREATE TYPE aidb_memory.memory_history_result AS (
    version integer,
    operation text,
    content text,
    previous_content text,
    metadata jsonb,
    at timestamptz,
    by_role text,
    reason text,
    event_id uuid
);
