"""install, status, verify and uninstall against one database."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql as pgsql

from aidb_memory import __version__
from aidb_memory.connection import CliError, first_line, require_plpython, require_superuser
from aidb_memory.install import backfill, catalog, trust
from aidb_memory.install import citus as citus_layer
from aidb_memory.install.codebundle import CodeBundle, load_bundle
from aidb_memory.install.migrations import Migration, load_migrations
from aidb_memory.install.script import (
    INSTALL_LOCK_KEY,
    NOTICE_PREFIX,
    PINNED_SEARCH_PATH,
    build,
    defined,
    extras_query,
    record_migration,
)
from aidb_memory.install.sources import SourceTree, default_tree
from aidb_memory.install.steps import SCHEMA, Step
from aidb_memory.progress import Reporter

Connection = psycopg.Connection[tuple[Any, ...]]
ROLES = ("aidb_users", "aidb_admins", "aidb_workers")


@dataclass(frozen=True)
class Package:
    """What this package would install: migrations and the idempotent code bundle."""

    migrations: list[Migration]
    bundle: CodeBundle

    @classmethod
    def load(cls, tree: SourceTree | None = None) -> Package:
        tree = tree or default_tree()
        return cls(load_migrations(tree.migrations_dir), load_bundle(tree))

    def steps(self, *, accept_existing_roles: bool = False, pgvector: bool = True) -> list[Step]:
        return build(
            self.migrations,
            self.bundle,
            accept_existing_roles=accept_existing_roles,
            pgvector=pgvector,
        )


@dataclass
class State:
    """What a database has installed, read without changing anything."""

    installed: bool
    version: str | None = None
    applied: dict[str, str] = field(default_factory=dict)  # name -> checksum
    settings: dict[str, str] = field(default_factory=dict)
    catalog_fingerprint: str | None = None
    # The catalog as it is now, in catalog.QUERY's lines, for the code part and the schema part.
    catalog: dict[str, str] = field(default_factory=dict)
    # Stored server-side modules: name -> (is_package, md5 of the source).
    modules: dict[str, tuple[bool, str]] = field(default_factory=dict)
    # Functions, views and triggers that the package read_state was given does not define:
    # (kind, name) as in catalog.QUERY's lines.
    extras: list[tuple[str, str]] = field(default_factory=list)


def pin_search_path(conn: Connection) -> None:
    """Pin the search_path for the rest of the connection's transaction.

    The CLI's connections are pinned from the start (``connection.connect``); a library caller
    may pass a connection of its own, on which a database-level search_path could put another
    role's functions and operators before pg_catalog's. Statements that run before this (or in
    autocommit, where it lasts one statement) qualify every name themselves."""
    conn.execute("SELECT pg_catalog.set_config('search_path', %s, true)", (PINNED_SEARCH_PATH,))


def read_state(conn: Connection, package: Package | None = None) -> State:
    """Read the installed state; a database without the schema reads as not installed. With a
    package, also the functions, views and triggers of the schema that it does not define
    (with the query install drops them with)."""
    pin_search_path(conn)
    exists = conn.execute(
        "SELECT pg_catalog.to_regclass('aidb_memory.schema_migrations') IS NOT NULL, "
        "pg_catalog.to_regclass('aidb_memory.runtime_settings') IS NOT NULL"
    ).fetchone()
    if not exists or not exists[0]:
        return State(installed=False)
    # Before reading a table that could be anybody's view. Checked once the schema is known to
    # exist: a trusted schema stays trusted (only a superuser can change it), so nothing can be
    # swapped in between this check and the reads below.
    trust.require_trusted_schema(conn)
    applied: dict[str, str] = dict(
        conn.execute("SELECT name, checksum FROM aidb_memory.schema_migrations").fetchall()
    )
    settings: dict[str, str] = {}
    if exists[1]:
        settings = dict(
            conn.execute("SELECT key, value FROM aidb_memory.runtime_settings").fetchall()
        )
    fingerprint = None
    has_fn = conn.execute(
        "SELECT pg_catalog.to_regprocedure('aidb_memory.catalog_fingerprint()') IS NOT NULL"
    ).fetchone()
    if has_fn and has_fn[0]:
        row = conn.execute("SELECT aidb_memory.catalog_fingerprint()").fetchone()
        fingerprint = row[0] if row else None
    current = {}
    for part in (catalog.CODE, catalog.SCHEMA_PART):
        row = conn.execute(catalog.lines_query(part)).fetchone()
        current[part] = row[0] if row else ""
    modules: dict[str, tuple[bool, str]] = {}
    if conn.execute(
        "SELECT pg_catalog.to_regclass('aidb_memory.runtime_modules') IS NOT NULL"
    ).fetchone() == (True,):
        rows = conn.execute(
            "SELECT name, is_package, pg_catalog.md5(pg_catalog.convert_to(source, 'UTF8')) "
            "FROM aidb_memory.runtime_modules"
        ).fetchall()
        modules = {name: (is_package, digest) for name, is_package, digest in rows}
    extras: list[tuple[str, str]] = []
    if package is not None:
        rows = conn.execute(extras_query(defined(package.bundle)).encode()).fetchall()
        extras = [(kind, name) for kind, name, _statement in rows]
    return State(
        True, settings.get("version"), applied, settings, fingerprint, current, modules, extras
    )


@dataclass
class Report:
    """How the database compares with the package."""

    applied: list[str]
    pending: list[str]
    problems: list[str]
    code_current: bool


def compare(state: State, package: Package) -> Report:
    """Applied and pending migrations, and every kind of drift, in words."""
    known = {m.name: m for m in package.migrations}
    problems = []
    for name, checksum in sorted(state.applied.items()):
        if name not in known:
            problems.append(
                f"migration {name} is applied but unknown to this package ({__version__})"
            )
        elif checksum not in known[name].accepted:
            problems.append(f"migration {name}.sql was edited after it was applied")
    pending = [m.name for m in package.migrations if m.name not in state.applied]
    code_current = (
        state.installed and state.settings.get("code_checksum") == package.bundle.checksum
    )
    if state.installed:
        problems += _code_drift(state, package)
        if not code_current:
            problems.append(
                f"installed code is version {state.version or 'unknown'}, not this package's "
                f"{__version__} (generation {package.bundle.generation}); run `aidb-memory install`"
            )
        problems += _schema_drift(state)
    applied = [n for n in sorted(state.applied) if n in known]
    return Report(applied, pending, problems, code_current)


def _module_drift(state: State, package: Package) -> list[str]:
    want = {
        m.name: (m.is_package, catalog.module_line(m.name, m.is_package, m.source).split(":")[-1])
        for m in package.bundle.modules
    }
    out = []
    for name in sorted(want.keys() | state.modules.keys()):
        if name not in state.modules:
            out.append(f"server-side module {name} is missing from runtime_modules")
        elif name not in want:
            out.append(f"server-side module {name} in runtime_modules is not this package's")
        elif want[name] != state.modules[name]:
            out.append(f"server-side module {name} differs from this package's (edited by hand?)")
    return out


def _code_drift(state: State, package: Package) -> list[str]:
    """Stored modules against the package; functions, views and triggers that the package's sql/
    does not define, whatever install recorded (install drops them); functions, views,
    privileges and triggers against what install recorded right after applying this package's
    sql/ (install restores them)."""
    restore = "; `aidb-memory install` restores it"
    out = [p + restore for p in _module_drift(state, package)]
    out += [
        f"{kind} {name} is not part of this package; `aidb-memory install` drops it"
        for kind, name in state.extras
    ]
    recorded = state.settings.get("catalog_code")
    if recorded is None:
        out.append(
            "the catalog of functions, views and triggers was not recorded by this version; "
            "run `aidb-memory install`"
        )
    else:
        changes = catalog.differences(recorded, state.catalog[catalog.CODE], catalog.CODE)
        # An extra not recorded is also a difference from the record: named once, above.
        named = {f"{kind} {name} is not part of aidb_memory" for kind, name in state.extras}
        out += [c + restore for c in changes if c not in named]
    return out


def _schema_drift(state: State) -> list[str]:
    """Tables, columns, indexes, constraints and types against what migrations created (as the
    last install recorded them): install cannot recreate these."""
    recorded = state.settings.get("catalog_schema")
    if recorded is None:
        return [
            "the schema made by migrations was not recorded by this version; "
            "run `aidb-memory install`"
        ]
    changes = catalog.differences(recorded, state.catalog[catalog.SCHEMA_PART], "schema")
    hint = (
        "; install does not recreate what migrations create: recreate it as migrations/ "
        "define it, or drop it if it is not part of aidb_memory"
    )
    return [c + hint for c in changes]


def code_is_current(state: State, package: Package) -> bool:
    """What the install script decides: the code part needs no re-apply."""
    return (
        state.installed
        and state.settings.get("code_checksum") == package.bundle.checksum
        and not _code_drift(state, package)
    )


def _require_no_transaction(conn: Connection, action: str) -> None:
    """Install and uninstall roll back their read-only checks before their own transaction;
    never let that silently discard a caller's uncommitted work."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise CliError(
            f"aidb-memory: {action} runs in a transaction of its own; "
            "commit or roll back the connection's transaction first"
        )


