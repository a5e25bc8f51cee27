-- The distribution key of an actor's rows (issue 15, docs/scaling.md): every per-actor table
-- carries actor_key = aidb_memory.actor_key(namespace name, actor id) and every statement of ours
-- on such a table filters or joins on it. The first 8 bytes of SHA-256 of
-- "<namespace name>:<actor id>" as a signed bigint (a namespace's name never changes, and
-- every API call passes it and the actor: every call knows its key before it reads): a standard hash, the same on every
-- architecture and major version; the server code computes the same number
-- (plpython/aidb_memory_server/keys.py; tests/db/test_actor_key.py holds them equal) and passes
-- it to its statements as a parameter. migrations/0015_actor_key.sql, which keyed the rows that
-- existed before, carries a copy of this definition. Not STRICT: the planner replaces a strict
-- function of a NULL constant by NULL without checking EXECUTE on it (NULL gives NULL anyway).
CREATE OR REPLACE FUNCTION aidb_memory.actor_key(namespace text, actor_id text)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
RETURN ('x' OPERATOR(pg_catalog.||) pg_catalog.encode(
            pg_catalog.substr(
                pg_catalog.sha256(pg_catalog.convert_to(
                    namespace OPERATOR(pg_catalog.||) ':'
                    OPERATOR(pg_catalog.||) actor_id, 'UTF8')),
                1, 8),
            'hex'))::bit(64)::bigint;
COMMENT ON FUNCTION aidb_memory.actor_key(text, text) IS
'The distribution key of an actor''s rows: the first 8 bytes of SHA-256 of '
'"<namespace name>:<actor id>" as a signed bigint (docs/scaling.md). Immutable; what every '
'per-actor table''s actor_key holds.';
