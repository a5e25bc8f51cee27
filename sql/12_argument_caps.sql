-- Size caps on text and jsonb arguments, checked before a value reaches PL/Python (issue 23).
-- PL/Python receives a jsonb argument as its JSON text and then as a Python string: two copies of
-- the value, each as large as the value, made before the first line of our Python runs. So the
-- PL/pgSQL wrapper of every granted PL/Python function (src/aidb_memory/install/codebundle.py) measures
-- each text or jsonb argument larger than 64 kB (pg_column_size: the datum's own size, nothing
-- copied) and calls aidb_memory.refuse_oversized, which refuses what is over the argument's cap
-- with the error the Python code gives for it. A smaller value is converted and checked by the
-- same rule in Python (converting it costs nothing worth avoiding).

-- The cap of one argument: the limit, where it comes from (a namespace config key or a constant),
-- and the error's wording. NULL cap: the argument has no size cap. The defaults are
-- validation.CONFIG_DEFAULTS' and the constants the Python modules' (tests/db/test_argument_caps.py
-- holds them equal).
CREATE OR REPLACE FUNCTION aidb_memory.argument_cap(
    fn text,
    field text,
    namespace text,
    OUT cap bigint,
    OUT kind text,
    OUT hint text
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    key text;
    default_cap bigint;
    configured text;
    restricted boolean;
BEGIN
    -- kind: 'json' (n characters of JSON, more than the namespace limit), 'json_fixed' (... the
    -- limit), 'query' (n characters, more than the namespace limit), 'longer' (is longer than),
    -- 'namespace' (does not exist: 42704).
    IF fn = 'add' AND field = 'turns' THEN
        key := 'max_add_chars'; default_cap := 1000000; kind := 'json';
        hint := 'split the batch, or raise config.max_add_chars with namespace_update';
    ELSIF fn = 'add' AND field = 'memory_metadata' THEN
        key := 'memory_metadata_max_chars'; default_cap := 4000; kind := 'json';
        hint := 'keep the memory''s tags small, or an admin raises config.memory_metadata_max_chars';
    ELSIF fn IN ('search', 'list_memories') AND field = 'filter' THEN
        key := 'memory_filter_max_chars'; default_cap := 4000; kind := 'json';
        hint := 'filter on fewer fields and values, or an admin raises '
                'config.memory_filter_max_chars';
    ELSIF fn = 'delete' AND field = 'selector' THEN
        cap := 500000; kind := 'json_fixed';  -- memories.SELECTOR_MAX_CHARS
    ELSIF fn = 'search' AND field = 'query' THEN
        key := 'search_max_query_chars'; default_cap := 4000; kind := 'query';
        hint := 'shorten the query, or an admin raises config.search_max_query_chars';
    ELSIF fn IN ('remember', 'update_memory') AND field = 'content' THEN
        key := 'memory_max_chars'; default_cap := 1000; kind := 'longer';
        hint := 'split it into facts, or an admin raises config.memory_max_chars';
    ELSIF fn IN ('remember', 'update_memory') AND field = 'metadata' THEN
        key := 'memory_metadata_max_chars'; default_cap := 4000; kind := 'json';
        hint := 'keep the memory''s tags small, or an admin raises config.memory_metadata_max_chars';
    ELSIF fn = 'session_end' AND field = 'notes' THEN
        key := 'max_turn_chars'; default_cap := 100000; kind := 'longer';
    ELSIF fn = 'update_memory' AND field = 'reason' THEN
        key := 'max_turn_chars'; default_cap := 100000; kind := 'longer';
    ELSIF field IN ('actor_id', 'session_id', 'agent_id', 'idempotency_key', 'key')
          AND namespace IS NOT NULL THEN
        key := 'max_identifier_chars'; default_cap := 255; kind := 'longer';
    ELSIF field = 'namespace' THEN
        -- No namespace has a longer name (NAMESPACE_NAME_MAX): the Python code's "does not exist".
        cap := 128; kind := 'namespace'; hint := 'an admin creates it with aidb_memory.init';
    ELSIF field = 'name' AND fn IN ('init', 'namespace_update', 'namespace_drop', 'create_model',
                                    'drop_model', 'set_secret', 'drop_secret', 'model_check') THEN
        cap := 128; kind := 'longer';  -- validation.NAMESPACE_NAME_MAX, models.NAME_MAX
    ELSIF fn = 'set_secret' AND field = 'value' THEN
        cap := 16384; kind := 'longer';  -- models.SECRET_VALUE_MAX
    ELSE
        RETURN;
    END IF;
    IF key IS NOT NULL THEN
        -- An unknown namespace has the defaults: the refusal does not wait for the lookup that
        -- would report it.
        SELECT n.config OPERATOR(pg_catalog.->>) key, n.restricted
        INTO configured, restricted
        FROM aidb_memory.namespace AS n WHERE n.name OPERATOR(pg_catalog.=) namespace;
        IF restricted AND NOT aidb_memory.namespace_allows(namespace) THEN
            configured := NULL;  -- a caller the namespace refuses learns nothing of its config
        END IF;
        cap := coalesce(configured::bigint, default_cap);
    END IF;
END
$$;
COMMENT ON FUNCTION aidb_memory.argument_cap(text, text, text) IS
'Internal: the size cap of argument field of aidb_memory.fn (from the namespace''s config or a '
'constant), the wording of its error and its hint; NULL cap when the argument has none.';

-- A jsonb argument: its JSON text is never made when it is too long. Over 5 bytes of jsonb per
-- character of its JSON text does not occur (deeply nested empty arrays reach 4: 8 bytes per
-- "[]"), and its widest numbers' text is counted alone: a value of more than 5 * cap + 64 bytes,
-- or whose wide numbers alone are over the cap, is refused as "at least" that many characters; a
-- smaller one is measured exactly, which costs at most a text of about 6 times the cap.
CREATE OR REPLACE FUNCTION aidb_memory.refuse_oversized(
    fn text, field text, namespace text, value jsonb
)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    c record;
    bytes bigint := pg_catalog.pg_column_size(value);
    wide bigint;
    chars bigint;
    counted text := '';
BEGIN
    SELECT * INTO c FROM aidb_memory.argument_cap(fn, field, namespace);
    IF c.cap IS NULL OR bytes IS NULL THEN
        RETURN;
    END IF;
    chars := (bytes OPERATOR(pg_catalog.-) 64) OPERATOR(pg_catalog./) 5;
    IF chars OPERATOR(pg_catalog.<=) c.cap THEN
        -- The JSON text of its widest numbers (codebundle.WIDE_NUMBER_PATH, the same path): a
        -- few bytes of jsonb each, up to 131,072 characters of text. Walked only in a value of
        -- at most 5 * cap + 64 bytes: a walk of the whole value costs memory in proportion.
        SELECT pg_catalog.sum(pg_catalog.length(x::text)) INTO wide
        FROM pg_catalog.jsonb_path_query(value,
            'strict $.** ? (@.type() == "number" && (@ >= 1e100 || @ <= -1e100 || (@ != 0 && @ > -1e-98 && @ < 1e-98)))'
        ) AS x;
        chars := GREATEST(chars, coalesce(wide, 0));
    END IF;
    IF chars OPERATOR(pg_catalog.>) c.cap THEN
        counted := 'at least ';
    ELSE
        chars := pg_catalog.length(value::text);
        IF chars OPERATOR(pg_catalog.<=) c.cap THEN
            RETURN;
        END IF;
    END IF;
    -- An empty HINT is none: the callers raise again only a hint that is not empty.
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', HINT = coalesce(c.hint, ''),
        MESSAGE = pg_catalog.format(
            'aidb_memory.%s: %s has %s%s characters of JSON, more than %s of %s',
            fn, field, counted, chars,
            CASE WHEN c.kind = 'json' THEN 'the namespace limit' ELSE 'the limit' END, c.cap);
END
$$;
COMMENT ON FUNCTION aidb_memory.refuse_oversized(text, text, text, jsonb) IS
'Internal: refuses (22023, as the Python code would) a jsonb argument over its cap '
'(aidb_memory.argument_cap) without making its JSON text; called by the wrappers of the '
'PL/Python functions for a value over 64 kB (docs/architecture.md, Errors).';

-- A text argument: its characters are counted in place.
CREATE OR REPLACE FUNCTION aidb_memory.refuse_oversized(
    fn text, field text, namespace text, value text
)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
AS $$
DECLARE
    c record;
    chars bigint := pg_catalog.length(value);
BEGIN
    SELECT * INTO c FROM aidb_memory.argument_cap(fn, field, namespace);
    IF c.cap IS NULL OR chars IS NULL OR chars OPERATOR(pg_catalog.<=) c.cap THEN
        RETURN;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = CASE WHEN c.kind = 'namespace' THEN 'undefined_object'
                       ELSE 'invalid_parameter_value' END,
        HINT = coalesce(c.hint, ''),  -- none when empty: the callers raise again only a hint
        MESSAGE = CASE c.kind
            -- Quoted and cut as access.quote does.
            WHEN 'namespace' THEN pg_catalog.format(
                'aidb_memory.%s: namespace %s does not exist', fn,
                pg_catalog.to_jsonb(pg_catalog.left(value, 199) OPERATOR(pg_catalog.||) '…')::text)
            WHEN 'query' THEN pg_catalog.format(
                'aidb_memory.%s: %s has %s characters, more than the namespace limit of %s',
                fn, field, chars, c.cap)
            ELSE pg_catalog.format('aidb_memory.%s: %s is longer than %s characters',
                                   fn, field, c.cap)
        END;
END
$$;
COMMENT ON FUNCTION aidb_memory.refuse_oversized(text, text, text, text) IS
'Internal: refuses a text argument over its cap (aidb_memory.argument_cap) as the Python code '
'would: 22023, or 42704 for a namespace name longer than any namespace''s; called by the wrappers of the PL/Python functions for a value over '
'64 kB (docs/architecture.md, Errors).';
