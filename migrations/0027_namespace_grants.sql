-- Namespaces that belong to their roles (issue 35). A namespace with no grant is open to every
-- member of aidb_users, as before; one with at least one grant is usable only by the granted roles
-- and those that have their privileges (pg_has_role USAGE: membership, INHERIT honoured), and by
-- admins and workers. `restricted` says whether any grant exists, kept by namespace_grant and
-- namespace_revoke in the transaction that changes the grants, so that a call on an open
-- namespace (every namespace of an existing install) reads no grant at all.
ALTER TABLE aidb_memory.namespace ADD COLUMN restricted boolean NOT NULL DEFAULT false;

-- A grant names its role by OID and by the name it had: a grant holds only while both still
-- match (pg_roles), so a dropped role's OID reused by a new role, or a restore into a cluster
-- whose roles have other OIDs, grants nothing (an admin grants again). On Citus a reference table
-- (install/citus.py): every node reads the grants.
CREATE TABLE aidb_memory.namespace_grant (
    namespace_id bigint NOT NULL REFERENCES aidb_memory.namespace (id) ON DELETE CASCADE,
    role_id      oid NOT NULL,
    role_name    name NOT NULL,
    granted_by   name NOT NULL,
    granted_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace_id, role_id)
);

-- The namespaces view gains granted_roles (sql/20_namespaces.sql): its function's result type
-- changes, which CREATE OR REPLACE cannot do.
DROP VIEW IF EXISTS aidb_memory.namespaces;
DROP FUNCTION IF EXISTS aidb_memory.namespaces_rows();