def preflight(conn: Connection) -> None:
    require_superuser(conn, "install")
    require_plpython(conn)


def install(
    conn: Connection,
    package: Package,
    *,
    say: Callable[[str], None],
    dry_run: bool = False,
    accept_existing_roles: bool = False,
    citus: bool = False,
    pgvector: bool = True,
    progress: Reporter | None = None,
    batch_rows: int = backfill.BATCH_ROWS,
) -> None:
    """Install or upgrade in one transaction; ``say`` receives one line per thing done.

    ``progress`` reports the rows done of the migrations' backfills (run in batches of
    ``batch_rows`` rows: :mod:`aidb_memory.install.backfill`); None reports nothing.

    Refuses (:class:`CliError`, ``aidb-memory: install refused: ...``) a schema or roles that
    :mod:`aidb_memory.install.trust` does not trust; the roles are only warned about with
    ``accept_existing_roles``. With ``citus``, a database without the citus extension is refused
    before anything is done, and after the install every table not distributed yet is
    distributed (:func:`aidb_memory.install.citus.distribute`, in a transaction of its own). Without
    ``pgvector``, embeddings stay real[] even where pgvector is available (script.vector_step);
    a database that moved to pgvector stays there."""
    _require_no_transaction(conn, "install")
    pin_search_path(conn)
    preflight(conn)
    if citus and not dry_run:
        citus_layer.require(conn)
    if dry_run:
        _dry_run(conn, package, say, accept_existing_roles)
        conn.rollback()
        if citus:
            citus_layer.distribute(conn, say=say, dry_run=True)
        return
    # The checks above opened a read-only transaction; the install must be a transaction of its
    # own (not a savepoint in the caller's), so that its lock and its changes end together.
    conn.rollback()

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""  # NOTICEs, and the WARNINGs of accepted roles
        if message.startswith(NOTICE_PREFIX):
            say(message[len(NOTICE_PREFIX) :])

    conn.add_notice_handler(on_notice)
    try:
        with conn.transaction():
            # The script's first step pins the search_path (a SET: a query here would take the
            # snapshot before the script's SET TRANSACTION ISOLATION LEVEL).
            steps = package.steps(accept_existing_roles=accept_existing_roles, pgvector=pgvector)
            reporter = progress or Reporter(mode="never")
            for step in steps:
                try:
                    _run_step(conn, step, reporter, batch_rows)
                except psycopg.Error as e:
                    refused = trust.refusal_line(e)
                    if refused:
                        raise CliError(refused) from e
                    hint = e.diag.message_hint
                    raise CliError(
                        f"aidb-memory: install failed at {step.what}: {first_line(e)}"
                        + (f" (hint: {hint})" if hint else "")
                    ) from e
    finally:
        conn.remove_notice_handler(on_notice)
    if citus:
        citus_layer.distribute(conn, say=say)


