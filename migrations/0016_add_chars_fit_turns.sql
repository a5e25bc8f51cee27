-- max_add_chars (the JSON text of one add, issue 9) came after max_turn_chars: a namespace that
-- had raised max_turn_chars past what the default max_add_chars (1,000,000) carries would start
-- refusing adds of turns it accepts. Such a namespace, when it has not set max_add_chars itself,
-- gets twice its max_turn_chars (room for the JSON around one turn and its escapes), within
-- max_add_chars' range (at most 100,000,000). A namespace that set max_add_chars keeps it.
-- One UPDATE per namespace with the new config as a value, not an expression over the row (a
-- distributed PostgreSQL refuses non-immutable functions of a column in an UPDATE).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT n.id, n.config OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(
                   'max_add_chars',
                   LEAST(100000000,
                                    2 OPERATOR(pg_catalog.*)
                                    (n.config OPERATOR(pg_catalog.->>) 'max_turn_chars')::bigint))
                   AS config
        FROM aidb_memory.namespace AS n
        WHERE NOT n.config OPERATOR(pg_catalog.?) 'max_add_chars'
          AND pg_catalog.jsonb_typeof(n.config OPERATOR(pg_catalog.->) 'max_turn_chars')
              OPERATOR(pg_catalog.=) 'number'
          AND 2 OPERATOR(pg_catalog.*) (n.config OPERATOR(pg_catalog.->>) 'max_turn_chars')::bigint
              OPERATOR(pg_catalog.>) 1000000
        ORDER BY n.id
    LOOP
        UPDATE aidb_memory.namespace SET config = r.config WHERE id OPERATOR(pg_catalog.=) r.id;
    END LOOP;
END
$$;
