-- Functions about the installation itself.
--
-- Every SECURITY DEFINER function of sql/ fixes its search_path (names resolve to pg_catalog and
-- our schema only) and turns the debug_print_* settings off for its own execution: any session
-- may turn them on, and they would print our statements' plans, with other actors' data as
-- constants, to that session. The lint in src/aidb_memory/install/codebundle.py enforces both.

CREATE OR REPLACE FUNCTION aidb_memory.version()
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
    SELECT value FROM aidb_memory.runtime_settings WHERE key = 'version'
$$;
COMMENT ON FUNCTION aidb_memory.version() IS
'The aidb_memory package version installed in this database.';

CREATE OR REPLACE FUNCTION aidb_memory.runtime_info()
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ introspection.runtime_info $py$;
COMMENT ON FUNCTION aidb_memory.runtime_info() IS
'Admin: the code generation loaded in this connection, the server''s Python version and the '
'directory its third-party packages come from. Returns jsonb.';

CREATE OR REPLACE FUNCTION aidb_memory.catalog_fingerprint()
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
    -- What `aidb-memory verify` compares with the value recorded at install: every function's
    -- definition and privileges, every view's definition and every relation's privileges.
    SELECT md5(coalesce(string_agg(item, E'\n' ORDER BY item), ''))
    FROM (
        SELECT 'f ' || pg_get_functiondef(p.oid) || coalesce(p.proacl::text, '')
               || coalesce(obj_description(p.oid, 'pg_proc'), '') AS item
        FROM pg_proc p
        WHERE p.pronamespace = 'aidb_memory'::regnamespace
        UNION ALL
        SELECT 'r ' || c.relname || ' ' || c.relkind::text || coalesce(c.relacl::text, '')
               || coalesce(obj_description(c.oid, 'pg_class'), '')
               || CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) ELSE '' END
        FROM pg_class c
        WHERE c.relnamespace = 'aidb_memory'::regnamespace
          AND c.relkind IN ('r', 'v', 'p', 'S', 'i', 'm')
        UNION ALL
        SELECT 'c ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
               || coalesce(a.attacl::text, '')
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relnamespace = 'aidb_memory'::regnamespace AND c.relkind IN ('r', 'v', 'p')
        UNION ALL
        SELECT 's ' || coalesce(n.nspacl::text, '') || ' ' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
        FROM pg_namespace n
        WHERE n.oid = 'aidb_memory'::regnamespace
    ) items
$$;
COMMENT ON FUNCTION aidb_memory.catalog_fingerprint() IS
'Admin: a checksum of the schema''s functions, tables, columns, views, indexes, privileges and '
'comments, recorded at install and '
'compared by `aidb-memory verify` to detect hand edits (drift).';
