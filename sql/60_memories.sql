-- Long-term memory (SPEC §5): search, list and erase the facts extraction keeps about an actor;
-- namespace_drop (SPEC §2) erases a whole namespace.

-- The fuzzy signal looks up the words nearest each query word by `%` (similarity above
-- pg_trgm.similarity_threshold), which the trigram index of memory_word answers; the threshold is
-- pinned here for the call, whatever the session set. Its statements are planned once per
-- connection (plan_cache_mode): with the values of a call, the planner would plan the word
-- lookups again on every call, for the same plan.
-- filter and offset (issue 34) came after query_embedding: the old signature would make a call
-- with three to seven arguments ambiguous.
DROP FUNCTION IF EXISTS aidb_memory.search(text, text, text, integer, text, text, double precision[]);
DROP FUNCTION IF EXISTS aidb_memory.search_py(
    text, text, text, integer, text, text, double precision[]);
CREATE OR REPLACE FUNCTION aidb_memory.search(
    namespace text,
    actor_id text,
    query text,
    "limit" integer DEFAULT 10,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL,
    query_embedding double precision[] DEFAULT NULL,
    filter jsonb DEFAULT NULL,
    "offset" integer DEFAULT 0
)
-- A type rather than RETURNS TABLE: the PL/pgSQL wrapper (codebundle.BODY_SUFFIX) cannot
-- have an argument and a result column of one name; migrations/0009_result_types.sql.
RETURNS SETOF aidb_memory.search_result
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
SET pg_trgm.similarity_threshold = 0.3
SET plan_cache_mode = force_generic_plan
AS $py$ memories.search $py$;
COMMENT ON FUNCTION aidb_memory.search(
    text, text, text, integer, text, text, double precision[], jsonb, integer) IS
'The actor''s current memories that best match query, best first: BM25 over the stemmed words '
'of the namespace''s text search configuration (config.text_search_config), a misspelled word '
'standing for the actor''s words nearest it (one edit away, else by trigram similarity), times '
'the share of the query''s words a memory holds; with an embedding model whose vectors the '
'memories have, 0.7 of that and 0.3 of the cosine similarity. score is in [0, 1] (about 1: '
'every word of the query, once). Never superseded, expired, deleted or another actor''s '
'memories. '
'session_id and agent_id filter; limit 1..100. query_embedding: the query''s vector by the '
'namespace''s embedding model, when the application has it (no embedding call is made). '
'filter: the memories to rank among, by metadata, created_at, updated_at, agent_id, session_id '
'and key ($eq $ne $gt $gte $lt $lte $in $nin $exists, $and $or $not); offset: how many of the '
'best to skip (0..1000). Errors: 22004, 22023 empty query, bad limit, offset or filter, or a '
'query_embedding of another dimension, 42704, 42501, 55000 memories embedded with another model '
'than the namespace''s.';

