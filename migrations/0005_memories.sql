-- supersedes: 6f5d8e2a6763f85670459adab9d8747a017c9bdc39710cff183674c62f4f4cd8
--   The text first released required pg_trgm and btree_gin in pg_catalog and refused any other
--   schema; every database that applied it has them there, where this text puts them too.
-- Long-term memory (SPEC §5): facts distilled from events, their history, and what the queue of
-- events needs to be worked by several workers with leases, retries and backoff.

-- pg_trgm and btree_gin (postgresql-contrib): btree_gin lets one GIN index hold the namespace and
-- actor beside the words, so a search reads only that actor's entries; pg_trgm finds the words
-- nearest a misspelled one. Wherever a database already has them (CREATE EXTENSION puts them in
-- public by default) they are used there: everything of theirs we name is qualified by the schema
-- pg_extension says they are in, never found through search_path (index opclasses here; the
-- server code looks the schema up the same way). Absent: created in pg_catalog and recorded, so
-- that uninstall drops it again (only if nothing else uses it by then).
-- Their functions must be a superuser's: a database owner may create a trusted extension such as
-- pg_trgm (its functions are then the bootstrap superuser's) and add objects of their own to it.
DO $$
DECLARE
    ext text;
    placed text;
    foreign_owner text;
BEGIN
    FOREACH ext IN ARRAY ARRAY['pg_trgm', 'btree_gin'] LOOP
        SELECT n.nspname INTO placed
        FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
        WHERE e.extname = ext;
        IF placed IS NULL THEN
            EXECUTE format('CREATE EXTENSION %I WITH SCHEMA pg_catalog', ext);
            INSERT INTO aidb_memory.runtime_settings (key, value)
            VALUES ('created_' || ext, 'true') ON CONFLICT (key) DO NOTHING;
        END IF;
        SELECT r.rolname INTO foreign_owner
        FROM pg_catalog.pg_depend d
        JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
        JOIN pg_catalog.pg_proc p ON p.oid = d.objid
        JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
        WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
          AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
          AND d.deptype = 'e' AND e.extname = ext AND NOT r.rolsuper
        LIMIT 1;
        IF foreign_owner IS NOT NULL THEN
            RAISE EXCEPTION 'aidb_memory: install refused: a function of extension % is owned by '
                'role %, not a superuser', ext, foreign_owner
                USING ERRCODE = '42501',
                      HINT = format('a superuser runs DROP EXTENSION %I and install creates it '
                                    'again (or recreates it himself)', ext);
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
-- The opclass qualified by pg_trgm's schema (the namespace and actor take btree_gin's default
-- opclasses, which PostgreSQL finds by type, in whatever schema they are).
DO $$
BEGIN
    EXECUTE format('CREATE INDEX memory_word_trgm_idx ON aidb_memory.memory_word '
                   'USING gin (namespace_id, actor_id, word %I.gin_trgm_ops)',
                   (SELECT n.nspname
                    FROM pg_catalog.pg_extension e
                    JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
                    WHERE e.extname = 'pg_trgm'));
END
$$;

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
