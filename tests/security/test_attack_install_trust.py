"""Issue 9, class 3: install refuses a schema, object or role it did not create and cannot trust.

The attackers: ``dbowner_user`` owns the database (PostgreSQL 15 lets it ``CREATE SCHEMA``), so it
can prepare ``aidb_memory`` before a superuser installs; ``createrole_user`` (CREATEROLE) can
change the cluster-wide roles ``aidb_users``, ``aidb_admins`` and ``aidb_workers``. Install (the
CLI and ``aidb-memory sql | psql``) must refuse, change nothing, and ``doctor`` must say why.

The roles are shared by every test of the run: each test that changes them restores them in a
``finally`` block, as a superuser.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pglast
import pytest

from aidb_memory.ops.doctor import probe_server_python
from conftest import CREATEROLE_USER, OWNER_USER, Database, psql, run_cli

REFUSED = "aidb-memory: install refused: "


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refused install (exit 1, no traceback)."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(REFUSED), lines[0]
    return lines[0]


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def psql_script(db: Database, *sql_args: str) -> subprocess.CompletedProcess[str]:
    """``aidb-memory sql [sql_args] | psql`` as a superuser, with SQLSTATEs in the errors."""
    script = ok(run_cli("sql", *sql_args))
    return psql(db.dsn(), "-q", "-v", "VERBOSITY=verbose", "-f", "-", input=script)


def psql_refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "ERROR:  42501: aidb_memory: install refused: " in result.stderr, result.stderr
    return result.stderr


def doctor_line(output: str, name: str) -> str:
    lines = [ln for ln in output.splitlines() if re.match(rf"^\w+\s+{name}\s", ln)]
    assert len(lines) == 1, output
    return lines[0]


def installed_nothing(db: Database) -> None:
    """Neither the installer's tables nor plpython3u were created."""
    assert db.value("SELECT to_regclass('aidb_memory.schema_migrations')") is None
    assert db.value("SELECT to_regclass('aidb_memory.runtime_settings')") is None
    assert db.value("SELECT count(*) FROM pg_extension WHERE extname = 'plpython3u'") == 0


def objects_in_schema(db: Database) -> list[tuple[str, str]]:
    return db.sql(
        """SELECT pg_describe_object(classid, objid, 0), pg_get_userbyid(owner)
           FROM (SELECT 'pg_class'::regclass AS classid, oid AS objid, relowner AS owner
                 FROM pg_class WHERE relnamespace = 'aidb_memory'::regnamespace
                 UNION ALL
                 SELECT 'pg_proc'::regclass, oid, proowner
                 FROM pg_proc WHERE pronamespace = 'aidb_memory'::regnamespace) o
           ORDER BY 1"""
    )


# --- the schema ------------------------------------------------------------------------------


def test_a_schema_the_database_owner_created_is_refused(owned_empty_db: Database) -> None:
    db = owned_empty_db
    db.sql("CREATE SCHEMA aidb_memory", user=OWNER_USER)

    line = refused(run_cli("install", dsn=db.dsn()))
    assert f"schema aidb_memory is owned by {OWNER_USER}, not a superuser" in line
    assert "DROP SCHEMA aidb_memory CASCADE" in line  # the hint
    installed_nothing(db)
    refused(run_cli("install", "--dry-run", dsn=db.dsn()))
    # --accept-existing-roles is about roles: it never makes an untrusted schema acceptable.
    refused(run_cli("install", "--accept-existing-roles", dsn=db.dsn()))

    stderr = psql_refused(psql_script(db))
    assert f"schema aidb_memory is owned by {OWNER_USER}" in stderr
    installed_nothing(db)
    assert (
        db.value("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'aidb_memory'")
        == OWNER_USER
    )