-- A direct write (issue 26): one memory now, in the caller's transaction, without a model.
-- metadata and key, then expires_at and ttl_s (issue 34) came after 0.2's five arguments: an
-- old signature would make a call with three to seven of them ambiguous.
DROP FUNCTION IF EXISTS aidb_memory.remember(text, text, text, text, text);
DROP FUNCTION IF EXISTS aidb_memory.remember_py(text, text, text, text, text);
DROP FUNCTION IF EXISTS aidb_memory.remember(text, text, text, text, text, jsonb);
DROP FUNCTION IF EXISTS aidb_memory.remember_py(text, text, text, text, text, jsonb);
DROP FUNCTION IF EXISTS aidb_memory.remember(text, text, text, text, text, jsonb, text);
DROP FUNCTION IF EXISTS aidb_memory.remember_py(text, text, text, text, text, jsonb, text);
CREATE OR REPLACE FUNCTION aidb_memory.remember(
    namespace text,
    actor_id text,
    content text,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL,
    metadata jsonb DEFAULT NULL,
    key text DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    ttl_s integer DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ remembering.remember $py$;
COMMENT ON FUNCTION aidb_memory.remember(
    text, text, text, text, text, jsonb, text, timestamptz, integer) IS
'Store content as one memory of the actor now, in the caller''s transaction, without a model; '
'returns its id. metadata: a JSON object the memory carries (default {}), returned by search, '
'list_memories and get_memory. key: the application''s name for the memory, unique among the '
'actor''s current memories: a remember with a key the actor has changes that memory in place '
'(same id, content, metadata, session_id and agent_id replaced, an update in its history), and '
'changes nothing when it already says so. Without a key, an exact duplicate of a current keyless '
'memory of the actor (the worker''s rule: the same normalized text) stores nothing and returns '
'that memory''s id (its expiry pushed back if this call''s is later). Searchable by words at '
'once; where the namespace has an embedding model the worker adds its vector. expires_at, or '
'ttl_s (seconds from now; get_memory''s refresh_ttl pushes it as far again): when the memory '
'expires; neither: config.memory_ttl_s, or never. From then on no read returns it, and the '
'worker deletes it (expire_memories). Audited (memory_history) and erased by delete and forget '
'like any memory. Errors: 22004, 22023 empty content or longer than config.memory_max_chars, '
'metadata not an object, longer than config.memory_metadata_max_chars or nested deeper than 8, '
'a bad key, both expires_at and ttl_s, expires_at not in the future, ttl_s not 1..315360000, '
'42704, 42501, 55000 INACTIVE namespace, 25006 read-only transaction.';

-- One memory by its id or key (issue 34): list_memories' row, most often without Python
-- (get_memory_fast). refresh_ttl came after key; it writes (VOLATILE).
DROP FUNCTION IF EXISTS aidb_memory.get_memory(text, text, uuid, text);
DROP FUNCTION IF EXISTS aidb_memory.get_memory_py(text, text, uuid, text);
CREATE OR REPLACE FUNCTION aidb_memory.get_memory(
    namespace text,
    actor_id text,
    id uuid DEFAULT NULL,
    key text DEFAULT NULL,
    refresh_ttl boolean DEFAULT false
)
RETURNS SETOF aidb_memory.list_memories_result
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
-- Its statements (the fast path's, sql/61_get_memory_fast.sql, and the Python code's) are
-- planned once per connection: each is a probe of one index whatever the values.
SET plan_cache_mode = force_generic_plan
AS $py$ addressed.get_memory $py$;
COMMENT ON FUNCTION aidb_memory.get_memory(text, text, uuid, text, boolean) IS
'The actor''s memory with this id (current or superseded), or its current memory with this key '
'(one of the two): one row with list_memories'' columns, or none (an expired memory is none). '
'refresh_ttl: a memory with a time to live (remember''s ttl_s, config.memory_ttl_s) lives that '
'long again from now. Errors: 22004, 22023 both or neither of id and key, 42704, 42501.';

-- The sweep of expired memories (issue 34): the worker's (process_events calls it), an admin's,
-- or a pg_cron job's.
CREATE OR REPLACE FUNCTION aidb_memory.expire_memories(
    max_memories integer DEFAULT 1000,
    key_min bigint DEFAULT NULL,
    key_max bigint DEFAULT NULL
)
RETURNS integer
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ sweeping.expire_memories $py$;
COMMENT ON FUNCTION aidb_memory.expire_memories(integer, bigint, bigint) IS
'Workers and admins: delete up to max_memories (1..100000) expired memories of any actor, '
'soonest expired first, with their history, each actor''s under its lock; returns how many. '
'Audited per actor as expire (counts, reason "expired", never content or ids). With key_min and '
'key_max (inclusive, both or neither), only actors whose actor_key is in that range. '
'process_events calls it once a call. Errors: 22023 bad max_memories or key range.';

CREATE OR REPLACE FUNCTION aidb_memory.update_memory(
    namespace text,
    actor_id text,
    id uuid,
    content text DEFAULT NULL,
    metadata jsonb DEFAULT NULL,
    reason text DEFAULT NULL
)
RETURNS SETOF aidb_memory.list_memories_result
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ addressed.update_memory $py$;
COMMENT ON FUNCTION aidb_memory.update_memory(text, text, uuid, text, jsonb, text) IS
'Correct the actor''s current memory in place (same id): content (NULL keeps it; searchable by '
'its new words at once, its vector computed again by the worker) and/or metadata (NULL keeps it; '
'else replaced as a whole). Recorded in memory_history with the login role and reason. Returns '
'the memory as it is afterwards. Errors: 22004, 22023 neither content nor metadata, bad content '
'or metadata (as remember), 23505 the text of another current keyless memory of the actor, 42704 '
'no current memory with this id, 42501, 55000 INACTIVE namespace, 25006 read-only transaction.';

CREATE OR REPLACE FUNCTION aidb_memory.memory_history(namespace text, actor_id text, id uuid)
RETURNS SETOF aidb_memory.memory_history_result
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ addressed.memory_history $py$;
COMMENT ON FUNCTION aidb_memory.memory_history(text, text, uuid) IS
'Every version of the actor''s memory, oldest first: version, operation (add, update, supersede, '
'invalidate), content after and previous_content, metadata after, at, by_role (the login role), '
'reason, event_id (the event whose extraction made the change). No rows for an id the actor '
'does not have: delete and forget leave no history. Errors: 22004, 42704, 42501.';

-- filter and after (issue 34) came after include_superseded.
DROP FUNCTION IF EXISTS aidb_memory.list_memories(text, text, text, text, integer, boolean);
DROP FUNCTION IF EXISTS aidb_memory.list_memories_py(text, text, text, text, integer, boolean);
CREATE OR REPLACE FUNCTION aidb_memory.list_memories(
    namespace text,
    actor_id text,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL,
    "limit" integer DEFAULT 50,
    include_superseded boolean DEFAULT false,
    filter jsonb DEFAULT NULL,
    after uuid DEFAULT NULL
)
-- A type rather than RETURNS TABLE: the PL/pgSQL wrapper (codebundle.BODY_SUFFIX) cannot
-- have an argument and a result column of one name; migrations/0009_result_types.sql.
RETURNS SETOF aidb_memory.list_memories_result
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ listing.list_memories $py$;
COMMENT ON FUNCTION aidb_memory.list_memories(
    text, text, text, text, integer, boolean, jsonb, uuid) IS
'The actor''s memories, newest first: current ones, and with include_superseded also those a '
'later fact replaced (valid_to and superseded_by set). session_id and agent_id filter, and '
'filter as search''s; limit 1..1000 a page; after: the id of the last memory of the previous '
'page. Errors: 22004, 22023 bad limit or filter, after not a memory of the actor, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.delete(
    namespace text,
    actor_id text,
    selector jsonb,
    reason text,
    session_id text DEFAULT NULL,
    agent_id text DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ memories.delete $py$;
COMMENT ON FUNCTION aidb_memory.delete(text, text, jsonb, text, text, text) IS
'Delete the actor''s memories that selector names — {"ids": [uuid, ...]}, {"all": true} or '
'{"before": timestamp} (created before it) — within the session_id and agent_id filters, current '
'or superseded, with their history; returns how many. The reason is required and recorded in '
'the audit log with the counts, never content or ids. Errors: 22004 NULL selector or reason, '
'22023 bad selector or empty reason, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.forget(namespace text, actor_id text, reason text)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ memories.forget $py$;
COMMENT ON FUNCTION aidb_memory.forget(text, text, text) IS
'Erase every trace of an actor in a namespace: sessions with their turns, summaries and '
'handoffs, events with their turns and idempotency keys, memories and their history. Returns '
'the counts of what it removed; one audit row keeps who, when, the counts and the reason, never '
'content or the actor''s id. Errors: 22004 NULL reason, 22023 empty reason, 42704, 42501.';

CREATE OR REPLACE FUNCTION aidb_memory.namespace_drop(name text, reason text)
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ memories.namespace_drop $py$;
COMMENT ON FUNCTION aidb_memory.namespace_drop(text, text) IS
'Admin: erase a namespace and everything in it (sessions, turns, summaries, events, memories, '
'history); returns the counts. Audited with the namespace name, counts and reason. pg_agents, '
'which the installation creates, is refused (55000). Errors: 22004, 22023 empty reason, 42704 '
'unknown namespace, 55000.';

-- Each lexeme of a memory keyed by its actor: what memory.lexeme_keys holds (the trigger below
-- writes it) and the index memory_lexemes_idx indexes. migrations/0018_lexemes.sql defines it
-- first (it fills the column) in SQL with the same statement. PL/pgSQL here: it keeps the
-- statement's plan for the session, where an SQL function that is SECURITY DEFINER or has SET
-- clauses is never inlined and plans its body again in every transaction (~65 us of remember's
-- ~300, in the trigger below). Not STRICT: PostgreSQL folds a strict function of NULL constants
-- without checking EXECUTE (the no-membership security test calls every function so).
CREATE OR REPLACE FUNCTION aidb_memory.actor_lexemes(actor_key bigint, lexemes pg_catalog.tsvector)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    RETURN (SELECT array_agg((actor_key)::text || ':' || l.lexeme)
            FROM unnest(tsvector_to_array(lexemes)) AS l(lexeme));
END
$$;
COMMENT ON FUNCTION aidb_memory.actor_lexemes(bigint, pg_catalog.tsvector) IS
'Internal: the lexemes of a memory, each as "<actor_key>:<lexeme>": what memory.lexeme_keys '
'holds, which the GIN index memory_lexemes_idx indexes so that search reads one actor''s '
'memories with a word without reading all of the actor''s memories.';

-- A filter's equality on a metadata value, as memory.lexeme_keys holds it (issue 34): for each
-- (path, value) pair, "<actor_key>#<md5 of path=value>", path the dotted keys from the top object,
-- value its JSON text (a number's with its trailing zeros trimmed, as jsonb's = takes 1 for 1.0).
-- search adds the entries of a filter's equalities to the words it asks memory_lexemes_idx for,
-- so that a selective filter reads the memories it selects that hold the words, no others; the
-- filter itself is still tested on every row, so a colliding entry (a key with a dot in it, an
-- md5 collision) costs a row read, never a wrong answer. md5: a GIN key is at most a third of a
-- page, and a metadata string may be 4,000 characters. migrations/0026 defines it first (it fills
-- the column). PL/pgSQL for the reason actor_lexemes is; not STRICT either.
CREATE OR REPLACE FUNCTION aidb_memory.metadata_entries(
    actor_key bigint, paths text[], vals jsonb[])
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    RETURN (SELECT array_agg((actor_key)::text || '#' || md5(u.path || '=' || CASE
                WHEN jsonb_typeof(u.value) = 'number' THEN trim_scale((u.value)::numeric)::text
                ELSE (u.value)::text END))
            FROM unnest(paths, vals) AS u(path, value));
END
$$;
COMMENT ON FUNCTION aidb_memory.metadata_entries(bigint, text[], jsonb[]) IS
'Internal: metadata values keyed by the actor and their path, "<actor_key>#<md5 of path=value>": '
'what memory.lexeme_keys holds besides the lexemes (aidb_memory.actor_metadata), and what a '
'search filter''s equalities ask memory_lexemes_idx for.';

-- Every scalar value of a memory's metadata reached through objects alone (a filter's dotted
-- path; arrays are not walked, as a path into one may count from its end), as metadata_entries.
CREATE OR REPLACE FUNCTION aidb_memory.actor_metadata(actor_key bigint, metadata jsonb)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    paths text[];
    vals jsonb[];