def _run_step(conn: Connection, step: Step, reporter: Reporter, batch_rows: int) -> None:
    """One step of the script; a pending migration with backfills statement by statement, its
    backfills in batches with progress (in the install's transaction: a failure rolls back the
    whole migration, its record included, and the next install runs it again)."""
    m = step.migration
    if m is None or not m.backfills:
        conn.execute(step.sql.encode())
        return
    applied = conn.execute(
        f"SELECT 1 FROM {SCHEMA}.schema_migrations WHERE name = %s", (m.name,)
    ).fetchone()
    if applied:
        conn.execute(step.sql.encode())  # says it is skipped
        return
    for index, statement in enumerate(m.statements):
        if index in m.backfills:
            backfill.run(
                conn,
                statement,
                what=f"migration {m.name}",
                reporter=reporter,
                batch_rows=batch_rows,
            )
        else:
            conn.execute(statement.encode())
    conn.execute(record_migration(m).encode())


def _dry_run(
    conn: Connection, package: Package, say: Callable[[str], None], accept_existing_roles: bool
) -> None:
    # The same refusals as the script's, before anything is read from the schema.
    schema = trust.schema_findings(conn)
    if schema:
        raise CliError(
            f"aidb-memory: install refused: {trust.SCHEMA_WHAT}: {trust.summary(schema)} "
            f"(hint: {trust.SCHEMA_HINT})"
        )
    roles = trust.role_findings(conn)
    if roles and not accept_existing_roles:
        raise CliError(
            f"aidb-memory: install refused: {trust.ROLE_WHAT}: {trust.summary(roles)} "
            f"(hint: {trust.ROLE_HINT})"
        )
    state = read_state(conn, package)
    report = compare(state, package)
    for problem in report.problems:
        if "edited" in problem or "unknown to this package" in problem:
            raise CliError(f"aidb-memory: {problem}")
    say("dry run: nothing will be changed")
    for finding in roles:
        say(f"warning: {finding}")
    if not state.installed:
        say(f"would create schema {SCHEMA} and the installer's tables")
    for name in report.applied:
        say(f"migration {name} skipped (already applied)")
    for name in report.pending:
        say(f"would apply migration {name}")
    schema = _schema_drift(state) if state.installed else []
    if schema and state.settings.get("catalog_schema") is not None:
        raise CliError(f"aidb-memory: install would fail: {schema[0]}")
    if code_is_current(state, package):
        say(f"code is up to date (version {__version__}, generation {package.bundle.generation})")
    else:
        b = package.bundle
        say(f"would store {len(b.modules)} server-side modules (generation {b.generation})")
        for f in b.sql_files:
            say(f"would apply sql/{f.name}")
        say(f"would record version {__version__}")


