-- get_memory's common case without Python (issue 34, bench row (m)): one memory by its id or its
-- key, read with its namespace checked as the Python code checks it. The wrapper of
-- aidb_memory.get_memory runs this block first (codebundle.FAST_SUFFIX) and the PL/Python body
-- (addressed.get_memory) only when it falls through, which it does for anything but a memory
-- found that nothing superseded: no such memory (the Python code answers no row), a superseded
-- one (it reads what superseded it), no such namespace, an actor or key that
-- is too long, an actor that is not the bound one, both or neither of id and key, refresh_ttl (a
-- write). The Python code then decides and refuses with its errors. For a memory it finds it
-- returns the row the Python code would (tests/db/test_get_memory_fast.py holds the two equal).
--
-- Why: a PL/Python call with its conversions and its statements' subtransactions costs ~3.5x a
-- plain primary-key select of the row (bench (m)); one cached PL/pgSQL statement with a generic
-- plan (plan_cache_mode, pinned on get_memory) costs little more than the select.
CREATE OR REPLACE FUNCTION aidb_memory.get_memory_fast(
    namespace text,
    actor_id text,
    id uuid DEFAULT NULL,
    key text DEFAULT NULL,
    refresh_ttl boolean DEFAULT false
)
RETURNS SETOF aidb_memory.list_memories_result
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
BEGIN
    -- The wrapper of get_memory runs this block as it is (codebundle.FAST_SUFFIX): it returns the
    -- memory's row when it found one, and falls through, having read nothing else, otherwise.
    DECLARE
        _key bigint;
        -- A namespace with grants: the statement takes it only through a grant to _role, a role
        -- whose privileges the caller has (as in add_fast, sql/31_add_fast.sql).
        _hint text := current_setting('aidb_memory.granted_role', true);
        _role oid;
        _role_name name;
        _found oid;
    BEGIN
        IF $1 IS NOT NULL AND $2 IS NOT NULL AND ($3 IS NULL) <> ($4 IS NULL)
           AND NOT coalesce($5, false) THEN
            -- aidb_memory.actor_key($1, $2), written out (as add_fast: a SQL function called from
            -- PL/pgSQL is planned again in every transaction); a parameter of the statement, so
            -- that Citus routes it to the actor's shard.
            _key := ('x' || encode(substr(sha256(convert_to($1 || ':' || $2, 'UTF8')), 1, 8),
                                   'hex'))::bit(64)::bigint;
            -- _role, _role_name: the hint, if the caller has its privileges (sql/31_add_fast.sql)
            @granted_role_hint@
            LOOP
                -- One statement: the namespace and the memory together, the namespace's checks
                -- in its conditions (a row found was written under the identifier rules: its
                -- actor and key are valid, unless config.max_identifier_chars was lowered since,
                -- which is tested). listing.MEMORY_ROW's columns for a memory that nothing
                -- superseded (the id of what superseded one is read by the Python code: a join
                -- costs the common case ~10%); addressed._BY_ID and _BY_KEY's conditions (which
                -- say why the namespace and actor are no index keys of the probe by id).
                IF $3 IS NOT NULL THEN
                    RETURN QUERY
                    SELECT m.public_id, m.content, m.agent_id, m.session_id, m.valid_from,
                           m.valid_to, NULL::uuid, m.created_at, m.updated_at, m.metadata, m.key,
                           m.expires_at
                    FROM aidb_memory.namespace AS n
                    JOIN aidb_memory.memory AS m
                        ON m.actor_key = _key AND m.public_id = $3
                       AND m.namespace_id + 0 = n.id AND m.actor_id || '' = $2
                    WHERE n.name = $1
                      -- (the grants' copies in the namespace row: a subquery on namespace_grant would
                      -- cost every call, of open namespaces too, its executor set-up)
                      AND (NOT n.restricted
                           OR n.grant_role_names[array_position(n.grant_role_ids, _role)] = _role_name)
                      AND length($2) <= coalesce((n.config->>'max_identifier_chars')::int, 255)
                      AND (coalesce(n.config->>'actor_binding', 'none') <> 'session_user'
                           OR $2 = session_user)
                      AND m.superseded_by IS NULL
                      AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp());
                ELSE
                    RETURN QUERY
                    SELECT m.public_id, m.content, m.agent_id, m.session_id, m.valid_from,
                           m.valid_to, NULL::uuid, m.created_at, m.updated_at, m.metadata, m.key,
                           m.expires_at
                    FROM aidb_memory.namespace AS n
                    JOIN aidb_memory.memory AS m
                        ON m.actor_key = _key AND m.namespace_id = n.id AND m.actor_id = $2
                       AND m.key = $4 AND m.valid_to IS NULL
                    WHERE n.name = $1
                      -- (the grants' copies in the namespace row: a subquery on namespace_grant would
                      -- cost every call, of open namespaces too, its executor set-up)
                      AND (NOT n.restricted
                           OR n.grant_role_names[array_position(n.grant_role_ids, _role)] = _role_name)
                      AND greatest(length($2), length($4))
                          <= coalesce((n.config->>'max_identifier_chars')::int, 255)
                      AND (coalesce(n.config->>'actor_binding', 'none') <> 'session_user'
                           OR $2 = session_user)
                      AND m.superseded_by IS NULL
                      AND (m.expires_at IS NULL OR m.expires_at > statement_timestamp());
                END IF;
                IF FOUND THEN
                    RETURN;
                END IF;
                -- Nothing found: in a namespace with grants, the role that lets the caller in,
                -- unless the statement already tried it (then the Python code answers;
                -- sql/31_add_fast.sql).
                @granted_role_retry@
            END LOOP;
        END IF;
    END;
    RETURN;
END
$$;
COMMENT ON FUNCTION aidb_memory.get_memory_fast(text, text, uuid, text, boolean) IS
'Internal: aidb_memory.get_memory of one memory by its id or key without Python; no rows when '
'it finds none (or does not take the call), which the PL/Python body then answers.';