BEGIN
    IF jsonb_typeof(metadata) IS DISTINCT FROM 'object' OR metadata = '{}' THEN
        RETURN '{}';
    END IF;
    WITH RECURSIVE leaf(path, value) AS (
        SELECT e.key, e.value FROM jsonb_each(metadata) AS e
        UNION ALL
        SELECT l.path || '.' || e.key, e.value
        FROM leaf l
        CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(l.value) = 'object' THEN l.value
                                          ELSE '{}'::jsonb END) AS e
    )
    SELECT array_agg(l.path), array_agg(l.value) INTO paths, vals
    FROM leaf l WHERE jsonb_typeof(l.value) NOT IN ('object', 'array');
    RETURN coalesce(aidb_memory.metadata_entries(actor_key, paths, vals), '{}');
END
$$;
COMMENT ON FUNCTION aidb_memory.actor_metadata(bigint, jsonb) IS
'Internal: the scalar values of a memory''s metadata (reached through objects) as '
'aidb_memory.metadata_entries keys them: what memory.lexeme_keys holds besides the lexemes, so '
'that a search filter''s equalities are answered by memory_lexemes_idx.';

-- memory.lexeme_keys follows memory.lexemes and memory.metadata (and the key), before the row is
-- written.
CREATE OR REPLACE FUNCTION aidb_memory.memory_lexeme_keys()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    NEW.lexeme_keys := coalesce(aidb_memory.actor_lexemes(NEW.actor_key, NEW.lexemes), '{}');
    IF NEW.metadata <> '{}'::jsonb THEN
        NEW.lexeme_keys := NEW.lexeme_keys || aidb_memory.actor_metadata(NEW.actor_key, NEW.metadata);
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION aidb_memory.memory_lexeme_keys() IS
'Trigger (internal): writes memory.lexeme_keys, the lexemes of the memory keyed by its actor '
'(aidb_memory.actor_lexemes) and its metadata values (aidb_memory.actor_metadata), which the GIN '
'index memory_lexemes_idx holds for search and its filters.';