def uninstall(conn: Connection, *, say: Callable[[str], None]) -> None:
    """Drop the schema, then the roles and plpython3u where nothing else uses them."""
    _require_no_transaction(conn, "uninstall")
    pin_search_path(conn)
    require_superuser(conn, "uninstall")
    # Like install: a transaction of its own, under the installers' lock.
    conn.rollback()
    with conn.transaction():
        pin_search_path(conn)
        conn.execute("SELECT pg_catalog.pg_advisory_xact_lock(%s)", (INSTALL_LOCK_KEY,))
        state = read_state(conn)
        created_plpython = state.settings.get("created_plpython3u") == "true"
        created_extensions = [
            name
            for name in ("btree_gin", "pg_trgm", "vector")
            if state.settings.get(f"created_{name}") == "true"
        ]
        schema = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) %s",
            (SCHEMA,),
        ).fetchone()
        if schema:
            conn.execute(pgsql.SQL("DROP SCHEMA {} CASCADE").format(pgsql.Identifier(SCHEMA)))
            say(f"dropped schema {SCHEMA} and everything in it")
        else:
            say(f"schema {SCHEMA} does not exist in this database")
        for name in created_extensions:
            _drop_if_unused(conn, say, "EXTENSION", name)
        if created_plpython:
            _drop_if_unused(conn, say, "EXTENSION", "plpython3u")
        for role in ROLES:
            exists = conn.execute(
                "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) %s",
                (role,),
            ).fetchone()
            if exists:
                _drop_if_unused(conn, say, "ROLE", role)


def _drop_if_unused(conn: Connection, say: Callable[[str], None], kind: str, name: str) -> None:
    statement = pgsql.SQL("DROP {} {}").format(pgsql.SQL(kind), pgsql.Identifier(name))
    try:
        with conn.transaction():
            conn.execute(statement)
        say(f"dropped {kind.lower()} {name}")
    except psycopg.errors.DependentObjectsStillExist as e:
        say(f"kept {kind.lower()} {name}: still used ({first_line(e)})")
