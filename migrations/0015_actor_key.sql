-- Scale out by actor (issue 15): every per-actor table carries actor_key, the one key a
-- distributed PostgreSQL (Citus) can shard them all by, so that every call on one (namespace,
-- actor) touches one shard. docs/scaling.md has the rules this follows; in short:
--   * actor_key is derived from (namespace name, actor id) by aidb_memory.actor_key (sql/05_keys.sql;
--     the server code's keys.actor_key computes the same number, a test holds them equal): every
--     API call names both, so every call knows its key before it reads anything. A namespace's
--     name never changes;
--   * it leads every primary key, unique constraint and foreign key between per-actor tables, and
--     every index a hot statement reads (which filters on it);
--   * no identity columns (Citus refuses to distribute a table with one): ids come from plain
--     sequences, unique only together with actor_key; public ids stay UUIDs.
-- The conversion rewrites every per-actor table once (an UPDATE of each row): on a large
-- installation run it in a maintenance window (docs/operations.md, "Upgrading").

-- The key: the first 8 bytes of SHA-256 of "<namespace name>:<actor id>" as a signed bigint. A
-- standard hash, not PostgreSQL's internal one, so that it is the same on every architecture and
-- major version, and in Python. (sql/05_keys.sql defines it again, as install keeps only the
-- functions sql/ defines.)
CREATE FUNCTION aidb_memory.actor_key(namespace text, actor_id text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(
            pg_catalog.substr(
                pg_catalog.sha256(pg_catalog.convert_to(
                    namespace OPERATOR(pg_catalog.||) ':'
                    OPERATOR(pg_catalog.||) actor_id, 'UTF8')),
                1, 8),
            'hex'))::bit(64)::bigint;
COMMENT ON FUNCTION aidb_memory.actor_key(text, text) IS
'The distribution key of an actor''s rows (docs/scaling.md).';

-- 1. The foreign keys between per-actor tables go first: they depend on the keys replaced below.
ALTER TABLE aidb_memory.turn DROP CONSTRAINT turn_session_ref_fkey;
ALTER TABLE aidb_memory.turn DROP CONSTRAINT turn_event_ref_fkey;
ALTER TABLE aidb_memory.summary DROP CONSTRAINT summary_session_ref_fkey;
ALTER TABLE aidb_memory.memory DROP CONSTRAINT memory_source_event_fkey;
ALTER TABLE aidb_memory.memory DROP CONSTRAINT memory_superseded_by_fkey;
ALTER TABLE aidb_memory.memory_history DROP CONSTRAINT memory_history_memory_id_fkey;
ALTER TABLE aidb_memory.memory_history DROP CONSTRAINT memory_history_event_id_fkey;

-- 2. The key of every existing row. Rows of the lock tables whose session is gone (they have no
-- foreign key, and a deletion skips a row a compaction holds) have no key: they go. Install runs
-- each UPDATE marked "backfill" in batches, with progress (src/aidb_memory/install/backfill.py).
ALTER TABLE aidb_memory.session ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.session AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id)
FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id;
ALTER TABLE aidb_memory.event ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.event AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id)
FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id;
ALTER TABLE aidb_memory.memory ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.memory AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id)
FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id;
ALTER TABLE aidb_memory.memory_word ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.memory_word AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id)
FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id;
ALTER TABLE aidb_memory.memory_history ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.memory_history AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id)
FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id;
ALTER TABLE aidb_memory.actor_lock ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.actor_lock AS x SET actor_key = aidb_memory.actor_key(n.name, x.actor_id)
FROM aidb_memory.namespace AS n WHERE n.id = x.namespace_id;

ALTER TABLE aidb_memory.turn ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.turn AS t SET actor_key = s.actor_key
FROM aidb_memory.session AS s WHERE s.id = t.session_ref;
ALTER TABLE aidb_memory.summary ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.summary AS x SET actor_key = s.actor_key
FROM aidb_memory.session AS s WHERE s.id = x.session_ref;
ALTER TABLE aidb_memory.compaction_lock ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.compaction_lock AS x SET actor_key = s.actor_key
FROM aidb_memory.session AS s WHERE s.id = x.session_ref;
DELETE FROM aidb_memory.compaction_lock WHERE actor_key IS NULL;
ALTER TABLE aidb_memory.compaction_failure ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.compaction_failure AS x SET actor_key = s.actor_key
FROM aidb_memory.session AS s WHERE s.id = x.session_ref;
DELETE FROM aidb_memory.compaction_failure WHERE actor_key IS NULL;
ALTER TABLE aidb_memory.compaction_ahead ADD COLUMN actor_key bigint;
-- backfill: a row's key from its own columns and its namespace or session
UPDATE aidb_memory.compaction_ahead AS x SET actor_key = s.actor_key
FROM aidb_memory.session AS s WHERE s.id = x.session_ref;
DELETE FROM aidb_memory.compaction_ahead WHERE actor_key IS NULL;