-- The vocabulary of memory_word follows the memories, by triggers.
CREATE OR REPLACE FUNCTION aidb_memory.memory_words_added()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.tsv = NEW.tsv THEN
        RETURN NULL;
    END IF;
    INSERT INTO aidb_memory.memory_word (actor_key, namespace_id, actor_id, word)
    SELECT NEW.actor_key, NEW.namespace_id, NEW.actor_id, w.word
    FROM unnest(tsvector_to_array(NEW.tsv)) AS w(word)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.memory_words_added() IS
'Trigger (internal): adds the words of a new or changed memory to its actor''s vocabulary '
'(memory_word).';

CREATE OR REPLACE FUNCTION aidb_memory.memory_words_removed()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    -- A word goes with the last memory of its actor that uses it: erasure leaves no word behind.
    -- An actor whose namespace is gone (namespace_drop) lost its words with it (their foreign
    -- key cascades). After the deleting statement: the memories it deleted are gone by then.
    IF NOT EXISTS (SELECT 1 FROM aidb_memory.namespace AS n WHERE n.id = OLD.namespace_id) THEN
        RETURN NULL;
    END IF;
    -- A memory changed in place (update_memory, a put on its key) keeps the words it still has.
    IF TG_OP = 'UPDATE' AND OLD.tsv = NEW.tsv THEN
        RETURN NULL;
    END IF;
    DELETE FROM aidb_memory.memory_word AS v
    WHERE v.actor_key = OLD.actor_key AND v.namespace_id = OLD.namespace_id
      AND v.actor_id = OLD.actor_id AND v.word = ANY (tsvector_to_array(OLD.tsv))
      AND NOT EXISTS (SELECT 1 FROM aidb_memory.memory AS m
                      WHERE m.actor_key = OLD.actor_key AND m.namespace_id = OLD.namespace_id
                        AND m.actor_id = OLD.actor_id
                        AND m.tsv @@ to_tsquery('simple', quote_literal(v.word)));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.memory_words_removed() IS
