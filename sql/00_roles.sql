-- The three roles of SPEC §6. Created when absent, never dropped by an upgrade. Roles are
-- cluster-wide, so another database's install may create them at the same moment: a duplicate
-- is not an error.
DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['aidb_users', 'aidb_admins', 'aidb_workers'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$roles$;

-- An admin can do whatever an application can.
GRANT aidb_users TO aidb_admins;
