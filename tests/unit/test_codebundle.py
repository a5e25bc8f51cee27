"""The idempotent part of the package without a database: sql/ lint, stubs, generations."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pglast
import pytest

from aidb_memory.install import codebundle
from aidb_memory.install.codebundle import (
    BOOT_MODULE,
    generation_of,
    load_bundle,
    load_modules,
    load_sql_files,
    render_stubs,
)
from aidb_memory.install.migrations import SqlSourceError
from aidb_memory.install.sources import SourceTree, default_tree

GEN = "0123456789abcdef"
DEBUG_OFF = "SET debug_print_parse = off SET debug_print_rewritten = off SET debug_print_plan = off"
HEADER = f"SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp\n{DEBUG_OFF}\n"
GOOD_PY = (
    "CREATE OR REPLACE FUNCTION aidb_memory.init(name text) RETURNS bigint\n"
    f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ namespaces.init $py$"
)
GOOD_SQL = (
    "CREATE OR REPLACE FUNCTION aidb_memory.version() RETURNS text\n"
    f"LANGUAGE sql STABLE {HEADER}AS $$ SELECT 'v' $$"
)


def sql_files(
    tmp_path: Path, text: str, name: str = "50_test.sql"
) -> tuple[codebundle.SqlFile, ...]:
    directory = tmp_path / "sql"
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text, encoding="utf-8")
    return load_sql_files(directory, GEN)


def refused(tmp_path: Path, text: str, name: str = "50_test.sql") -> str:
    with pytest.raises(SqlSourceError) as info:
        sql_files(tmp_path, text, name)
    message = str(info.value)
    assert message.startswith(f"sql/{name}: "), message
    return message


def python_body(statement: str) -> str:
    """The body of a rendered CREATE FUNCTION, as PostgreSQL will store it."""
    (raw,) = pglast.parse_sql(statement)
    (body,) = next(opt.arg for opt in raw.stmt.options if opt.defname == "as")
    return str(body.sval)


# --- the package's own sql/ ------------------------------------------------------------------


def test_the_package_bundle_loads_and_every_python_function_embeds_the_generation() -> None:
    bundle = load_bundle(default_tree())
    assert re.fullmatch(r"[0-9a-f]{16}", bundle.generation)
    assert [f.name for f in bundle.sql_files] == sorted(f.name for f in bundle.sql_files)
    python_functions = [
        s for f in bundle.sql_files for s in f.statements if "LANGUAGE plpython3u" in s
    ]
    assert python_functions
    for statement in python_functions:
        body = python_body(statement)
        assert f"code generation {bundle.generation})" in body
        assert f'rt.generation != "{bundle.generation}"' in body
        assert f'boot["boot"](GD, "{bundle.generation}")' in body
        # The stub is valid Python once PL/Python wraps it in a function.
        compile("def f(args):\n" + textwrap.indent(body, "    "), "stub", "exec")


def test_loading_twice_gives_the_same_bundle() -> None:
    assert load_bundle(default_tree()) == load_bundle(default_tree())


# --- sql/ lint: what belongs in a migration ---------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "what"),
    [
        ("CREATE TABLE aidb_memory.t (a int)", "CREATE TABLE"),
        ("CREATE TABLE IF NOT EXISTS aidb_memory.t (a int)", "CREATE TABLE"),
        ("create unlogged table aidb_memory.t (a int)", "CREATE TABLE"),
        ("CREATE TABLE aidb_memory.t AS SELECT 1 AS a", "CREATE TABLE AS"),
        ("SELECT 1 AS a INTO aidb_memory.t", "SELECT INTO"),
        ("CREATE SEQUENCE aidb_memory.s", "CREATE SEQUENCE"),
        ("CREATE INDEX IF NOT EXISTS i ON aidb_memory.namespace (name)", "CREATE INDEX"),
        ("INSERT INTO aidb_memory.namespace (name) VALUES ('x')", "INSERT"),
        ("insert into aidb_memory.namespace (name) values ('x') on conflict do nothing", "INSERT"),
        ("UPDATE aidb_memory.namespace SET name = 'y'", "UPDATE"),
        ("DELETE FROM aidb_memory.namespace", "DELETE"),
        ("TRUNCATE aidb_memory.namespace", "TRUNCATE"),
        ("DROP TABLE IF EXISTS aidb_memory.namespace", "DROP TABLE"),
        ("DROP SCHEMA aidb_memory CASCADE", "DROP SCHEMA"),
        ("COPY aidb_memory.namespace FROM '/tmp/x'", "COPY"),
        ("BEGIN", "transaction control"),
        ("COMMIT", "transaction control"),
    ],
)
def test_stored_data_statements_are_refused_in_sql(
    tmp_path: Path, statement: str, what: str
) -> None:
    message = refused(tmp_path, f"{GOOD_SQL};\n{statement};\n")
    assert f"{what} does not belong in an idempotent file" in message
    assert "migration" in message


def test_idempotent_statements_are_fine(tmp_path: Path) -> None:
    text = f"""
        DROP FUNCTION IF EXISTS aidb_memory.old(text);
        DROP VIEW IF EXISTS aidb_memory.old_view;
        {GOOD_SQL};
        CREATE OR REPLACE VIEW aidb_memory.v AS SELECT 1 AS one;
        COMMENT ON FUNCTION aidb_memory.version() IS 'x';
        REVOKE ALL ON FUNCTION aidb_memory.version() FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION aidb_memory.version() TO aidb_users;
        DO $$ BEGIN NULL; END $$;
    """
    (f,) = sql_files(tmp_path, text)
    assert len(f.statements) == 8


# --- sql/ lint: functions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "$py$ return 1 $py$",  # real Python
        "$$ namespaces.init $$",  # the right target, another quote
        "$py$ init $py$",  # no module
        "$py$ namespaces.init() $py$",
        "$py$ namespaces.init\nnamespaces.other $py$",
        "$py$\nimport os\nnamespaces.init\n$py$",
        "'namespaces.init'",
        "$body$ x = '$py$ namespaces.init $py$' $body$",
    ],
)
def test_a_python_function_needs_the_one_line_target_body(tmp_path: Path, body: str) -> None:
    statement = (
        "CREATE FUNCTION aidb_memory.init(name text) RETURNS bigint\n"
        f"LANGUAGE plpython3u {HEADER}AS {body}"
    )
    message = refused(tmp_path, statement + ";\n")
    assert "aidb_memory.init must have the one-line body $py$ module.function $py$" in message


@pytest.mark.parametrize(
    "header",
    [
        "SET search_path = pg_catalog, pg_temp",  # no SECURITY DEFINER
        "SECURITY INVOKER SET search_path = pg_catalog, pg_temp",
        "EXTERNAL SECURITY INVOKER SET search_path = pg_catalog, pg_temp",
    ],
)
@pytest.mark.parametrize("language", ["sql", "plpython3u"])
def test_a_function_must_be_security_definer(tmp_path: Path, header: str, language: str) -> None:
    body = "$py$ namespaces.init $py$" if language == "plpython3u" else "$$ SELECT 1 $$"
    statement = (
        f"CREATE FUNCTION aidb_memory.f() RETURNS int LANGUAGE {language} {header} AS {body}"
    )
    assert "aidb_memory.f must be SECURITY DEFINER" in refused(tmp_path, statement + ";\n")


@pytest.mark.parametrize(
    "setting",
    [
        "",  # no SET at all
        "SET search_path = public",
        "SET search_path = pg_temp, pg_catalog",
        "SET search_path = pg_catalog",
        "SET search_path = pg_catalog, pg_temp, public",
        "SET search_path FROM CURRENT",
        "SET work_mem = '1MB'",
        "SET search_path = pg_catalog, pg_temp SET search_path = public",
    ],
)
@pytest.mark.parametrize("language", ["sql", "plpython3u"])
def test_a_function_must_pin_the_search_path(tmp_path: Path, setting: str, language: str) -> None:
    body = "$py$ namespaces.init $py$" if language == "plpython3u" else "$$ SELECT 1 $$"
    statement = (
        f"CREATE FUNCTION aidb_memory.f() RETURNS int LANGUAGE {language} SECURITY DEFINER "
        f"{setting} AS {body}"
    )
    message = refused(tmp_path, statement + ";\n")
    assert "aidb_memory.f must SET search_path = pg_catalog, pg_temp" in message


@pytest.mark.parametrize("setting", codebundle.PINNED_OFF)
@pytest.mark.parametrize("value", [None, "on", "true"])
def test_security_definer_functions_must_pin_the_debug_print_settings(
    tmp_path: Path, setting: str, value: str | None
) -> None:
    others = " ".join(f"SET {s} = off" for s in codebundle.PINNED_OFF if s != setting)
    mine = f"SET {setting} = {value}" if value else ""
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.f() RETURNS int LANGUAGE sql\n"
        f"SECURITY DEFINER SET search_path = pg_catalog, pg_temp {others} {mine}\n"
        "AS $$ SELECT 1 $$"
    )
    message = refused(tmp_path, text)
    assert f"aidb_memory.f must SET {setting} = off" in message


@pytest.mark.parametrize(
    "options",
    [
        HEADER,
        f"security definer set search_path to pg_catalog, pg_temp {DEBUG_OFF.lower()}",
        f"SET search_path = 'pg_catalog', \"pg_temp\" {DEBUG_OFF} EXTERNAL SECURITY DEFINER",
        # other settings next to the search_path
        f"SECURITY DEFINER SET work_mem = '8MB' SET search_path = pg_catalog, pg_temp {DEBUG_OFF}",
        f"SECURITY DEFINER {DEBUG_OFF} SET search_path = pg_catalog, pg_temp "
        "SET statement_timeout = 0",
    ],
)
def test_well_formed_functions_pass(tmp_path: Path, options: str) -> None:
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.init(name text) RETURNS bigint\n"
        f"LANGUAGE plpython3u {options}\nAS $py$ namespaces.init $py$;\n"
        "CREATE OR REPLACE PROCEDURE aidb_memory.p()\n"
        f"LANGUAGE plpython3u {options}\nAS $py$   sub.pkg.run\t$py$;\n"
    )
    (f,) = sql_files(tmp_path, text)
    assert f'rt.bind(globals(), "namespaces.init", "{GEN}")()' in python_body(f.statements[0])
    assert 'rt.bind(globals(), "sub.pkg.run", ' in python_body(f.statements[1])


# --- stub rendering ---------------------------------------------------------------------------


def test_rendering_replaces_only_the_python_function_bodies(tmp_path: Path) -> None:
    text = f"""-- Bodies are written as $py$ module.function $py$, see codebundle.py.
{GOOD_PY};
COMMENT ON FUNCTION aidb_memory.init(text) IS 'Runs $py$ namespaces.init $py$.';
{GOOD_SQL.replace("SELECT 'v'", "SELECT '$py$ a.b $py$'")};
"""
    (f,) = sql_files(tmp_path, text)
    function, comment, sql_function = f.statements
    body = python_body(function)
    assert "namespaces.init $py$" not in function
    assert f"# aidb_memory: runs namespaces.init (code generation {GEN})" in body
    assert body.rstrip().endswith(f'return rt.bind(globals(), "namespaces.init", "{GEN}")()')
    # A failure to load the code is named after the SQL function, like every error of ours.
    assert 'type("init", (plpy.Error,)' in body
    assert "FROM aidb_memory.runtime_modules AS m LEFT JOIN aidb_memory.runtime_bytecode" in body
    assert f"WHERE m.name = '{BOOT_MODULE}'" in body
    assert (
        comment == "COMMENT ON FUNCTION aidb_memory.init(text) IS 'Runs $py$ namespaces.init $py$.'"
    )
    assert "SELECT '$py$ a.b $py$'" in sql_function
    assert GEN not in sql_function
    # The same through render_stubs, on text: the comment keeps its words.
    rendered = render_stubs(text, GEN)
    assert rendered.count(f"code generation {GEN}") == 1
    assert "'Runs $py$ namespaces.init $py$.'" in rendered


def test_rendering_embeds_the_generation_given(tmp_path: Path) -> None:
    directory = tmp_path / "sql"
    directory.mkdir()
    (directory / "10_f.sql").write_text(GOOD_PY + ";\n")
    (one,) = load_sql_files(directory, "aaaaaaaaaaaaaaaa")
    (two,) = load_sql_files(directory, "bbbbbbbbbbbbbbbb")
    assert "aaaaaaaaaaaaaaaa" in one.statements[0]
    assert "bbbbbbbbbbbbbbbb" not in one.statements[0]
    assert "bbbbbbbbbbbbbbbb" in two.statements[0]
    assert one.statements[0].replace("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb") == two.statements[0]


# --- statements written once for two functions -----------------------------------------------


def _plpgsql(name: str, body: str) -> str:
    return (
        f"CREATE OR REPLACE FUNCTION aidb_memory.{name}() RETURNS bigint\n"
        f"LANGUAGE plpgsql STABLE {HEADER}AS $$\nBEGIN\n{body}\nEND\n$$;\n"
    )


SHARED = "    -- BEGIN count\n    SELECT count(*)\n    FROM pg_catalog.pg_class\n    -- END count\n"


def test_a_statement_written_once_stands_where_another_function_names_it(tmp_path: Path) -> None:
    text = _plpgsql("a", f"    RETURN (\n{SHARED}    );") + _plpgsql(
        "b", "    RETURN 1 + (\n    @count@\n    );"
    )
    (f,) = sql_files(tmp_path, text)
    a, b = f.statements
    assert "    SELECT count(*)\n    FROM pg_catalog.pg_class\n" in a
    assert "    RETURN 1 + (\n    SELECT count(*)\n    FROM pg_catalog.pg_class\n    );" in b
    assert "-- BEGIN" not in b and "@count@" not in b
    assert render_stubs(text, GEN) == "".join(f"{s};\n" for s in f.statements)


def test_a_name_no_statement_has_or_one_written_twice_is_refused(tmp_path: Path) -> None:
    unknown = _plpgsql("a", f"    RETURN (\n{SHARED}    );") + _plpgsql("b", "    @counts@")
    assert "@counts@ names no lines of sql/" in refused(tmp_path, unknown)
    twice = _plpgsql("a", f"    RETURN (\n{SHARED}    );") + _plpgsql(
        "b", f"    RETURN (\n{SHARED}    );"
    )
    assert "-- BEGIN count stands twice" in refused(tmp_path, twice)


def test_lines_written_in_another_file_or_within_other_lines_are_expanded(
    tmp_path: Path,
) -> None:
    """A fragment of another sql/ file stands where it is named, and the ``@<name>@`` lines of
    a fragment are expanded where the fragment stands."""
    outer = "    -- BEGIN outer\n    RETURN 1 + (\n    @count@\n    );\n    -- END outer\n"
    sql_files(tmp_path, _plpgsql("a", f"    RETURN (\n{SHARED}    );"), "10_a.sql")
    b, c = sql_files(tmp_path, _plpgsql("b", outer) + _plpgsql("c", "    @outer@"), "20_b.sql")[
        1
    ].statements
    for body in (b, c):
        assert "    RETURN 1 + (\n    SELECT count(*)\n    FROM pg_catalog.pg_class\n" in body
        assert "@count@" not in body
    assert "@outer@" not in c


def test_a_name_written_in_two_files_or_within_itself_is_refused(tmp_path: Path) -> None:
    sql_files(tmp_path, _plpgsql("a", f"    RETURN (\n{SHARED}    );"), "10_a.sql")
    message = refused(tmp_path, _plpgsql("b", f"    RETURN (\n{SHARED}    );"), "20_b.sql")
    assert "-- BEGIN count stands in sql/10_a.sql too" in message
    (tmp_path / "sql" / "10_a.sql").unlink()
    loop = "    -- BEGIN again\n    @again@\n    -- END again\n"
    assert "@again@ stands within its own lines" in refused(tmp_path, _plpgsql("a", loop))


def test_only_a_line_of_its_own_names_a_statement(tmp_path: Path) -> None:
    # jsonpath and operators use @: text around a name is never replaced.
    text = _plpgsql("a", f"    RETURN (\n{SHARED}    );") + _plpgsql(
        "b", "    RETURN (SELECT 1 WHERE '@count@' <> '');"
    )
    (f,) = sql_files(tmp_path, text)
    assert "'@count@'" in f.statements[1]


# --- generations and the bundle checksum ------------------------------------------------------


def _module_files(root: Path) -> list[Path]:
    return sorted((root / "plpython" / "aidb_memory_server").rglob("*.py"))


def test_the_generation_changes_when_any_module_changes(source_tree: Path) -> None:
    tree = SourceTree(source_tree)
    base = load_bundle(tree)
    files = _module_files(source_tree)
    assert len(files) == len(base.modules) > 1
    seen = {base.generation}
    for path in files:
        original = path.read_text()
        path.write_text(original + "\n# changed\n")
        changed = load_bundle(tree)
        assert changed.generation not in seen, path.name
        assert changed.checksum != base.checksum, path.name
        for f in changed.sql_files:
            for statement in f.statements:
                assert base.generation not in statement
        seen.add(changed.generation)
        path.write_text(original)
    assert load_bundle(tree) == base


def test_the_generation_changes_when_a_module_is_added_or_renamed(source_tree: Path) -> None:
    plpython = source_tree / "plpython"
    base = generation_of(load_modules(plpython))
    extra = plpython / "aidb_memory_server" / "extra.py"
    extra.write_text("")
    added = generation_of(load_modules(plpython))
    extra.rename(extra.with_name("extra2.py"))
    renamed = generation_of(load_modules(plpython))
    assert len({base, added, renamed}) == 3


def test_a_sql_change_changes_the_checksum_not_the_generation(source_tree: Path) -> None:
    tree = SourceTree(source_tree)
    base = load_bundle(tree)
    path = sorted((source_tree / "sql").glob("*.sql"))[-1]
    path.write_text(path.read_text() + "\nCOMMENT ON SCHEMA aidb_memory IS 'x';\n")
    changed = load_bundle(tree)
    assert changed.generation == base.generation
    assert changed.checksum != base.checksum


def test_modules_are_named_as_python_imports_them(source_tree: Path) -> None:
    sub = source_tree / "plpython" / "aidb_memory_server" / "sub"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    (sub / "leaf.py").write_text("X = 1\n")
    modules = {m.name: m.is_package for m in load_modules(source_tree / "plpython")}
    assert modules["aidb_memory_server"] is True
    assert modules["aidb_memory_server.sub"] is True
    assert modules["aidb_memory_server.sub.leaf"] is False
    assert modules[BOOT_MODULE] is False


def test_a_missing_boot_module_is_refused(source_tree: Path) -> None:
    (source_tree / "plpython" / "aidb_memory_server" / "boot.py").unlink()
    with pytest.raises(SqlSourceError, match=BOOT_MODULE.replace(".", r"\.")):
        load_modules(source_tree / "plpython")


# --- targets must exist -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("nosuchmodule.init", "plpython/ has no module aidb_memory_server.nosuchmodule"),
        (
            "namespaces.no_such_function",
            "aidb_memory_server.namespaces defines no no_such_function",
        ),
    ],
)
def test_a_target_that_does_not_exist_is_refused(
    source_tree: Path, target: str, error: str
) -> None:
    path = source_tree / "sql" / "95_extra.sql"
    path.write_text(GOOD_PY.replace("namespaces.init", target) + ";\n")
    with pytest.raises(SqlSourceError) as info:
        load_bundle(SourceTree(source_tree))
    assert str(info.value) == f"sql/95_extra.sql: {target}: {error}"


def test_targets_may_be_defined_or_imported_at_top_level(source_tree: Path) -> None:
    module = source_tree / "plpython" / "aidb_memory_server" / "extra.py"
    module.write_text(
        "from aidb_memory_server.namespaces import init as imported\n"
        "assigned = imported\n"
        "def defined(x): return x\n"
        "async def coroutine(): pass\n"
    )
    text = "".join(
        GOOD_PY.replace("aidb_memory.init", f"aidb_memory.{n}").replace(
            "namespaces.init", f"extra.{n}"
        )
        + ";\n"
        for n in ("imported", "assigned", "defined")
    )
    (source_tree / "sql" / "95_extra.sql").write_text(text)
    bundle = load_bundle(SourceTree(source_tree))
    assert bundle.sql_files[-1].name == "95_extra.sql"
    assert len(bundle.sql_files[-1].statements) == 3


# --- the worker's procedure: SECURITY INVOKER, so it pins its own search_path -----------------

PIN = "PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);"


def procedure(declare: str, body: str) -> str:
    return (
        "CREATE OR REPLACE PROCEDURE aidb_memory.p(n integer DEFAULT 1)\n"
        f"LANGUAGE plpgsql\nAS $$\n{declare}BEGIN\n{body}\nEND\n$$;\n"
    )


def test_the_package_worker_procedure_passes_the_pin_lint() -> None:
    (f,) = [f for f in load_bundle(default_tree()).sql_files if f.name == "70_worker.sql"]
    assert any("PROCEDURE aidb_memory.process_events" in s and PIN in s for s in f.statements)


def test_a_procedure_that_pins_first_and_after_every_commit_passes(tmp_path: Path) -> None:
    text = procedure(
        "DECLARE\n    x pg_catalog.int8;\n    y pg_catalog.text;\n",
        f"{PIN}\nx := 1;\nFOR i IN 1..n LOOP\n  COMMIT;\n  {PIN}\n  IF x < 2 THEN\n"
        f"    ROLLBACK;\n    {PIN}\n  END IF;\nEND LOOP;",
    )
    (f,) = sql_files(tmp_path, text)
    assert len(f.statements) == 1


@pytest.mark.parametrize(
    ("declare", "body", "error"),
    [
        ("", "RAISE NOTICE 'first';", "must start with `PERFORM pg_catalog.set_config("),
        ("", f"IF n < 1 THEN RETURN; END IF;\n{PIN}", "must start with `PERFORM"),
        ("", f"{PIN}\nCOMMIT;", "every COMMIT must be followed by `PERFORM"),
        ("", f"{PIN}\nCOMMIT;\nIF n > 1 THEN RETURN; END IF;\n{PIN}", "every COMMIT must be"),
        ("", f"{PIN}\nWHILE n > 0 LOOP\n  COMMIT;\nEND LOOP;", "every COMMIT must be"),
        ("", f"{PIN}\nIF n > 0 THEN ROLLBACK; END IF;", "every ROLLBACK must be"),
        (
            "DECLARE\n    x pg_catalog.int4 := n + 1;\n",
            PIN,
            "variable x has a default, which is evaluated before the first statement",
        ),
        ("DECLARE\n    x text;\n", PIN, "variable x must have a type qualified with pg_catalog."),
        ("DECLARE\n    x bigint;\n", PIN, "variable x must have a type qualified with pg_catalog."),
    ],
)
def test_a_procedure_that_could_evaluate_before_its_pin_is_refused(
    tmp_path: Path, declare: str, body: str, error: str
) -> None:
    message = refused(tmp_path, procedure(declare, body))
    assert message.startswith("sql/50_test.sql: procedure aidb_memory.p"), message
    assert error in message


def test_a_committing_procedure_must_be_plpgsql(tmp_path: Path) -> None:
    text = "CREATE PROCEDURE aidb_memory.p() LANGUAGE sql AS $$ SELECT 1 $$;\n"
    assert "procedure aidb_memory.p must be LANGUAGE plpgsql" in refused(tmp_path, text)


# Granted PL/Python functions are installed behind a PL/pgSQL wrapper (codebundle.BODY_SUFFIX).

GRANT_INIT = "GRANT EXECUTE ON FUNCTION aidb_memory.init(text) TO aidb_admins"


def _function(statement: str) -> tuple[str, str, str]:
    """(signature, language, body) of a rendered CREATE FUNCTION."""
    (raw,) = pglast.parse_sql(statement)
    stmt = raw.stmt
    language = next(str(o.arg.sval) for o in stmt.options if o.defname == "language")
    return codebundle.catalog.signature(stmt), language, python_body(statement)


def test_a_granted_python_function_becomes_a_body_and_a_wrapper(tmp_path: Path) -> None:
    (f,) = sql_files(tmp_path, f"{GOOD_PY};\n{GRANT_INIT};\n")
    body, comment, wrapper, grant = f.statements
    assert _function(body)[:2] == ("aidb_memory.init_py(text)", "plpython3u")
    assert 'rt.bind(globals(), "namespaces.init", "0123456789abcdef")' in python_body(body)
    assert comment.startswith("COMMENT ON FUNCTION aidb_memory.init_py(text) IS 'Internal:")
    signature, language, source = _function(wrapper)
    assert (signature, language) == ("aidb_memory.init(text)", "plpgsql")
    assert "RETURN aidb_memory.init_py($1);" in source
    assert "EXCEPTION WHEN OTHERS OR query_canceled THEN" in source
    assert "'aidb_memory.init: ' || _message" in source
    # Same options as the source: the lint's SECURITY DEFINER, search_path and debug pins.
    for text in (body, wrapper):
        assert "SECURITY DEFINER" in text and "SET search_path TO 'pg_catalog', 'pg_temp'" in text
        assert "SET debug_print_plan TO 'off'" in text
    assert grant == GRANT_INIT


def test_the_wrapper_returns_what_the_function_returns(tmp_path: Path) -> None:
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.init(name text) RETURNS TABLE (id bigint)\n"
        f"LANGUAGE plpython3u STABLE {HEADER}AS $py$ namespaces.init $py$;\n"
        "CREATE OR REPLACE FUNCTION aidb_memory.drop(name text) RETURNS void\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ namespaces.drop $py$;\n"
        f"{GRANT_INIT};\nGRANT EXECUTE ON FUNCTION aidb_memory.drop(text) TO aidb_admins;\n"
    )
    (f,) = sql_files(tmp_path, text)
    wrappers = [s for s in f.statements if "LANGUAGE plpgsql" in s]
    assert "RETURN QUERY SELECT * FROM aidb_memory.init_py($1);" in python_body(wrappers[0])
    assert "STABLE" in wrappers[0]
    assert "PERFORM aidb_memory.drop_py($1);" in python_body(wrappers[1])


def test_the_wrapper_measures_text_and_jsonb_arguments_before_the_call(tmp_path: Path) -> None:
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.add(namespace text, n integer, turns jsonb, "
        "note text DEFAULT NULL) RETURNS uuid\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ adding.add $py$;\n"
        "CREATE OR REPLACE FUNCTION aidb_memory.init(name text) RETURNS bigint\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ namespaces.init $py$;\n"
        "GRANT EXECUTE ON FUNCTION aidb_memory.add(text, integer, jsonb, text) TO aidb_users;\n"
        f"{GRANT_INIT};\n"
    )
    (f,) = sql_files(tmp_path, text)
    add, init = (python_body(s) for s in f.statements if "LANGUAGE plpgsql" in s)
    assert add is not None and init is not None
    guards = re.findall(
        r"IF pg_catalog\.pg_column_size\(\$(\d)\) OPERATOR\(pg_catalog\.>\) 65536"
        r"(?:\s+OR pg_catalog\.jsonb_path_exists\(\$\d, '[^']+'\))? THEN\s+"
        r"PERFORM aidb_memory\.refuse_oversized\('add', '(\w+)', (\S+), \$(\d)\);",
        add,
    )
    # Each text and jsonb argument, with the namespace argument for its namespace's caps; not
    # the integer; all before the call.
    assert guards == [("1", "namespace", "$1", "1"), ("3", "turns", "$1", "3"),
                      ("4", "note", "$1", "4")]  # fmt: skip
    assert add.index("refuse_oversized") < add.index("aidb_memory.add_py(")
    # The jsonb argument's widest numbers too, and only its.
    assert add.count("jsonb_path_exists($3, ") == 1 and add.count("jsonb_path_exists") == 1
    assert codebundle.WIDE_NUMBER_PATH in add
    assert "PERFORM aidb_memory.refuse_oversized('init', 'name', NULL::text, $1);" in init


def test_the_wrapper_runs_a_fast_path_first_when_sql_defines_one(tmp_path: Path) -> None:
    """``<name>_fast`` of the same arguments, ``BEGIN <block> RETURN NULL; END``: the wrapper runs
    the block after the guards and inside the exception handler, then the PL/Python body; a
    function without one is wrapped as before."""
    block = "    IF $2 IS NOT NULL THEN\n        RETURN gen_random_uuid();\n    END IF;\n"
    fast = (
        "CREATE OR REPLACE FUNCTION aidb_memory.add_fast(namespace text, turns jsonb) "
        f"RETURNS uuid\nLANGUAGE plpgsql VOLATILE {HEADER}AS $$\nBEGIN\n{block}    RETURN NULL;\n"
        "END\n$$;\n"
    )
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.add(namespace text, turns jsonb) RETURNS uuid\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ adding.add $py$;\n"
        "CREATE OR REPLACE FUNCTION aidb_memory.init(name text) RETURNS bigint\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ namespaces.init $py$;\n"
        "GRANT EXECUTE ON FUNCTION aidb_memory.add(text, jsonb) TO aidb_users;\n"
        f"{GRANT_INIT};\n"
    )

    def wrappers(sql: str) -> list[str]:
        (f,) = sql_files(tmp_path, sql)
        found = [python_body(s) for s in f.statements if "LANGUAGE plpgsql" in s]
        return [w for w in found if w is not None and "_py(" in w]  # not add_fast itself

    add, init = wrappers(text + fast)
    assert block in add
    assert (
        add.index("refuse_oversized") < add.index(block) < add.index("aidb_memory.add_py($1, $2)")
    )
    assert add.index(block) < add.index("EXCEPTION WHEN")
    assert "gen_random_uuid" not in init
    # Another signature is no fast path of add.
    add, _ = wrappers(text + fast.replace("(namespace text, turns jsonb)", "(namespace text)"))
    assert block not in add
    # A body of another shape is refused.
    with pytest.raises(SqlSourceError, match="a fast path's body"):
        wrappers(text + fast.replace("    RETURN NULL;\n", ""))


def test_a_set_returning_function_takes_a_fast_path_that_ends_with_return(tmp_path: Path) -> None:
    """A set-returning ``<name>_fast`` is ``BEGIN <block> RETURN; END`` (RETURN NULL is no
    statement of a set-returning PL/pgSQL function): its block runs before the body's RETURN
    QUERY."""
    block = (
        "    IF $1 IS NOT NULL THEN\n        RETURN QUERY SELECT 1;\n        RETURN;\n    END IF;\n"
    )
    fast = (
        "CREATE OR REPLACE FUNCTION aidb_memory.get_fast(name text) RETURNS SETOF integer\n"
        f"LANGUAGE plpgsql VOLATILE {HEADER}AS $$\nBEGIN\n{block}    RETURN;\nEND\n$$;\n"
    )
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.get(name text) RETURNS SETOF integer\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ things.get $py$;\n"
        "GRANT EXECUTE ON FUNCTION aidb_memory.get(text) TO aidb_users;\n"
    )
    (f,) = sql_files(tmp_path, text + fast)
    (wrapper,) = [
        w
        for w in (python_body(s) for s in f.statements if "LANGUAGE plpgsql" in s)
        if w is not None and "_py(" in w
    ]
    assert block in wrapper
    assert wrapper.index(block) < wrapper.index("RETURN QUERY SELECT * FROM aidb_memory.get_py($1)")


def test_the_wide_number_path_is_the_one_refuse_oversized_counts() -> None:
    """sql/12_argument_caps.sql counts the text of the numbers the wrappers' guard finds."""
    sql = (Path(__file__).resolve().parents[2] / "sql" / "12_argument_caps.sql").read_text()
    assert f"'{codebundle.WIDE_NUMBER_PATH}'" in sql.replace("'\n        '", "")


def test_an_ungranted_python_function_is_not_wrapped(tmp_path: Path) -> None:
    (f,) = sql_files(tmp_path, f"{GOOD_PY};\n")
    (statement,) = f.statements
    assert _function(statement)[:2] == ("aidb_memory.init(text)", "plpython3u")


def test_a_grant_of_a_function_sql_does_not_define_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SqlSourceError, match=r"does not define: \['aidb_memory.init\(jsonb\)'\]"):
        sql_files(tmp_path, f"{GOOD_PY};\n{GRANT_INIT.replace('(text)', '(jsonb)')};\n")


def test_a_granted_function_with_out_parameters_is_refused(tmp_path: Path) -> None:
    text = (
        "CREATE OR REPLACE FUNCTION aidb_memory.init(name text, OUT id bigint)\n"
        f"LANGUAGE plpython3u VOLATILE {HEADER}AS $py$ namespaces.init $py$;\n{GRANT_INIT};\n"
    )
    with pytest.raises(SqlSourceError, match="must return a value, a set or a table"):
        sql_files(tmp_path, text)