'Trigger (internal): removes from memory_word the words of a deleted or changed memory that no '
'memory of the actor uses any more.';

-- BM25's statistics (memory_lexeme) follow the actor's current memories, by a row trigger: a
-- memory counts while it is current (valid_to NULL), for each of its lexemes and once for the
-- actor (lexeme ''). Rows are touched in lexeme order, so two statements never wait on each
-- other in opposite orders.
CREATE OR REPLACE FUNCTION aidb_memory.memory_lexemes_counted()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    was boolean := TG_OP <> 'INSERT' AND OLD.valid_to IS NULL;
    is_now boolean := TG_OP <> 'DELETE' AND NEW.valid_to IS NULL;
BEGIN
    IF TG_OP = 'UPDATE' AND was = is_now AND OLD.lexemes = NEW.lexemes THEN
        RETURN NULL;
    END IF;
    -- An actor whose namespace is gone (namespace_drop) lost its counts with it.
    IF was AND EXISTS (SELECT 1 FROM aidb_memory.namespace AS n WHERE n.id = OLD.namespace_id) THEN
        -- The last memory with a lexeme takes its row along; then the others count one less.
        DELETE FROM aidb_memory.memory_lexeme AS c
        WHERE c.actor_key = OLD.actor_key AND c.namespace_id = OLD.namespace_id
          AND c.actor_id = OLD.actor_id AND c.memories = 1
          AND c.lexeme = ANY (array_append(tsvector_to_array(OLD.lexemes), ''));
        UPDATE aidb_memory.memory_lexeme AS c SET memories = c.memories - 1
        WHERE c.actor_key = OLD.actor_key AND c.namespace_id = OLD.namespace_id
          AND c.actor_id = OLD.actor_id
          AND c.lexeme = ANY (array_append(tsvector_to_array(OLD.lexemes), ''));
    END IF;
    IF is_now THEN
        INSERT INTO aidb_memory.memory_lexeme AS c
            (actor_key, namespace_id, actor_id, lexeme, memories)
        SELECT NEW.actor_key, NEW.namespace_id, NEW.actor_id, l.lexeme, 1
        FROM unnest(array_append(tsvector_to_array(NEW.lexemes), '')) AS l(lexeme)
        ORDER BY l.lexeme
        ON CONFLICT (actor_key, namespace_id, actor_id, lexeme)
        DO UPDATE SET memories = c.memories + 1;
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.memory_lexemes_counted() IS
'Trigger (internal): keeps memory_lexeme (how many of the actor''s current memories hold each '
'lexeme, and how many it has) in step with the memory written, closed, re-indexed or erased.';