PLANTED_FUNCTION = """
CREATE SCHEMA aidb_memory;
CREATE TABLE public.ran (who text);
GRANT INSERT ON public.ran TO PUBLIC;
CREATE FUNCTION aidb_memory.catalog_fingerprint() RETURNS text LANGUAGE sql AS
$$ INSERT INTO public.ran VALUES (current_user) RETURNING 'planted' $$;
CREATE TABLE aidb_memory.schema_migrations (name text PRIMARY KEY, checksum text NOT NULL,
    package_version text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE aidb_memory.runtime_settings (key text PRIMARY KEY, value text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now());
"""


def test_a_planted_catalog_fingerprint_never_runs(owned_empty_db: Database) -> None:
    """The owner prepares what ``status`` and a re-install call: none of it may run."""
    db = owned_empty_db
    with db.connect(OWNER_USER) as conn:
        conn.execute(PLANTED_FUNCTION)
    before = objects_in_schema(db)

    line = refused(run_cli("install", dsn=db.dsn()))
    assert "function aidb_memory.catalog_fingerprint() is owned by dbowner_user" in line
    psql_refused(psql_script(db))
    # status, verify and uninstall read the schema: they refuse before reading anything.
    for command in (["status"], ["verify"], ["uninstall", "--yes"]):
        result = run_cli(*command, dsn=db.dsn())
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr.startswith(
            "aidb-memory: refused: schema aidb_memory was not created"
        ), result.stderr
    assert db.value("SELECT count(*) FROM public.ran") == 0
    assert objects_in_schema(db) == before
    assert db.value("SELECT count(*) FROM pg_extension WHERE extname = 'plpython3u'") == 0


def test_a_table_planted_where_create_was_granted_is_refused(owned_empty_db: Database) -> None:
    """A superuser's schema is not enough: whoever holds CREATE on it may plant
    ``runtime_modules``, whose rows the server imports as code."""
    db = owned_empty_db
    db.sql("CREATE SCHEMA aidb_memory")
    db.sql(f"GRANT USAGE, CREATE ON SCHEMA aidb_memory TO {OWNER_USER}")
    db.sql(
        "CREATE TABLE aidb_memory.runtime_modules (name text PRIMARY KEY, "
        "is_package boolean NOT NULL, source text NOT NULL)",
        user=OWNER_USER,
    )
    before = objects_in_schema(db)

    line = refused(run_cli("install", dsn=db.dsn()))
    assert f"CREATE on schema aidb_memory is granted to {OWNER_USER}" in line
    assert f"table aidb_memory.runtime_modules is owned by {OWNER_USER}" in line
    stderr = psql_refused(psql_script(db))
    assert "table aidb_memory.runtime_modules is owned by" in stderr
    installed_nothing(db)
    assert objects_in_schema(db) == before

    # CREATE alone (nothing planted yet) is refused too: it could be used at any later moment.
    db.sql("DROP TABLE aidb_memory.runtime_modules")
    db.sql("REVOKE CREATE ON SCHEMA aidb_memory FROM dbowner_user")
    db.sql("GRANT CREATE ON SCHEMA aidb_memory TO PUBLIC")
    line = refused(run_cli("install", dsn=db.dsn()))
    assert "CREATE on schema aidb_memory is granted to PUBLIC" in line
    installed_nothing(db)


