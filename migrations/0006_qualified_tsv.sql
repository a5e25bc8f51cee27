-- memory.tsv was generated with to_tsvector('simple', content), resolved when 0005 ran: an
-- unknown-typed 'simple' matches text better than regconfig, so a public.to_tsvector(text, text)
-- that anyone could create before the install (PostgreSQL <= 14, or the database's owner on 15)
-- was bound into the column for good, even under the default search_path, and then ran as the
-- owner of our SECURITY DEFINER functions on every insert. PostgreSQL 15 cannot change a
-- generation expression: the column (and the index on it) are dropped and added again,
-- qualified and with the configuration as a regconfig, so nothing is left to resolve.
--
-- The other expressions of 0001-0005 (CHECKs, DEFAULT now() and gen_random_uuid(), the partial
-- index on event.status) match pg_catalog's functions and operators exactly, and pg_catalog is
-- searched first unless a search_path names it later: only an install run under such a
-- search_path could have bound them elsewhere, and that install ran the other role's code as a
-- superuser already (and now pins its search_path). The check at the end refuses to carry on
-- from such a database.
ALTER TABLE aidb_memory.memory DROP COLUMN tsv;
ALTER TABLE aidb_memory.memory
    ADD COLUMN tsv pg_catalog.tsvector GENERATED ALWAYS AS
        (pg_catalog.to_tsvector('pg_catalog.simple'::pg_catalog.regconfig, content)) STORED;
CREATE INDEX memory_tsv_idx ON aidb_memory.memory USING gin (namespace_id, actor_id, tsv)
    WHERE valid_to IS NULL;

-- Whatever of ours that migrations made (tables, columns, defaults, constraints, indexes,
-- triggers) still uses a function, operator or type of another schema. Views and functions are
-- not looked at: the sql/ step that follows re-creates them under the pinned search_path. The
-- install script pins it for this statement too, so the names here are pg_catalog's.
DO $$
DECLARE
    bound text;
BEGIN
    SELECT string_agg(pg_describe_object(d.classid, d.objid, d.objsubid) || ' uses '
                      || pg_describe_object(d.refclassid, d.refobjid, 0), '; ')
      INTO bound
    FROM pg_depend AS d
    JOIN (SELECT 'pg_proc'::regclass AS class, oid, pronamespace AS ns FROM pg_proc
          UNION ALL SELECT 'pg_operator'::regclass, oid, oprnamespace FROM pg_operator
          UNION ALL SELECT 'pg_type'::regclass, oid, typnamespace FROM pg_type) AS used
      ON used.class = d.refclassid AND used.oid = d.refobjid
    WHERE used.ns <> ALL (ARRAY['pg_catalog'::regnamespace, 'aidb_memory'::regnamespace])
      AND 'aidb_memory'::regnamespace = CASE d.classid
          WHEN 'pg_class'::regclass THEN (SELECT relnamespace FROM pg_class WHERE oid = d.objid)
          WHEN 'pg_attrdef'::regclass THEN
              (SELECT c.relnamespace FROM pg_attrdef AS a JOIN pg_class AS c ON c.oid = a.adrelid
               WHERE a.oid = d.objid)
          WHEN 'pg_constraint'::regclass THEN
              (SELECT connamespace FROM pg_constraint WHERE oid = d.objid)
          WHEN 'pg_trigger'::regclass THEN
              (SELECT c.relnamespace FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
               WHERE t.oid = d.objid)
      END;
    IF bound IS NOT NULL THEN
        RAISE EXCEPTION 'aidb_memory: objects of schema aidb_memory use functions, operators or '
            'types of another schema: %', bound
            USING ERRCODE = '42501',
                  HINT = 'an earlier install resolved names through a search_path that put '
                         'another role''s objects first, and may have run them as a superuser: '
                         'treat this database as compromised and install into a new one';
    END IF;
END
$$;