ALTER TABLE aidb_memory.session ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.event ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.memory ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.memory_word ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.memory_history ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.actor_lock ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.turn ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.summary ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.compaction_lock ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.compaction_failure ALTER COLUMN actor_key SET NOT NULL;
ALTER TABLE aidb_memory.compaction_ahead ALTER COLUMN actor_key SET NOT NULL;

-- 3. Ids from plain sequences instead of identity columns, continuing where the identity was.
ALTER TABLE aidb_memory.session ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE aidb_memory.session_id_seq AS bigint OWNED BY aidb_memory.session.id;
SELECT pg_catalog.setval('aidb_memory.session_id_seq',
                         (SELECT pg_catalog.max(id) FROM aidb_memory.session) + 1, false)
WHERE EXISTS (SELECT FROM aidb_memory.session);
ALTER TABLE aidb_memory.session
    ALTER COLUMN id SET DEFAULT pg_catalog.nextval('aidb_memory.session_id_seq'::pg_catalog.regclass);

ALTER TABLE aidb_memory.event ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE aidb_memory.event_id_seq AS bigint OWNED BY aidb_memory.event.id;
SELECT pg_catalog.setval('aidb_memory.event_id_seq',
                         (SELECT pg_catalog.max(id) FROM aidb_memory.event) + 1, false)
WHERE EXISTS (SELECT FROM aidb_memory.event);
ALTER TABLE aidb_memory.event
    ALTER COLUMN id SET DEFAULT pg_catalog.nextval('aidb_memory.event_id_seq'::pg_catalog.regclass);

ALTER TABLE aidb_memory.summary ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE aidb_memory.summary_id_seq AS bigint OWNED BY aidb_memory.summary.id;
SELECT pg_catalog.setval('aidb_memory.summary_id_seq',
                         (SELECT pg_catalog.max(id) FROM aidb_memory.summary) + 1, false)
WHERE EXISTS (SELECT FROM aidb_memory.summary);
ALTER TABLE aidb_memory.summary
    ALTER COLUMN id SET DEFAULT pg_catalog.nextval('aidb_memory.summary_id_seq'::pg_catalog.regclass);

ALTER TABLE aidb_memory.memory ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE aidb_memory.memory_id_seq AS bigint OWNED BY aidb_memory.memory.id;
SELECT pg_catalog.setval('aidb_memory.memory_id_seq',
                         (SELECT pg_catalog.max(id) FROM aidb_memory.memory) + 1, false)
WHERE EXISTS (SELECT FROM aidb_memory.memory);
ALTER TABLE aidb_memory.memory
    ALTER COLUMN id SET DEFAULT pg_catalog.nextval('aidb_memory.memory_id_seq'::pg_catalog.regclass);

ALTER TABLE aidb_memory.memory_history ALTER COLUMN id DROP IDENTITY;
CREATE SEQUENCE aidb_memory.memory_history_id_seq AS bigint OWNED BY aidb_memory.memory_history.id;
SELECT pg_catalog.setval('aidb_memory.memory_history_id_seq',
                         (SELECT pg_catalog.max(id) FROM aidb_memory.memory_history) + 1, false)
WHERE EXISTS (SELECT FROM aidb_memory.memory_history);
ALTER TABLE aidb_memory.memory_history
    ALTER COLUMN id SET DEFAULT
        pg_catalog.nextval('aidb_memory.memory_history_id_seq'::pg_catalog.regclass);

-- 4. Primary keys and unique constraints, each led by actor_key.
ALTER TABLE aidb_memory.session DROP CONSTRAINT session_pkey;
ALTER TABLE aidb_memory.session ADD CONSTRAINT session_pkey PRIMARY KEY (actor_key, id);
ALTER TABLE aidb_memory.session DROP CONSTRAINT session_namespace_id_actor_id_session_id_key;
ALTER TABLE aidb_memory.session ADD CONSTRAINT session_actor_session_key
    UNIQUE (actor_key, namespace_id, actor_id, session_id);
