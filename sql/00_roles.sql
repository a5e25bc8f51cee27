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

-- An admin can do whatever an application can. Guarded like the roles: another database's
-- first install may grant it at the same moment.
DO $grant$
BEGIN
    IF NOT pg_catalog.pg_has_role('aidb_admins', 'aidb_users', 'MEMBER') THEN
        BEGIN
            GRANT aidb_users TO aidb_admins;
        EXCEPTION WHEN unique_violation OR duplicate_object THEN
            NULL;
        END;
    END IF;
END
$grant$;
