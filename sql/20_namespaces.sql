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

-- Grants (issue 35): who may use a namespace that has any.

-- The role a call is made as: the one SET ROLE chose, else the session's. Inside these SECURITY
-- DEFINER functions current_user is their owner, and PostgreSQL keeps no other trace of the
-- caller; the role setting is the caller's own, which a SECURITY DEFINER function cannot change
-- (SET ROLE is refused in one). So a SECURITY DEFINER function of the application's own does not
-- lend its owner's grants: the role calling it must be granted (docs/operations.md).
-- The grant through which the caller may use a namespace: the SQL fast paths keep it for the
-- next call (the setting aidb_memory.granted_role) and their statement checks that it is still
-- a grant of the namespace they read (sql/31_add_fast.sql).
CREATE OR REPLACE FUNCTION aidb_memory.namespace_role(namespace text)
RETURNS oid
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
    ids oid[];
    names name[];
BEGIN
    -- The grants in a statement (their copies in the namespace row, which namespace_grant and
    -- namespace_revoke keep), the roles in expressions: on Citus the namespaces are a reference
    -- table, which a statement may read on a worker, and the roles are this node's, whose OIDs
    -- the grants hold.
    SELECT n.grant_role_ids, n.grant_role_names INTO ids, names
    FROM aidb_memory.namespace AS n
    WHERE n.name = $1;
    -- A grant holds while its role has the OID and the name it was granted with
    -- (migrations/0027_namespace_grants.sql; pg_get_userbyid names no role for a dropped OID).
    -- USAGE: the privileges of a role the caller is a member of with INHERIT, as PostgreSQL
    -- grants a table's privileges through membership (a superuser has every role's).
    FOR i IN 1 .. coalesce(cardinality(ids), 0) LOOP
        IF pg_get_userbyid(ids[i]) = names[i] AND pg_has_role(caller, ids[i], 'USAGE') THEN
            RETURN ids[i];
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION aidb_memory.namespace_role(text) IS
'Internal: the granted role through which the calling role (SET ROLE''s, else the session''s) '
'may use the namespace (a member of it with its privileges, INHERIT), NULL when no grant lets it '
'in.';

-- By name: the Python code, argument_cap and the namespaces view ask it of a namespace whose
-- restricted flag is set.
DROP FUNCTION IF EXISTS aidb_memory.namespace_allows(bigint);
CREATE OR REPLACE FUNCTION aidb_memory.namespace_allows(namespace text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    caller name := coalesce(nullif(current_setting('role'), 'none'), session_user);
BEGIN
    -- Admins and workers are never refused.
    RETURN aidb_memory.namespace_role($1) IS NOT NULL
           OR pg_has_role(caller, 'aidb_admins', 'USAGE')
           OR pg_has_role(caller, 'aidb_workers', 'USAGE');
END
$$;
COMMENT ON FUNCTION aidb_memory.namespace_allows(text) IS
'Internal: whether the calling role (SET ROLE''s, else the session''s) may use the namespace '
'that has grants: a member of a granted role with its privileges (INHERIT), an admin or a worker. '
'Every application function asks it of a namespace whose restricted flag is set, or checks the '
'grant namespace_role found.';

CREATE OR REPLACE FUNCTION aidb_memory.namespace_grant(namespace text, role text)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ namespaces.namespace_grant $py$;
COMMENT ON FUNCTION aidb_memory.namespace_grant(text, text) IS
'Admin: let role (by its exact name) and the roles that have its privileges use the namespace. '
'From its first grant on, a namespace is refused (42501) to every other application role; '
'admins and workers keep their access. Effective at the next call of every session. True when '
'the grant is new. Errors: 22004 NULL, 42704 unknown namespace or role.';

CREATE OR REPLACE FUNCTION aidb_memory.namespace_revoke(namespace text, role text)
RETURNS boolean
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ namespaces.namespace_revoke $py$;
COMMENT ON FUNCTION aidb_memory.namespace_revoke(text, text) IS
'Admin: take back the grant of role (by the name it was granted under, or its name now). With '
'the last grant gone the namespace is open to every aidb_users member again. True when there '
'was such a grant. Errors: 22004 NULL, 42704 unknown namespace.';

CREATE OR REPLACE FUNCTION aidb_memory.list_actors(
    namespace text,
    prefix text DEFAULT NULL,
    "limit" integer DEFAULT 100,
    after text DEFAULT NULL
)
RETURNS TABLE (actor_id text)
LANGUAGE plpython3u STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $py$ listing.list_actors $py$;
COMMENT ON FUNCTION aidb_memory.list_actors(text, text, integer, text) IS
'The actors of a namespace with grants (those with a session or a current memory), in code-point '
'order: those starting with prefix, after the actor after (the last of the previous page), limit '
'1..1000 a page. For the roles the namespace is granted to (and admins); a namespace without '
'grants is refused (55000): there it would show every tenant''s users to every application. '
'Errors: 22004, 22023 bad limit or argument, 42704, 42501, 55000.';

-- The view reads its rows through a SECURITY DEFINER function: on Citus, a view's query goes to
-- the shards (even of a reference table) as the caller, who has no privilege on them (Citus
-- issues 1683, 6161); the function reads them as its owner, as a view does on one server. Who
-- may read is the same: the roles granted the view get EXECUTE on its function (90_privileges).
-- An application role sees the namespaces it may use; admins see every one and its grants.
CREATE OR REPLACE FUNCTION aidb_memory.namespaces_rows()
RETURNS TABLE (id bigint, name text, model_spec jsonb, config jsonb, state text,
                created_at timestamptz, updated_at timestamptz, granted_roles text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
#variable_conflict use_column
DECLARE
    admin boolean := pg_has_role(coalesce(nullif(current_setting('role'), 'none'), session_user),
                                 'aidb_admins', 'USAGE');
    usable text[] := '{}';
    ns text;
BEGIN
    -- The namespaces with grants the caller may use, each asked in a statement of its own (not
    -- in the query below: on Citus that query runs on a worker, as another role).
    IF NOT admin THEN
        FOR ns IN SELECT n.name FROM aidb_memory.namespace AS n WHERE n.restricted LOOP
            IF aidb_memory.namespace_allows(ns) THEN
                usable := usable || ns;
            END IF;
        END LOOP;
    END IF;
    RETURN QUERY
    SELECT n.id, n.name, n.model_spec, n.config, n.state, n.created_at, n.updated_at,
           CASE WHEN admin
                THEN ARRAY(SELECT g.role_name::text FROM aidb_memory.namespace_grant AS g
                           WHERE g.namespace_id = n.id ORDER BY 1) END
    FROM aidb_memory.namespace AS n
    WHERE admin OR NOT n.restricted OR n.name = ANY (usable)
    ORDER BY n.id;
END
$$;
COMMENT ON FUNCTION aidb_memory.namespaces_rows() IS
'Internal: the rows of the view aidb_memory.namespaces (its owner''s privileges): the namespaces '
'the caller may use, with their grants for admins.';

CREATE OR REPLACE VIEW aidb_memory.namespaces AS
SELECT id, name, model_spec, config, state, created_at, updated_at, granted_roles
FROM aidb_memory.namespaces_rows();
COMMENT ON VIEW aidb_memory.namespaces IS
'The namespaces the caller may use (every one for admins) with their model_spec, config and '
'state (ACTIVE or INACTIVE); granted_roles: the roles granted each (empty: open to every '
'aidb_users member), shown to admins only (NULL for others).';