DROP INDEX aidb_memory.session_actor_idx;
CREATE INDEX session_actor_idx ON aidb_memory.session (actor_key, agent_id, closed_at DESC);

ALTER TABLE aidb_memory.event DROP CONSTRAINT event_pkey;
ALTER TABLE aidb_memory.event ADD CONSTRAINT event_pkey PRIMARY KEY (actor_key, id);
ALTER TABLE aidb_memory.event DROP CONSTRAINT event_public_id_key;
ALTER TABLE aidb_memory.event ADD CONSTRAINT event_public_id_key UNIQUE (actor_key, public_id);
DROP INDEX aidb_memory.event_idempotency_idx;
CREATE UNIQUE INDEX event_idempotency_idx
    ON aidb_memory.event (actor_key, namespace_id, actor_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX aidb_memory.event_actor_idx;
CREATE INDEX event_actor_idx ON aidb_memory.event (actor_key);
DROP INDEX aidb_memory.event_compaction_pending_idx;
CREATE UNIQUE INDEX event_compaction_pending_idx ON aidb_memory.event (actor_key, session_ref)
    WHERE kind = 'compaction' AND status IN ('accepted', 'processing');
-- The queue (event_queue_idx, on id among pending events) stays: a claim takes the oldest event
-- of the key range it is given (or of all), and pending events are few.

ALTER TABLE aidb_memory.turn DROP CONSTRAINT turn_pkey;
ALTER TABLE aidb_memory.turn ADD CONSTRAINT turn_pkey PRIMARY KEY (actor_key, session_ref, seq);
DROP INDEX aidb_memory.turn_offset_idx;
CREATE INDEX turn_offset_idx ON aidb_memory.turn (actor_key, session_ref, char_offset, seq);
DROP INDEX aidb_memory.turn_event_idx;
CREATE INDEX turn_event_idx ON aidb_memory.turn (actor_key, event_ref);

ALTER TABLE aidb_memory.summary DROP CONSTRAINT summary_pkey;
ALTER TABLE aidb_memory.summary ADD CONSTRAINT summary_pkey PRIMARY KEY (actor_key, id);
DROP INDEX aidb_memory.summary_session_idx;
CREATE INDEX summary_session_idx ON aidb_memory.summary (actor_key, session_ref, to_seq);
DROP INDEX aidb_memory.summary_start_idx;
CREATE UNIQUE INDEX summary_start_idx ON aidb_memory.summary (actor_key, session_ref, from_seq);

ALTER TABLE aidb_memory.memory DROP CONSTRAINT memory_pkey;
ALTER TABLE aidb_memory.memory ADD CONSTRAINT memory_pkey PRIMARY KEY (actor_key, id);
ALTER TABLE aidb_memory.memory DROP CONSTRAINT memory_public_id_key;
ALTER TABLE aidb_memory.memory ADD CONSTRAINT memory_public_id_key UNIQUE (actor_key, public_id);
DROP INDEX aidb_memory.memory_current_hash_idx;
CREATE UNIQUE INDEX memory_current_hash_idx
    ON aidb_memory.memory (actor_key, namespace_id, actor_id, content_hash) WHERE valid_to IS NULL;
DROP INDEX aidb_memory.memory_actor_idx;
-- An actor's newest memories (reconciliation, the vector signal) by a backward index scan.
CREATE INDEX memory_actor_idx ON aidb_memory.memory (actor_key, namespace_id, actor_id, created_at);
DROP INDEX aidb_memory.memory_tsv_idx;
CREATE INDEX memory_tsv_idx ON aidb_memory.memory USING gin (actor_key, tsv)
    WHERE valid_to IS NULL;
DROP INDEX aidb_memory.memory_event_idx;
CREATE INDEX memory_event_idx ON aidb_memory.memory (actor_key, source_event);
DROP INDEX aidb_memory.memory_superseded_idx;
CREATE INDEX memory_superseded_idx ON aidb_memory.memory (actor_key, superseded_by);

ALTER TABLE aidb_memory.memory_word DROP CONSTRAINT memory_word_pkey;
ALTER TABLE aidb_memory.memory_word ADD CONSTRAINT memory_word_pkey
    PRIMARY KEY (actor_key, namespace_id, actor_id, word);
DROP INDEX aidb_memory.memory_word_trgm_idx;
DO $$
BEGIN
    EXECUTE pg_catalog.format('CREATE INDEX memory_word_trgm_idx ON aidb_memory.memory_word '
                              'USING gin (actor_key, word %I.gin_trgm_ops)',
                              (SELECT n.nspname
                               FROM pg_catalog.pg_extension AS e
                               JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
                               WHERE e.extname = 'pg_trgm'));
END
$$;

ALTER TABLE aidb_memory.memory_history DROP CONSTRAINT memory_history_pkey;
ALTER TABLE aidb_memory.memory_history ADD CONSTRAINT memory_history_pkey PRIMARY KEY (actor_key, id);
DROP INDEX aidb_memory.memory_history_memory_idx;
CREATE INDEX memory_history_memory_idx ON aidb_memory.memory_history (actor_key, memory_id);
DROP INDEX aidb_memory.memory_history_event_idx;
CREATE INDEX memory_history_event_idx ON aidb_memory.memory_history (actor_key, event_id);
-- The primary key leads with actor_key: an actor's history needs no index of its own.
DROP INDEX aidb_memory.memory_history_actor_idx;

ALTER TABLE aidb_memory.actor_lock DROP CONSTRAINT actor_lock_pkey;
ALTER TABLE aidb_memory.actor_lock ADD CONSTRAINT actor_lock_pkey
    PRIMARY KEY (actor_key, namespace_id, actor_id);
ALTER TABLE aidb_memory.compaction_lock DROP CONSTRAINT compaction_lock_pkey;
ALTER TABLE aidb_memory.compaction_lock ADD CONSTRAINT compaction_lock_pkey
    PRIMARY KEY (actor_key, session_ref);
ALTER TABLE aidb_memory.compaction_failure DROP CONSTRAINT compaction_failure_pkey;
ALTER TABLE aidb_memory.compaction_failure ADD CONSTRAINT compaction_failure_pkey
    PRIMARY KEY (actor_key, session_ref, model_name);
ALTER TABLE aidb_memory.compaction_ahead DROP CONSTRAINT compaction_ahead_pkey;
ALTER TABLE aidb_memory.compaction_ahead ADD CONSTRAINT compaction_ahead_pkey
    PRIMARY KEY (actor_key, session_ref);

-- 5. The foreign keys again, each with actor_key: between co-located rows of one actor. Citus
-- allows only CASCADE, RESTRICT and NO ACTION between distributed tables (not SET NULL, even with
-- a column list), so the references to events and to the memory that superseded another no
-- longer null themselves: an event goes only with its actor (forget, which deletes what refers
-- to it first) or its namespace, and memories.delete clears superseded_by where it points to a
-- memory it deletes.
ALTER TABLE aidb_memory.turn ADD CONSTRAINT turn_session_ref_fkey
    FOREIGN KEY (actor_key, session_ref) REFERENCES aidb_memory.session (actor_key, id)
    ON DELETE CASCADE;
ALTER TABLE aidb_memory.turn ADD CONSTRAINT turn_event_ref_fkey
    FOREIGN KEY (actor_key, event_ref) REFERENCES aidb_memory.event (actor_key, id)
    ON DELETE NO ACTION;
ALTER TABLE aidb_memory.summary ADD CONSTRAINT summary_session_ref_fkey
    FOREIGN KEY (actor_key, session_ref) REFERENCES aidb_memory.session (actor_key, id)
    ON DELETE CASCADE;
ALTER TABLE aidb_memory.memory ADD CONSTRAINT memory_source_event_fkey
    FOREIGN KEY (actor_key, source_event) REFERENCES aidb_memory.event (actor_key, id)
    ON DELETE NO ACTION;
ALTER TABLE aidb_memory.memory ADD CONSTRAINT memory_superseded_by_fkey
    FOREIGN KEY (actor_key, superseded_by) REFERENCES aidb_memory.memory (actor_key, id)
    ON DELETE NO ACTION;
ALTER TABLE aidb_memory.memory_history ADD CONSTRAINT memory_history_memory_id_fkey
    FOREIGN KEY (actor_key, memory_id) REFERENCES aidb_memory.memory (actor_key, id)
    ON DELETE CASCADE;
ALTER TABLE aidb_memory.memory_history ADD CONSTRAINT memory_history_event_id_fkey
    FOREIGN KEY (actor_key, event_id) REFERENCES aidb_memory.event (actor_key, id)
    ON DELETE NO ACTION;

ANALYZE aidb_memory.session, aidb_memory.turn, aidb_memory.summary, aidb_memory.event,
    aidb_memory.memory, aidb_memory.memory_word, aidb_memory.memory_history;