-- Row triggers, each on its own row's actor (by its key): a distributed PostgreSQL (Citus) runs
-- a trigger on the shard of its row, where only that actor's rows are at hand
-- (docs/scaling.md). AFTER ROW triggers fire once the statement is done: a bulk erasure checks
-- each word against what is left.
CREATE OR REPLACE TRIGGER memory_words_added AFTER INSERT OR UPDATE OF content
    ON aidb_memory.memory
    FOR EACH ROW EXECUTE FUNCTION aidb_memory.memory_words_added();
CREATE OR REPLACE TRIGGER memory_words_removed AFTER DELETE OR UPDATE OF content
    ON aidb_memory.memory
    FOR EACH ROW EXECUTE FUNCTION aidb_memory.memory_words_removed();
CREATE OR REPLACE TRIGGER memory_lexemes_counted
    AFTER INSERT OR UPDATE OF valid_to, lexemes OR DELETE ON aidb_memory.memory
    FOR EACH ROW EXECUTE FUNCTION aidb_memory.memory_lexemes_counted();
CREATE OR REPLACE TRIGGER memory_lexeme_keys
    BEFORE INSERT OR UPDATE OF actor_key, lexemes, metadata ON aidb_memory.memory
    FOR EACH ROW EXECUTE FUNCTION aidb_memory.memory_lexeme_keys();
