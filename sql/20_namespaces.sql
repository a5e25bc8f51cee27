-- Namespaces (SPEC §2): created and changed by admins, listed by everyone.

CREATE OR REPLACE FUNCTION aidb_memory.init(
    name text,
    model_spec jsonb DEFAULT '{}'::jsonb,
    config jsonb DEFAULT '{}'::jsonb
)
RETURNS bigint
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ namespaces.init $py$;
COMMENT ON FUNCTION aidb_memory.init(text, jsonb, jsonb) IS
'Admin: create namespace `name` and return its id. Calling it again with an existing name returns '
'the existing id and changes nothing. model_spec: {"llm": model, "embedding": model}; config: '
'see docs/reference.md. Errors: 22004 NULL name, 22023 bad name, model_spec or config.';

CREATE OR REPLACE FUNCTION aidb_memory.namespace_update(
    name text,
    model_spec jsonb DEFAULT NULL,
    config jsonb DEFAULT NULL,
    state text DEFAULT NULL
)
-- A type rather than RETURNS TABLE: the PL/pgSQL wrapper (codebundle.BODY_SUFFIX) cannot
-- have an argument and a result column of one name; migrations/0009_result_types.sql.
RETURNS SETOF aidb_memory.namespace_update_result
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ namespaces.namespace_update $py$;
COMMENT ON FUNCTION aidb_memory.namespace_update(text, jsonb, jsonb, text) IS
'Admin: change a namespace. model_spec and config are merged into the current values (a key set '
'to null returns to its default); state is ACTIVE or INACTIVE. NULL arguments leave that part '
'unchanged. Returns the updated row. Errors: 42704 unknown namespace, 22023 bad values.';

-- The view reads its rows through a SECURITY DEFINER function: on Citus, a view's query goes to
-- the shards (even of a reference table) as the caller, who has no privilege on them (Citus
-- issues 1683, 6161); the function reads them as its owner, as a view does on one server. Who
-- may read is the same: the roles granted the view get EXECUTE on its function (90_privileges).
CREATE OR REPLACE FUNCTION aidb_memory.namespaces_rows()
RETURNS TABLE (id bigint, name text, model_spec jsonb, config jsonb, state text,
                created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
SELECT id, name, model_spec, config, state, created_at, updated_at
FROM aidb_memory.namespace
$$;
COMMENT ON FUNCTION aidb_memory.namespaces_rows() IS
'Internal: the rows of the view aidb_memory.namespaces (its owner''s privileges).';

CREATE OR REPLACE VIEW aidb_memory.namespaces AS
SELECT id, name, model_spec, config, state, created_at, updated_at
FROM aidb_memory.namespaces_rows();
COMMENT ON VIEW aidb_memory.namespaces IS
'Every namespace with its model_spec, config and state (ACTIVE or INACTIVE).';
