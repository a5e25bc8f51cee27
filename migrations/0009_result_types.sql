-- Result types of the set-returning functions whose arguments and result columns share names
-- (session_id, agent_id, name...). Every function a role may call is installed behind a PL/pgSQL
-- wrapper that raises its errors again without PL/Python's traceback (issue 10, item 10), and
-- PL/pgSQL refuses an argument and an output column of one name; with a named row type instead
-- of RETURNS TABLE the columns stay as they were. The functions are dropped here because
-- CREATE OR REPLACE cannot change a return type; sql/ creates them again right after, in the
-- same transaction, and grants them again.

DROP FUNCTION IF EXISTS aidb_memory.namespace_update(text, jsonb, jsonb, text);
CREATE TYPE aidb_memory.namespace_update_result AS (
    id bigint,
    name text,
    model_spec jsonb,
    config jsonb,
    state text,
    created_at timestamptz,
    updated_at timestamptz
);

DROP FUNCTION IF EXISTS aidb_memory.session_start(text, text, text, text);
CREATE TYPE aidb_memory.session_start_result AS (
    session_id text,
    started_at timestamptz,
    closed_at timestamptz,
    prev_handoff jsonb
);

DROP FUNCTION IF EXISTS aidb_memory.session_list(text, text, text, boolean, integer);
CREATE TYPE aidb_memory.session_list_result AS (
    session_id text,
    agent_id text,
    started_at timestamptz,
    closed_at timestamptz,
    turn_count bigint,
    total_chars bigint,
    updated_at timestamptz
);

DROP FUNCTION IF EXISTS aidb_memory.search(text, text, text, integer, text, text);
CREATE TYPE aidb_memory.search_result AS (
    id uuid,
    content text,
    score real,
    agent_id text,
    session_id text,
    created_at timestamptz
);

DROP FUNCTION IF EXISTS aidb_memory.list_memories(text, text, text, text, integer, boolean);
CREATE TYPE aidb_memory.list_memories_result AS (
    id uuid,
    content text,
    agent_id text,
    session_id text,
    valid_from timestamptz,
    valid_to timestamptz,
    superseded_by uuid,
    created_at timestamptz,
    updated_at timestamptz
);
