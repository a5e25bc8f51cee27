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

DO $$
DECLARE
    bound text;
BEGIN
    SELECT pg_catalog.string_agg(
               pg_catalog.format('%s uses %s',
                                 pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid),
                                 pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0)),
               '; ')
      INTO bound
      FROM pg_catalog.pg_depend AS d
      JOIN (SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass AS class, p.oid, p.pronamespace AS ns
              FROM pg_catalog.pg_proc AS p
            UNION ALL
            SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid, o.oprnamespace
              FROM pg_catalog.pg_operator AS o
            UNION ALL
            SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid, t.typnamespace
              FROM pg_catalog.pg_type AS t) AS r
        ON r.class OPERATOR(pg_catalog.=) d.refclassid AND r.oid OPERATOR(pg_catalog.=) d.refobjid
     CROSS JOIN LATERAL pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid) AS mine
     WHERE mine.schema OPERATOR(pg_catalog.=) 'aidb_memory'
       AND r.ns OPERATOR(pg_catalog.<>) ALL (ARRAY['pg_catalog'::pg_catalog.regnamespace,
                                                   'aidb_memory'::pg_catalog.regnamespace]);
    IF bound IS NOT NULL THEN
        RAISE EXCEPTION 'aidb_memory: objects of schema aidb_memory use functions, operators or '
            'types of another schema: %', bound
            USING ERRCODE = '42501',
                  HINT = 'an earlier install ran under a search_path that put another role''s '
                         'objects before pg_catalog''s, and ran them as a superuser: treat the '
                         'database as compromised; install into a new database';
    END IF;
END
$$;
