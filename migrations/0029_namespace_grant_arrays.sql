-- The fast paths check a namespace's grants in their statement (issue 35) on copies of its
-- grants' role OIDs and names, in role OID order, in the namespace row they read anyway:
-- namespace_grant and namespace_revoke keep them with `restricted`. A subquery on
-- namespace_grant cost every call its executor set-up, in open namespaces too (~8 us of a
-- session_get's ~300 of backend CPU).
ALTER TABLE aidb_memory.namespace
    ADD COLUMN grant_role_ids oid[] NOT NULL DEFAULT '{}',
    ADD COLUMN grant_role_names name[] NOT NULL DEFAULT '{}';

-- One UPDATE per namespace with grants, of values read first: on Citus both are reference
-- tables, and an UPDATE of one with a subquery is not planned.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT x.namespace_id, array_agg(x.role_id ORDER BY x.role_id) AS ids,
               array_agg(x.role_name ORDER BY x.role_id) AS names
        FROM aidb_memory.namespace_grant AS x
        GROUP BY x.namespace_id
    LOOP
        UPDATE aidb_memory.namespace
        SET grant_role_ids = g.ids, grant_role_names = g.names
        WHERE id = g.namespace_id;
    END LOOP;
END
$$;