# Each kind of object a role with CREATE on the schema could leave behind (after which CREATE is
# revoked, so the object is the only finding): (statements as the owner, what the finding says).
PLANTED = {
    "view": (
        ["CREATE VIEW aidb_memory.planted AS SELECT 1 AS one"],
        "view aidb_memory.planted is owned by",
    ),
    "sequence": (
        ["CREATE SEQUENCE aidb_memory.planted"],
        "sequence aidb_memory.planted is owned by",
    ),
    "procedure": (
        ["CREATE PROCEDURE aidb_memory.planted() LANGUAGE sql AS $$ SELECT 1 $$"],
        "aidb_memory.planted() is owned by",  # PG 15 describes it as a function
    ),
    "type": (
        ["CREATE TYPE aidb_memory.planted AS ENUM ('a')"],
        "type aidb_memory.planted is owned by",
    ),
    "domain": (
        ["CREATE DOMAIN aidb_memory.planted AS integer"],
        "type aidb_memory.planted is owned by",
    ),
    "operator": (
        [
            "CREATE FUNCTION public.planted_eq(text, text) RETURNS boolean LANGUAGE sql "
            "AS $$ SELECT true $$",
            "CREATE OPERATOR aidb_memory.= (LEFTARG = text, RIGHTARG = text, "
            "FUNCTION = public.planted_eq)",
        ],
        "operator aidb_memory.=(text,text) is owned by",
    ),
    "collation": (
        ['CREATE COLLATION aidb_memory.planted FROM "C"'],
        "collation aidb_memory.planted is owned by",
    ),
    "conversion": (
        ["CREATE CONVERSION aidb_memory.planted FOR 'LATIN1' TO 'UTF8' FROM iso8859_1_to_utf8"],
        "conversion aidb_memory.planted is owned by",
    ),
    "text search configuration": (
        ["CREATE TEXT SEARCH CONFIGURATION aidb_memory.simple (COPY = pg_catalog.simple)"],
        "text search configuration aidb_memory.simple is owned by",
    ),
    "text search dictionary": (
        ["CREATE TEXT SEARCH DICTIONARY aidb_memory.planted (TEMPLATE = pg_catalog.simple)"],
        "text search dictionary aidb_memory.planted is owned by",
    ),
}


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_every_kind_of_planted_object_is_refused(owned_empty_db: Database, kind: str) -> None:
    db = owned_empty_db
    statements, finding = PLANTED[kind]
    db.sql("CREATE SCHEMA aidb_memory")
    db.sql(f"GRANT USAGE, CREATE ON SCHEMA aidb_memory TO {OWNER_USER}")
    with db.connect(OWNER_USER) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
    db.sql(f"REVOKE CREATE ON SCHEMA aidb_memory FROM {OWNER_USER}")

    line = refused(run_cli("install", dsn=db.dsn()))
    assert f"{finding} {OWNER_USER}, not a superuser" in line, line
    assert "CREATE on schema" not in line
    installed_nothing(db)


def test_a_trigger_running_someone_elses_function_is_refused(owned_empty_db: Database) -> None:
    """A table of a superuser's schema can carry a trigger whose function someone else owns
    (whoever was granted TRIGGER on it): that function would run as whoever writes the table."""
    db = owned_empty_db
    db.sql("CREATE SCHEMA aidb_memory")
    db.sql("CREATE TABLE aidb_memory.planted (x int)")
    db.sql(f"GRANT TRIGGER ON aidb_memory.planted TO {OWNER_USER}")
    db.sql(f"GRANT USAGE ON SCHEMA aidb_memory TO {OWNER_USER}")
    with db.connect(OWNER_USER) as conn:
        conn.execute(
            "CREATE FUNCTION public.planted_trigger() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER planted BEFORE INSERT ON aidb_memory.planted "
            "FOR EACH ROW EXECUTE FUNCTION public.planted_trigger()"
        )
    line = refused(run_cli("install", dsn=db.dsn()))
    # pg_describe_object leaves out a schema on the search_path (public, unless it is pinned).
    assert re.search(
        r"trigger planted on table aidb_memory\.planted runs function (public\.)?"
        rf"planted_trigger\(\), owned by {OWNER_USER}, not a superuser",
        line,
    ), line
    installed_nothing(db)


def test_doctor_refuses_an_untrusted_schema_and_reads_nothing_from_it(
    owned_empty_db: Database,
) -> None:
    db = owned_empty_db
    with db.connect(OWNER_USER) as conn:
        conn.execute(PLANTED_FUNCTION)
    result = run_cli("doctor", dsn=db.dsn())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    line = doctor_line(result.stdout, "schema")
    assert line.startswith("refused  schema      schema aidb_memory was not created by install")
    assert "fix: a role that is not a superuser could have put code there" in result.stdout
    # The probe (which reads runtime_settings as a superuser) and the install line never ran.
    assert not re.search(r"^\w+\s+(python|openai|aidb_memory)\s", result.stdout, re.M)
    assert db.value("SELECT count(*) FROM public.ran") == 0


