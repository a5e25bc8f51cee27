-- Compiled server-side code (issue 13: first calls are fast). Install compiles each module of
-- runtime_modules with the server's own Python (a DO block in plpython3u, boot.store_bytecode)
-- and stores the marshalled code here; a backend's first call then loads that instead of
-- compiling the source. boot.py uses a row only when its magic number is the running Python's
-- and its source_md5 is the md5 of the source stored now, so a new server Python, an upgrade or
-- a hand edit of a module falls back to the source until the next install compiles again.
-- PostgreSQL keeps that md5 next to each source (a generated column: any write of source
-- changes it), so that a first call compares two short strings instead of reading, and
-- decompressing, every module's source to hash it (~1.5 ms of every first call).
ALTER TABLE aidb_memory.runtime_modules
    ADD COLUMN source_md5 text GENERATED ALWAYS AS (pg_catalog.md5(source)) STORED;

-- Like runtime_modules, whose rows the server imports as code, only install writes it: no role
-- other than the owner has any privilege on it (sql/90_privileges.sql revokes every table's from
-- everyone; the trust checks require a superuser owner).
CREATE TABLE aidb_memory.runtime_bytecode (
    name        text PRIMARY KEY,
    -- importlib.util.MAGIC_NUMBER of the Python that compiled it.
    magic       bytea NOT NULL,
    -- sys.version_info of that Python, for people (the magic number is what counts).
    python      text NOT NULL,
    source_md5  text NOT NULL,
    code        bytea NOT NULL,
    compiled_at timestamptz NOT NULL DEFAULT now()
);
-- Stored uncompressed (out of line): a first call then only copies it, ~400 kB in all, where
-- decompressing it cost about 1 ms.
ALTER TABLE aidb_memory.runtime_bytecode ALTER COLUMN code SET STORAGE EXTERNAL;
COMMENT ON TABLE aidb_memory.runtime_bytecode IS
'The marshalled code of each module of runtime_modules, compiled by install with the server''s '
'Python; boot.py loads it when its magic number and source md5 still match (issue 13).';
