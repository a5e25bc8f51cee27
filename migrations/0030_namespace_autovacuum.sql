-- Every call of every actor reads its namespace's row, and a version of it that an admin's
-- change left behind (namespace_update, namespace_grant, namespace_revoke) is visited by those
-- reads until a vacuum removes it; autovacuum's default thresholds (50 dead rows and 20% of the
-- table) leave a table of a few rows alone for months. Vacuumed after any change instead, within
-- a minute or two (autovacuum_naptime): in a namespace with grants, `add` and `session_get`
-- of its granted role cost 4-6% more backend CPU before its table's vacuum than after
-- (bench/README.md, issue 35). A vacuum of a table of a few rows is a few milliseconds.
ALTER TABLE aidb_memory.namespace
    SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0);