def test_the_python_probe_reads_no_runtime_settings_but_a_superusers_table(
    owned_empty_db: Database,
) -> None:
    """doctor's probe runs as a superuser and adds the directory recorded in runtime_settings to
    sys.path. doctor checks the schema first, but the owner could create it right after: the
    probe itself reads only a table that a superuser owns."""
    db = owned_empty_db
    with db.connect(OWNER_USER) as conn:
        conn.execute(
            """CREATE SCHEMA aidb_memory;
            CREATE TABLE public.ran (who text);
            GRANT INSERT ON public.ran TO PUBLIC;
            CREATE FUNCTION public.spy() RETURNS text LANGUAGE sql AS
            $$ INSERT INTO public.ran VALUES (current_user) RETURNING '/tmp/planted' $$;
            CREATE VIEW aidb_memory.runtime_settings AS
                SELECT 'server_pythonpath'::text AS key, public.spy() AS value"""
        )
    with db.connect() as conn:
        info = probe_server_python(conn)
    assert info["server_pythonpath"] is None
    assert db.value("SELECT count(*) FROM public.ran") == 0


# --- the roles -------------------------------------------------------------------------------


@pytest.fixture
def restore_roles(empty_db: Database) -> Iterator[Database]:
    """Put the cluster-wide roles back as install and conftest left them, whatever a test did."""
    try:
        yield empty_db
    finally:
        with empty_db.connect() as conn:
            for role in ("aidb_users", "aidb_admins", "aidb_workers"):
                conn.execute(
                    f"ALTER ROLE {role} NOLOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB "  # type: ignore[arg-type]
                    "NOREPLICATION NOBYPASSRLS PASSWORD NULL"
                )
            conn.execute("REVOKE pg_read_all_data FROM aidb_workers")
            conn.execute(f"REVOKE aidb_admins, aidb_users FROM {CREATEROLE_USER}")


def assert_roles_refused(db: Database, finding: str) -> None:
    """install (CLI, dry run and psql script) and doctor refuse and change nothing;
    --accept-existing-roles proceeds and prints the finding as a warning."""
    line = refused(run_cli("install", dsn=db.dsn()))
    assert "roles aidb_users, aidb_admins, aidb_workers were changed outside install" in line
    assert finding in line
    assert "--accept-existing-roles" in line  # the hint
    refused(run_cli("install", "--dry-run", dsn=db.dsn()))
    stderr = psql_refused(psql_script(db))
    assert finding in stderr
    assert db.value("SELECT count(*) FROM pg_namespace WHERE nspname = 'aidb_memory'") == 0

    doctor = run_cli("doctor", dsn=db.dsn())
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    roles = doctor_line(doctor.stdout, "roles")
    assert roles.startswith("refused  roles "), doctor.stdout
    assert finding in roles
    accepted = run_cli("doctor", "--accept-existing-roles", dsn=db.dsn())
    assert doctor_line(accepted.stdout, "roles").startswith("ok       roles       accepted")

    dry = ok(run_cli("install", "--dry-run", "--accept-existing-roles", dsn=db.dsn()))
    assert f"warning: {finding}" in dry
    out = ok(run_cli("install", "--accept-existing-roles", dsn=db.dsn()))
    assert f"warning: {finding}" in out.splitlines()
    assert "installed version" in out
    # The script takes the flag too, and says the same as WARNINGs.
    result = psql_script(db, "--accept-existing-roles")
    assert result.returncode == 0, result.stderr
    assert f"WARNING:  01000: aidb_memory: warning: {finding}" in result.stderr


def test_a_worker_role_that_can_log_in_is_refused(restore_roles: Database) -> None:
    db = restore_roles
    db.sql("ALTER ROLE aidb_workers LOGIN PASSWORD 'known-to-the-attacker'", user=CREATEROLE_USER)
    assert_roles_refused(db, "aidb_workers can log in (LOGIN)")


