"""The install/upgrade script: one list of steps that ``install`` executes and ``sql`` prints.

Every step is safe to run against any state of the database: migrations are guarded by the
``schema_migrations`` table, the idempotent part by the recorded code checksum, and the whole
script runs in one transaction under an advisory lock. ``install`` and ``psql -f`` of ``sql``
therefore reach the same catalog state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from aidb_memory import __version__
from aidb_memory.install import catalog, trust
from aidb_memory.install.codebundle import BOOT_MODULE, CodeBundle
from aidb_memory.install.migrations import Migration
from aidb_memory.install.steps import SCHEMA, Step, do_block, dollar_quote, literal

# Arbitrary but fixed: every installer of any version takes the same lock.
INSTALL_LOCK_KEY = 7_460_231_986_145_512_113
NOTICE_PREFIX = "aidb_memory: "
# What every statement of ours runs under: nothing that another role can create comes first.
PINNED_SEARCH_PATH = "pg_catalog, pg_temp"


def _notice(message: str, *args: str) -> str:
    placeholders = "".join(f", {a}" for a in args)
    return f"RAISE NOTICE {literal(NOTICE_PREFIX + message)}{placeholders};"


def _executes(statements: Iterable[str]) -> str:
    return "\n".join(f"    EXECUTE {literal(s)};" for s in statements)


def preamble() -> list[Step]:
    """Lock, prerequisites, the schema and the installer's own tables."""
    return [
        # Before anything is resolved: a search_path set by the database's owner (ALTER DATABASE
        # ... SET search_path = public, pg_catalog) would otherwise make this superuser's script
        # call the owner's functions and operators, and bind them into our tables for good. So
        # nothing below needs qualifying. A SET resolves no name and takes no snapshot, so SET
        # TRANSACTION ISOLATION LEVEL may still follow it.
        Step("search path", f"SET LOCAL search_path = {PINNED_SEARCH_PATH}"),
        # Read committed whatever default_transaction_isolation says: an installer that waited
        # for the lock must see what the one before it committed (a snapshot taken before the
        # lock was granted would not, and its install would fail).
        Step("isolation level", "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
        Step("session settings", "SET LOCAL standard_conforming_strings = on"),
        # The progress lines are NOTICEs: a role or database set to hide them would hide them.
        Step("session settings", "SET LOCAL client_min_messages = notice"),
        Step("install lock", f"SELECT pg_catalog.pg_advisory_xact_lock({INSTALL_LOCK_KEY})"),
        Step(
            "superuser check",
            do_block(
                "IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles\n"
                "        WHERE rolname = current_user) THEN\n"
                "    RAISE EXCEPTION 'aidb_memory: installing needs a superuser (plpython3u is "
                "untrusted); % is not one', current_user;\nEND IF;"
            ),
        ),
        Step("schema", f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"),
        Step(
            "installer tables",
            f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_migrations (
    name            text PRIMARY KEY,
    checksum        text NOT NULL,
    package_version text NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT now()
)""",
        ),
        Step(
            "installer tables",
            f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.runtime_modules (
    name       text PRIMARY KEY,
    is_package boolean NOT NULL,
    source     text NOT NULL
)""",
        ),
        Step(
            "installer tables",
            f"""CREATE TABLE IF NOT EXISTS {SCHEMA}.runtime_settings (
    key        text PRIMARY KEY,
    value      text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)""",
        ),
        Step(
            "plpython3u",
            do_block(
                "IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension\n"
                "               WHERE extname = 'plpython3u') THEN\n"
                "    CREATE EXTENSION plpython3u;\n"
                f"    INSERT INTO {SCHEMA}.runtime_settings (key, value) "
                "VALUES ('created_plpython3u', 'true') ON CONFLICT (key) DO NOTHING;\n"
                f"    {_notice('created extension plpython3u')}\n"
                "END IF;"
            ),
        ),
    ]


def migration_steps(migrations: list[Migration]) -> list[Step]:
    """Refuse edited or unknown migrations, then apply the pending ones in order."""
    # Each migration with every checksum it accepts: its own and those it supersedes.
    known = (
        ", ".join(
            f"({literal(m.name)}, ARRAY[{', '.join(literal(c) for c in m.accepted)}])"
            for m in migrations
        )
        or "(NULL, NULL::text[])"
    )
    check = do_block(
        f"""FOR r IN
    SELECT a.name, a.checksum AS applied, k.checksums AS expected
    FROM {SCHEMA}.schema_migrations a
    LEFT JOIN (VALUES {known}) AS k(name, checksums) ON k.name = a.name
    ORDER BY a.name
LOOP
    IF r.expected IS NULL THEN
        RAISE EXCEPTION 'aidb_memory: migration % is applied in this database but unknown to '
            'this package (version {__version__})', r.name
            USING HINT = 'install a newer aidb-memory package; never downgrade';
    ELSIF NOT (r.applied = ANY (r.expected)) THEN
        RAISE EXCEPTION 'aidb_memory: migration %.sql was edited after it was applied', r.name
            USING HINT = 'restore the file as it was applied and add a new migration '
                         'for the change';
    END IF;
END LOOP;""",
        declare="    r record;",
    )
    steps = [Step("migration checksums", check)]
    for m in migrations:
        body = f"""IF EXISTS (SELECT 1 FROM {SCHEMA}.schema_migrations
           WHERE name = {literal(m.name)}) THEN
    {_notice(f"migration {m.name} skipped (already applied)")}
ELSE
{_executes(m.statements)}
{_record(m)}
END IF;"""
        steps.append(Step(f"migrations/{m.name}.sql", do_block(body), migration=m))
    return steps


def _record(m: Migration) -> str:
    return f"""    INSERT INTO {SCHEMA}.schema_migrations (name, checksum, package_version)
    VALUES ({literal(m.name)}, {literal(m.checksum)}, {literal(__version__)});
    {_notice(f"migration {m.name} applied")}"""


def record_migration(m: Migration) -> str:
    """What the migration's step does after its statements: record it as applied (install runs
    this after running a migration's statements one by one)."""
    return do_block(_record(m))


_CODE_FLAG = "current_setting('aidb_memory.install_code', true) = 'on'"

SCHEMA_DRIFT_HINT = (
    "install recreates functions, views, privileges and triggers, but not what migrations "
    "create: recreate a missing index or constraint as migrations/ define it (or restore it "
    "from a backup) and drop objects that are not part of aidb_memory, then run install again; "
    "`aidb-memory verify` lists every difference"
)


def defined(bundle: CodeBundle) -> catalog.Defined:
    """The functions, views and triggers that the bundle's sql/ creates."""
    return catalog.defined_objects(s for f in bundle.sql_files for s in f.statements)


def _keep(values: list[str], sql_type: str) -> str:
    """A NULL-free one-column set of ``values`` (SQL expressions): an expression that resolves
    to nothing (``to_regprocedure`` of a function this version adds, before sql/ made it) is
    left out rather than kept as a NULL, which would match nothing and make every
    ``x <> ALL (...)`` unknown."""
    if not values:
        return f"SELECT NULL::{sql_type} WHERE false"
    rows = ", ".join(f"({v})" for v in values)
    return f"SELECT k FROM (VALUES {rows}) AS keep(k) WHERE k IS NOT NULL"


def extras_query(objects: catalog.Defined) -> str:
    """Rows (kind, name, drop statement) of the triggers, views and functions of the schema that
    ``objects`` (what a package's sql/ creates) do not define: what a fresh install of that
    package would not have. Install drops them (before it applies sql/, when this package's new
    objects do not exist yet) and ``verify`` names them, both with this one query. Kinds and
    names are those of :data:`catalog.QUERY`; drop statements are search_path-independent.
    Extension members, and functions that what migrations made (an index, a default, a
    constraint, a type) uses, are not the code part's: a fresh install has them too."""
    functions = _keep([f"pg_catalog.to_regprocedure({literal(f)})" for f in objects.functions],
                      "pg_catalog.regprocedure")  # fmt: skip
    views = _keep([literal(v) for v in objects.views], "pg_catalog.text")
    triggers = _keep([literal(t) for t in objects.triggers], "pg_catalog.text")
    return f"""SELECT kind, name, statement FROM (
SELECT 1 AS pass, 'trigger' AS kind, t.tgname || ' on {SCHEMA}.' || c.relname AS name,
       pg_catalog.format('DROP TRIGGER %I ON %I.%I', t.tgname, '{SCHEMA}', c.relname) AS statement
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
WHERE c.relnamespace OPERATOR(pg_catalog.=) '{SCHEMA}'::pg_catalog.regnamespace
  AND NOT t.tgisinternal
  AND NOT EXISTS (SELECT 1 FROM ({triggers}) AS k(name)
                  WHERE k.name OPERATOR(pg_catalog.=) (t.tgname || ' on {SCHEMA}.' || c.relname))
UNION ALL
SELECT 2, 'view', '{SCHEMA}.' || c.relname,
       pg_catalog.format('DROP VIEW %I.%I', '{SCHEMA}', c.relname)
FROM pg_catalog.pg_class c
WHERE c.relnamespace OPERATOR(pg_catalog.=) '{SCHEMA}'::pg_catalog.regnamespace
  AND c.relkind OPERATOR(pg_catalog.=) 'v'
  AND NOT EXISTS (SELECT 1 FROM ({views}) AS k(name)
                  WHERE k.name OPERATOR(pg_catalog.=) ('{SCHEMA}.' || c.relname))
UNION ALL
SELECT 3, 'function', p.oid::pg_catalog.regprocedure::pg_catalog.text,
       pg_catalog.format('DROP %s %I.%I(%s)',
                         CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                        ELSE 'FUNCTION' END,
                         '{SCHEMA}', p.proname,
                         pg_catalog.pg_get_function_identity_arguments(p.oid))
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) '{SCHEMA}'::pg_catalog.regnamespace
  AND NOT EXISTS (SELECT 1 FROM ({functions}) AS k(f)
                  WHERE k.f OPERATOR(pg_catalog.=) p.oid)
  -- Used by an index, default, constraint or type: part of what the migrations made.
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                  WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_proc'::pg_catalog.regclass
                    AND d.refobjid OPERATOR(pg_catalog.=) p.oid
                    AND d.classid NOT IN ('pg_proc'::pg_catalog.regclass,
                                          'pg_rewrite'::pg_catalog.regclass,
                                          'pg_trigger'::pg_catalog.regclass))
  AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                  WHERE d.classid OPERATOR(pg_catalog.=) 'pg_proc'::pg_catalog.regclass
                    AND d.objid OPERATOR(pg_catalog.=) p.oid
                    AND d.deptype OPERATOR(pg_catalog.=) 'e')
) AS extras
ORDER BY pass, name COLLATE "C"
"""


def _drop_extras(bundle: CodeBundle) -> str:
    """Before sql/ is applied: drop the triggers, views and functions of the schema that sql/
    does not define (a hand edit, or left by an older version, such as an overload whose
    arguments changed: CREATE OR REPLACE would add the new one beside it), without CASCADE, so
    that if something depends on one, install fails naming it. What sql/ defines is re-created
    right after, so an object dropped here by mistake would only be re-created. Triggers go
    first and functions last: they may use the views and functions, not the other way round."""
    return f"""IF {_CODE_FLAG} THEN
    FOR r IN {extras_query(defined(bundle))}
    LOOP
        EXECUTE r.statement;
        {_notice("dropped % %, which is not part of this package", "r.kind", "r.name")}
    END LOOP;
END IF;"""


# After sql/: triggers disabled by hand (ALTER TABLE ... DISABLE TRIGGER ALL also stops the
# foreign keys' triggers) are enabled again; CREATE OR REPLACE TRIGGER does not do it.
_ENABLE_TRIGGERS = f"""IF {_CODE_FLAG} THEN
    FOR r IN
        SELECT DISTINCT t.tgrelid::regclass::text AS rel
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = '{SCHEMA}'::regnamespace AND t.tgenabled <> 'O'
        ORDER BY 1
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE TRIGGER ALL', r.rel);
        {_notice("enabled the triggers of %", "r.rel")}
    END LOOP;
END IF;"""


def expected_modules(bundle: CodeBundle) -> str:
    """The md5 of :data:`catalog.MODULES_QUERY` over exactly this package's modules."""
    lines = catalog.modules_digest((m.name, m.is_package, m.source) for m in bundle.modules)
    return hashlib.md5(lines.encode(), usedforsecurity=False).hexdigest()


def schema_check_step() -> Step:
    """Before any migration: what migrations made must be as the last install recorded it.

    Install cannot recreate a dropped index or constraint (only a migration creates one, and
    migrations run once), and a migration must not run on a schema it was not written for; so
    the install fails here, naming the objects."""
    recorded = f"SELECT value FROM {SCHEMA}.runtime_settings WHERE key = 'catalog_schema'"
    body = f"""recorded := ({recorded});
IF recorded IS NOT NULL THEN
    current := ({catalog.lines_query(catalog.SCHEMA_PART)});
    IF current IS DISTINCT FROM recorded THEN
        WITH want AS (
            SELECT split_part(l, E'\\t', 1) AS kind, split_part(l, E'\\t', 2) AS name,
                   split_part(l, E'\\t', 3) AS detail
            FROM string_to_table(recorded, E'\\n') AS l WHERE l <> ''
        ), have AS (
            SELECT split_part(l, E'\\t', 1) AS kind, split_part(l, E'\\t', 2) AS name,
                   split_part(l, E'\\t', 3) AS detail
            FROM string_to_table(current, E'\\n') AS l WHERE l <> ''
        )
        SELECT string_agg(what, '; ' ORDER BY what) INTO problems FROM (
            SELECT w.kind || ' ' || w.name || ' is missing' AS what FROM want w
            WHERE NOT EXISTS (SELECT 1 FROM have h WHERE h.kind = w.kind AND h.name = w.name)
            UNION ALL
            SELECT h.kind || ' ' || h.name || ' is not part of aidb_memory' FROM have h
            WHERE NOT EXISTS (SELECT 1 FROM want w WHERE w.kind = h.kind AND w.name = h.name)
            UNION ALL
            SELECT w.kind || ' ' || w.name || ' differs from what migrations created'
            FROM want w JOIN have h ON h.kind = w.kind AND h.name = w.name
            WHERE h.detail <> w.detail
        ) AS d;
        RAISE EXCEPTION 'aidb_memory: install refused: the schema differs from what migrations '
            'created: %', problems
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = {literal(SCHEMA_DRIFT_HINT)};
    END IF;
END IF;"""
    return Step(
        "schema check",
        do_block(body, declare="    recorded text;\n    current text;\n    problems text;"),
    )


# pgvector (issue 27): the HNSW index install gives a dimension has this name; the server's
# vectors.index_name and its statement repeat the expression and the predicate.
VECTOR_INDEX = "memory_embedding_%s_idx"
# pgvector indexes vector of at most this many dimensions with HNSW.
HNSW_MAX_DIMENSIONS = 2000
# The HNSW graph: twice pgvector's defaults (16, 64). With the defaults, bench (j)'s memories
# (groups of near neighbours, as the same fact about many actors would be) left some groups
# unreachable from the rest of the graph: recall@10 0.93, one query 0.0. With these, 1.0, for an
# index build about 3 times as long.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 128


def vector_step() -> Step:
    """Where pgvector is available (or created), embeddings are pgvector values (issue 27).

    On every install, so that installing pgvector after aidb_memory and running install again
    moves to it: the extension is created in pg_catalog when absent (recorded, so that
    uninstall drops it again if nothing else uses it), refused when a function of it is not a
    superuser's (as pg_trgm and btree_gin, migrations/0005); memory.embedding becomes a
    ``vector`` without a dimension (one column, models of any dimension; the stored real[]
    vectors are converted, a rewrite of the table); and each dimension of the current stored
    vectors (up to HNSW_MAX_DIMENSIONS) gets its HNSW index, partial on the dimension (an HNSW
    index needs a fixed one), with the cosine distance. A dimension that appears later has no
    index until install runs again: its search scans the actor's vectors exactly (doctor says
    so). Without pgvector nothing changes: real[] and the window of docs/reference.md."""
    index = VECTOR_INDEX.replace("%s", "%1$s")  # pg_catalog.format's first argument: dims
    created = _notice(
        f"created the HNSW index {SCHEMA}.{VECTOR_INDEX.replace('%s', '%')} of vectors of "
        "% dimensions",
        "dims",
        "dims",
    )
    body = f"""IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'vector')
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_available_extensions WHERE name = 'vector') THEN
    RETURN;
END IF;
SELECT n.nspname INTO placed
FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'vector';
IF placed IS NULL THEN
    CREATE EXTENSION vector WITH SCHEMA pg_catalog;
    INSERT INTO {SCHEMA}.runtime_settings (key, value) VALUES ('created_vector', 'true')
    ON CONFLICT (key) DO NOTHING;
    placed := 'pg_catalog';
    {_notice("created extension vector (pgvector) in schema pg_catalog")}
END IF;
SELECT r.rolname INTO foreign_owner
FROM pg_catalog.pg_depend d
JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
JOIN pg_catalog.pg_proc p ON p.oid = d.objid
JOIN pg_catalog.pg_roles r ON r.oid = p.proowner
WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
  AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
  AND d.deptype = 'e' AND e.extname = 'vector' AND NOT r.rolsuper
LIMIT 1;
IF foreign_owner IS NOT NULL THEN
    RAISE EXCEPTION 'aidb_memory: install refused: a function of extension vector is owned by '
        'role %, not a superuser', foreign_owner
        USING ERRCODE = '42501',
              HINT = 'a superuser runs DROP EXTENSION vector and install creates it again (or '
                     'recreates it himself)';
END IF;
IF (SELECT a.atttypid FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = '{SCHEMA}.memory'::pg_catalog.regclass AND a.attname = 'embedding')
   = 'real[]'::pg_catalog.regtype THEN
    EXECUTE pg_catalog.format(
        'ALTER TABLE {SCHEMA}.memory ALTER COLUMN embedding TYPE %1$I.vector '
        'USING embedding::%1$I.vector', placed);
    {_notice("embeddings are stored as pgvector values now (memory.embedding: vector)")}
END IF;
-- Read first, then indexed: CREATE INDEX refuses a table that an open loop still reads.
EXECUTE pg_catalog.format(
    'SELECT pg_catalog.array_agg(DISTINCT %1$I.vector_dims(embedding)) FROM {SCHEMA}.memory '
    'WHERE embedding IS NOT NULL AND valid_to IS NULL', placed) INTO stored;
FOREACH dims IN ARRAY coalesce(stored, '{{}}')
LOOP
    IF dims <= {HNSW_MAX_DIMENSIONS} AND pg_catalog.to_regclass(
           pg_catalog.format('{SCHEMA}.{index}', dims)) IS NULL THEN
        -- The table's parallel_workers = 0 (migration 0020: no parallel plans of one actor's
        -- rows) would keep the build to one process too; for the build only, in this
        -- transaction, it may use max_parallel_maintenance_workers.
        ALTER TABLE {SCHEMA}.memory RESET (parallel_workers);
        EXECUTE pg_catalog.format(
            'CREATE INDEX {index} ON {SCHEMA}.memory USING hnsw '
            '((embedding::%2$I.vector(%1$s)) %2$I.vector_cosine_ops) '
            'WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}) '
            'WHERE valid_to IS NULL AND %2$I.vector_dims(embedding) = %1$s', dims, placed);
        ALTER TABLE {SCHEMA}.memory SET (parallel_workers = 0);
        {created}
    END IF;
END LOOP;"""
    return Step(
        "pgvector",
        do_block(
            body,
            declare="    placed text;\n    foreign_owner text;\n    stored integer[];\n"
            "    dims integer;",
        ),
    )


def schema_record_step() -> Step:
    """After everything: record what migrations made, for the next install's check and verify."""
    return Step(
        "record schema",
        do_block(
            f"""current := ({catalog.lines_query(catalog.SCHEMA_PART)});
INSERT INTO {SCHEMA}.runtime_settings (key, value) VALUES ('catalog_schema', current)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at
WHERE {SCHEMA}.runtime_settings.value IS DISTINCT FROM EXCLUDED.value;""",
            declare="    current text;",
        ),
    )


def bytecode_step() -> Step:
    """Compile the stored modules with the server's Python and store the bytecode that a
    backend's first call loads instead of compiling them (migrations/0013_runtime_bytecode.sql,
    boot.store_bytecode). It runs on every install, whether or not the code changed, since the
    server's Python may have: it writes only what is missing or stale, so a second install with
    nothing to do changes nothing. boot.py is run from its stored source, as every stub does."""
    body = f"""boot = {{"__name__": "{BOOT_MODULE}"}}
exec(plpy.execute(
    "SELECT source FROM {SCHEMA}.runtime_modules WHERE name OPERATOR(pg_catalog.=) '{BOOT_MODULE}'"
)[0]["source"], boot)
compiled = boot["store_bytecode"]()
if compiled:
    import sys
    plpy.notice("{NOTICE_PREFIX}compiled %d server-side modules for the server's Python %s"
                % (compiled, ".".join(map(str, sys.version_info[:3]))))"""
    return Step("server-side bytecode", f"DO LANGUAGE plpython3u {dollar_quote(body)}")


def code_steps(bundle: CodeBundle) -> list[Step]:
    """Re-apply modules and sql/ unless the recorded code, the stored modules and the catalog of
    the code part are exactly what this package installs."""
    decide = do_block(
        f"""SELECT value INTO recorded FROM {SCHEMA}.runtime_settings WHERE key = 'code_checksum';
SELECT value INTO recorded_code FROM {SCHEMA}.runtime_settings WHERE key = 'catalog_code';
IF recorded IS NOT DISTINCT FROM {literal(bundle.checksum)} AND recorded_code IS NOT NULL THEN
    -- Hand edits of the stored Python, of functions, views, privileges or triggers' state.
    modules := md5(({catalog.MODULES_QUERY}));
    current := ({catalog.lines_query(catalog.CODE)});
END IF;
-- A function, view or trigger that this version does not define is never up to date, even if
-- install recorded it: an install before issue 23 kept an older version's overloads and
-- recorded them (the catalog matched its record, so later installs did nothing).
IF modules IS NOT DISTINCT FROM {literal(expected_modules(bundle))}
   AND current IS NOT DISTINCT FROM recorded_code AND current IS NOT NULL
   AND NOT EXISTS ({extras_query(defined(bundle))}) THEN
    PERFORM set_config('aidb_memory.install_code', 'off', true);
    {_notice(f"code is up to date (version {__version__}, generation {bundle.generation})")}
ELSE
    PERFORM set_config('aidb_memory.install_code', 'on', true);
END IF;""",
        declare="    recorded text;\n    recorded_code text;\n    modules text;\n    current text;",
    )
    steps = [Step("code checksum", decide)]
    names = ", ".join(literal(m.name) for m in bundle.modules)
    upserts = "\n".join(
        f"    INSERT INTO {SCHEMA}.runtime_modules (name, is_package, source) VALUES "
        f"({literal(m.name)}, {str(m.is_package).lower()}, {literal(m.source)})\n"
        "    ON CONFLICT (name) DO UPDATE\n"
        "        SET is_package = EXCLUDED.is_package, source = EXCLUDED.source;"
        for m in bundle.modules
    )
    steps.append(
        Step(
            "server-side modules",
            do_block(
                f"""IF {_CODE_FLAG} THEN
    DELETE FROM {SCHEMA}.runtime_modules WHERE name NOT IN ({names});
{upserts}
    {_notice(f"stored {len(bundle.modules)} server-side modules (generation {bundle.generation})")}
END IF;"""
            ),
        )
    )
    steps.append(bytecode_step())
    steps.append(
        Step(
            "functions and views not of this package",
            do_block(_drop_extras(bundle), "    r record;"),
        )
    )
    for f in bundle.sql_files:
        steps.append(
            Step(
                f"sql/{f.name}",
                do_block(
                    f"IF {_CODE_FLAG} THEN\n{_executes(f.statements)}\n"
                    f"    {_notice(f'applied sql/{f.name}')}\nEND IF;"
                ),
            )
        )
    settings = {
        "version": __version__,
        "generation": bundle.generation,
        "code_checksum": bundle.checksum,
    }
    # updated_at = EXCLUDED.updated_at, the column's default (now()): on Citus these tables are
    # reference tables, and Citus takes only IMMUTABLE functions in DO UPDATE SET.
    upsert_settings = "\n".join(
        f"    INSERT INTO {SCHEMA}.runtime_settings (key, value)\n"
        f"    VALUES ({literal(k)}, {literal(v)})\n"
        "    ON CONFLICT (key) DO UPDATE\n"
        "        SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;"
        for k, v in settings.items()
    )
    steps.append(Step("triggers", do_block(_ENABLE_TRIGGERS, declare="    r record;")))
    steps.append(
        Step(
            "record installed code",
            do_block(
                f"""IF {_CODE_FLAG} THEN
{upsert_settings}
    -- The catalog fingerprint is taken after everything else, so verify can detect hand edits.
    -- Read into variables first: on Citus runtime_settings is a reference table, and a write
    -- to it cannot take a subquery over the system catalog (docs/scaling.md).
    fingerprint := {SCHEMA}.catalog_fingerprint();
    code := ({catalog.lines_query(catalog.CODE)});
    INSERT INTO {SCHEMA}.runtime_settings (key, value)
    VALUES ('catalog_fingerprint', fingerprint)
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;
    INSERT INTO {SCHEMA}.runtime_settings (key, value)
    VALUES ('catalog_code', code)
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;
    {_notice(f"installed version {__version__}")}
END IF;""",
                declare="    fingerprint text;\n    code text;",
            ),
        )
    )
    return steps


def build(
    migrations: list[Migration],
    bundle: CodeBundle,
    *,
    accept_existing_roles: bool = False,
    pgvector: bool = True,
) -> list[Step]:
    """The whole install/upgrade script, without the transaction statements. ``pgvector``:
    whether embeddings move to pgvector where it is available (:func:`vector_step`)."""
    head = preamble()
    # The trust checks go after the superuser check and before CREATE SCHEMA IF NOT EXISTS (which
    # would otherwise adopt someone else's schema); the schema is checked again right after it.
    at = next(i for i, step in enumerate(head) if step.what == "schema")
    return (
        head[:at]
        + trust.trust_steps(accept_existing_roles=accept_existing_roles)
        + [head[at], trust.schema_check_step()]
        + head[at + 1 :]
        + [schema_check_step()]
        + migration_steps(migrations)
        + ([vector_step()] if pgvector else [])
        + code_steps(bundle)
        + [schema_record_step()]
        + trust.final_steps(accept_existing_roles=accept_existing_roles)
    )


def render(steps: list[Step]) -> str:
    """The script as text for ``psql -f``: stops at the first error, one transaction."""
    out = [
        f"-- aidb_memory {__version__}: install or upgrade. Run as a superuser:",
        "--   psql -v ON_ERROR_STOP=1 -f this_file.sql",
        "\\set ON_ERROR_STOP on",
        "BEGIN;",
    ]
    for step in steps:
        out.append(f"\n-- {step.what}\n{step.sql};")
    out.append("\nCOMMIT;\n")
    return "\n".join(out)
