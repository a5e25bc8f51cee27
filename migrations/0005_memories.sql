-- Long-term memory (SPEC §5): facts distilled from events, their history, and what the queue of
-- events needs to be worked by several workers with leases, retries and backoff.

-- pg_trgm and btree_gin (postgresql-contrib) in pg_catalog, so that functions with the fixed
-- search_path (pg_catalog, pg_temp) find their operators; btree_gin lets one GIN index hold the
-- namespace and actor beside the words, so a search reads only that actor's entries. Installed
-- elsewhere already: say how to move it. Created here: recorded, so that uninstall drops it.
DO $$
DECLARE
    ext text;
    placed text;
BEGIN
    FOREACH ext IN ARRAY ARRAY['pg_trgm', 'btree_gin'] LOOP
        placed := (SELECT e.extnamespace::regnamespace::text FROM pg_catalog.pg_extension e
                   WHERE e.extname = ext);
        IF placed IS NULL THEN
            EXECUTE format('CREATE EXTENSION %I WITH SCHEMA pg_catalog', ext);
            INSERT INTO aidb_memory.runtime_settings (key, value)
            VALUES ('created_' || ext, 'true') ON CONFLICT (key) DO NOTHING;
        ELSIF placed <> 'pg_catalog' THEN
            RAISE EXCEPTION 'aidb_memory needs the % extension in schema pg_catalog; it is in %',
                ext, placed USING HINT = format('ALTER EXTENSION %I SET SCHEMA pg_catalog', ext);
        END IF;
    END LOOP;
END
$$;

-- A fact about an actor. Current while valid_to is NULL; a superseded fact keeps its row (with
-- valid_to and superseded_by) and extraction never deletes one: only delete, forget and
-- namespace_drop do, and they leave no trace of the content.
CREATE TABLE aidb_memory.memory (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    public_id       uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    namespace_id    bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id        text NOT NULL,
    agent_id        text,
    session_id      text,
    content         text NOT NULL CHECK (content <> ''),
    -- sha256 of the normalized content (lower case, single spaces, no trailing punctuation):
    -- what makes an exact duplicate.
    content_hash    text NOT NULL,
    tsv             tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED,
    embedding       real[],
    embedding_model text,
    source_event    bigint REFERENCES aidb_memory.event (id) ON DELETE SET NULL,
    valid_from      timestamptz NOT NULL DEFAULT now(),
    valid_to        timestamptz,
    superseded_by   bigint REFERENCES aidb_memory.memory (id) ON DELETE SET NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (embedding IS NULL OR embedding_model IS NOT NULL)
);
-- One current memory per actor and normalized content.
CREATE UNIQUE INDEX memory_current_hash_idx
    ON aidb_memory.memory (namespace_id, actor_id, content_hash) WHERE valid_to IS NULL;
CREATE INDEX memory_actor_idx ON aidb_memory.memory (namespace_id, actor_id, created_at);
-- Search reads one actor's current memories: the GIN indexes lead with the namespace and actor.
CREATE INDEX memory_tsv_idx ON aidb_memory.memory USING gin (namespace_id, actor_id, tsv)
    WHERE valid_to IS NULL;

CREATE INDEX memory_event_idx ON aidb_memory.memory (source_event);
CREATE INDEX memory_superseded_idx ON aidb_memory.memory (superseded_by);

-- The words of each actor's memories (the lexemes of memory.tsv), kept by triggers (sql/): where
-- search looks for the words nearest a misspelled one, by trigram similarity, before a full-text
-- query with them. Trigrams over a vocabulary stay cheap however many memories use its words.
CREATE TABLE aidb_memory.memory_word (
    namespace_id bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id     text NOT NULL,
    word         text NOT NULL,
    PRIMARY KEY (namespace_id, actor_id, word)
);
CREATE INDEX memory_word_trgm_idx ON aidb_memory.memory_word
    USING gin (namespace_id, actor_id, word pg_catalog.gin_trgm_ops);

-- Every change to a memory, with the event that caused it (NULL for an API call).
CREATE TABLE aidb_memory.memory_history (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    memory_id    bigint NOT NULL REFERENCES aidb_memory.memory (id) ON DELETE CASCADE,
    namespace_id bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    actor_id     text NOT NULL,
    event_id     bigint REFERENCES aidb_memory.event (id) ON DELETE SET NULL,
    operation    text NOT NULL CHECK (operation IN ('add', 'update', 'supersede', 'invalidate')),
    old_content  text,
    new_content  text,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX memory_history_memory_idx ON aidb_memory.memory_history (memory_id);
CREATE INDEX memory_history_actor_idx ON aidb_memory.memory_history (namespace_id, actor_id);
CREATE INDEX memory_history_event_idx ON aidb_memory.memory_history (event_id);

-- The queue: a failed attempt waits until next_attempt_at (backoff); a claim holds a lease
-- until lease_until, after which another worker may take the event over.
ALTER TABLE aidb_memory.event ADD COLUMN next_attempt_at timestamptz;
ALTER TABLE aidb_memory.event ADD COLUMN result jsonb;