def test_a_worker_role_granted_pg_read_all_data_is_refused(restore_roles: Database) -> None:
    db = restore_roles
    db.sql("GRANT pg_read_all_data TO aidb_workers", user=CREATEROLE_USER)
    assert_roles_refused(
        db, f"aidb_workers is a member of pg_read_all_data (granted by {CREATEROLE_USER})"
    )


def test_a_membership_no_superuser_granted_is_refused(restore_roles: Database) -> None:
    db = restore_roles
    db.sql(f"GRANT aidb_admins TO {CREATEROLE_USER}", user=CREATEROLE_USER)
    assert_roles_refused(
        db,
        f"aidb_admins has member {CREATEROLE_USER} granted by {CREATEROLE_USER}, not a superuser",
    )


def test_an_attribute_is_refused(restore_roles: Database) -> None:
    db = restore_roles
    db.sql("ALTER ROLE aidb_users CREATEDB", user=CREATEROLE_USER)
    line = refused(run_cli("install", dsn=db.dsn()))
    assert "aidb_users may create databases (CREATEDB)" in line


def test_a_member_with_admin_option_is_refused(restore_roles: Database) -> None:
    """Even granted by a superuser: its holder may grant the role to anyone, unchecked."""
    db = restore_roles
    db.sql(f"GRANT aidb_users TO {CREATEROLE_USER} WITH ADMIN OPTION")
    line = refused(run_cli("install", dsn=db.dsn()))
    assert f"aidb_users has member {CREATEROLE_USER} WITH ADMIN OPTION" in line


def test_privileges_held_outside_the_schema_are_refused(owned_empty_db: Database) -> None:
    """What a role holds in this database (pg_shdepend) goes to every member: a database owner
    who grants aidb_users a table of theirs gives it to every application."""
    db = owned_empty_db
    with db.connect(OWNER_USER) as conn:
        conn.execute("CREATE TABLE public.private (x int)")
        conn.execute("GRANT SELECT ON public.private TO aidb_users")
    line = refused(run_cli("install", dsn=db.dsn()))
    assert re.search(r"aidb_users holds privileges on table (public\.)?private\b", line), line
    installed_nothing(db)
    out = ok(run_cli("install", "--accept-existing-roles", dsn=db.dsn()))
    assert re.search(
        r"^warning: aidb_users holds privileges on table (public\.)?private$", out, re.M
    )


# --- what install itself does still passes ----------------------------------------------------


def test_install_reinstall_and_upgrade_pass_their_own_checks(
    empty_db: Database, source_tree: Path
) -> None:
    db = empty_db
    # A superuser may prepare the (empty) schema; roles exist with members a superuser granted
    # (conftest's app_user, admin_user, worker_user; install's aidb_admins in aidb_users).
    db.sql("CREATE SCHEMA aidb_memory")
    db.sql("CREATE ROLE h2_app_role")
    try:
        db.sql("GRANT aidb_users TO h2_app_role")
        out = ok(run_cli("install", dsn=db.dsn()))
        assert "warning" not in out
        assert "installed version" in out
        assert "code is up to date" in ok(run_cli("install", dsn=db.dsn()))
        result = psql_script(db)
        assert result.returncode == 0, result.stderr
        assert "WARNING" not in result.stderr
        (source_tree / "migrations" / "9999_h2_upgrade.sql").write_text(
            "CREATE TABLE aidb_memory.h2_upgrade (x int);\n"
        )
        out = ok(run_cli("install", "--source", str(source_tree), dsn=db.dsn()))
        assert "migration 9999_h2_upgrade applied" in out
        ok(run_cli("verify", "--source", str(source_tree), dsn=db.dsn()))
        doctor = run_cli("doctor", dsn=db.dsn()).stdout
        assert doctor_line(doctor, "schema").startswith("ok ")
        assert doctor_line(doctor, "roles").startswith("ok ")
    finally:
        db.sql("DROP OWNED BY h2_app_role")
        db.sql("DROP ROLE h2_app_role")


# --- the checks themselves resolve nothing through search_path ----------------------------------


def _unqualified(tree: Any, ctes: set[str]) -> Iterator[str]:
    """What in a pglast tree (as a dict) is looked up through search_path."""
    if isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _unqualified(item, ctes)
        return
    if not isinstance(tree, dict):
        return

    def names(nodes: Any) -> list[str]:
        return [n.get("sval", "") for n in nodes or ()]

    kind = tree.get("@")
    if kind == "FuncCall" and names(tree["funcname"])[:1] != ["pg_catalog"]:
        yield f"function {'.'.join(names(tree['funcname']))}"
    if kind == "A_Expr":
        if tree["kind"]["name"] not in ("AEXPR_OP", "AEXPR_OP_ANY", "AEXPR_OP_ALL"):
            yield f"expression {tree['kind']['name']}"
        elif names(tree["name"])[:1] != ["pg_catalog"]:
            yield f"operator {'.'.join(names(tree['name']))}"
    if kind == "TypeName" and names(tree["names"])[:1] != ["pg_catalog"]:
        yield f"type {'.'.join(names(tree['names']))}"
    if kind == "CaseExpr" and tree.get("arg"):
        yield "CASE x WHEN (an implicit =)"
    # x IN (SELECT ...), x = ANY (SELECT ...): an operator looked up through search_path.
    if kind == "SubLink" and tree["subLinkType"]["name"] not in ("EXISTS_SUBLINK", "EXPR_SUBLINK"):
        yield f"sublink {tree['subLinkType']['name']}"
    if (
        kind == "RangeVar"
        and tree.get("schemaname") != "pg_catalog"
        and tree["relname"] not in ctes
    ):
        yield f"relation {tree['relname']}"
    for value in tree.values():
        yield from _unqualified(value, ctes)


def _ctes(tree: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(tree, (list, tuple)):
        for item in tree:
            found |= _ctes(item)
    elif isinstance(tree, dict):
        if tree.get("@") == "CommonTableExpr":
            found.add(tree["ctename"])
        for value in tree.values():
            found |= _ctes(value)
    return found


def _plpgsql_queries(tree: Any) -> Iterator[str]:
    if isinstance(tree, list):
        for item in tree:
            yield from _plpgsql_queries(item)
    elif isinstance(tree, dict):
        for key, value in tree.items():
            if key == "query" and isinstance(value, str):
                yield value
            else:
                yield from _plpgsql_queries(value)


def _statement_trees(sql: str) -> list[Any]:
    return [s(depth=None, skip_none=True) for s in pglast.parse_sql(sql)]


def test_the_checks_qualify_every_function_operator_type_and_relation() -> None:
    """The checks run as a superuser in a database whose owner may set its search_path: every
    name they use is pg_catalog's (or a CTE's), so nothing planted elsewhere can be picked."""
    from aidb_memory.install import trust  # here: the attack tests above must import before the fix

    problems = []
    for query in (trust.SCHEMA_FINDINGS_SQL, trust.ROLE_FINDINGS_SQL):
        trees = _statement_trees(query)
        problems += list(_unqualified(trees, _ctes(trees)))
    steps = trust.trust_steps() + trust.trust_steps(accept_existing_roles=True)
    for step in steps + trust.final_steps():
        assert step.sql.startswith("DO ")
        function = pglast.parse_plpgsql(
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS " + step.sql[len("DO ") :]
        )
        for text in _plpgsql_queries(function):
            expression = text.split(":=", 1)[1] if ":=" in text else text
            if not expression.lstrip().upper().startswith("SELECT"):
                expression = "SELECT " + expression
            trees = _statement_trees(expression)
            problems += [f"{step.what}: {p}" for p in _unqualified(trees, _ctes(trees))]
    assert problems == []
    # The checker itself finds what it should.
    bad = _statement_trees("SELECT coalesce(x, 1) FROM t WHERE a = 1 AND b IN (1) AND f(c)")
    assert sorted(_unqualified(bad, set())) == [
        "expression AEXPR_IN",
        "function f",
        "operator =",
        "relation t",
    ]
