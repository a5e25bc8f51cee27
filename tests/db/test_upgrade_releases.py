"""Issue 23: an upgrade from any earlier release reaches the catalog of a fresh install, object by
object, and today's API works on the old data.

The releases are this repository's own history: 0.1.0 (the commit that added sessions,
migrations/0002_sessions.sql), the first-parent commit of main right before each later migration
arrived, and :data:`LAST_RELEASE_BEFORE_ISSUE_23`. Each is checked out as a git worktree,
installed by its own installer (its own CLI, sql/, migrations/ and plpython/), given data through
its own API, then upgraded by this package.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_upgrade_actor_key import TOOLS  # the same tool round, one definition

from aidb_memory.install import catalog
from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer
from conftest import (
    APP_USER,
    REPO,
    Database,
    SqlDatabase,
    _create_database,
    _drop_database,
    run_cli,
)

# The last release that landed before this issue: today's migrations, but the installer whose
# clean-up dropped nothing (so it is the one whose leftovers matter most).
LAST_RELEASE_BEFORE_ISSUE_23 = "6c7c8c9"
FIRST_RELEASE_MIGRATION = "0002_sessions.sql"  # 0.1.0, "Issue 3: sessions"
NS = "upgrade_ns"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout


def _releases() -> list[tuple[str, str]]:
    """(commit, subject) of every release migrations/ can upgrade from, oldest first."""
    history = _git("rev-list", "--first-parent", "--reverse", "HEAD").split()
    # Where each migration first appears on main's first-parent line (several arrived through
    # merges, some of them out of numbering order).
    arrived: dict[str, int] = {}
    for i, commit in enumerate(history):
        for path in _git("ls-tree", "--name-only", commit, "migrations/").split():
            arrived.setdefault(path.removeprefix("migrations/"), i)
    names = sorted(arrived)
    first = names.index(FIRST_RELEASE_MIGRATION)
    commits = [history[arrived[FIRST_RELEASE_MIGRATION]]]
    commits += [history[arrived[name] - 1] for name in names[first + 1 :]]
    commits.append(_git("rev-parse", f"{LAST_RELEASE_BEFORE_ISSUE_23}^{{commit}}").strip())
    unique = list(dict.fromkeys(commits))
    unique.sort(key=history.index)
    return [(c, _git("log", "-1", "--format=%s", c).strip()) for c in unique]


def _release_params() -> list[Any]:
    try:
        releases = _releases()
    except (subprocess.CalledProcessError, FileNotFoundError, ValueError) as e:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no git history: {e}"))]
    return [
        pytest.param(commit, id=f"{commit[:7]}-{re.sub(r'[^A-Za-z0-9]+', '-', subject)[:48]}")
        for commit, subject in releases
    ]


def _objects(db: Database) -> dict[tuple[str, str, str], str]:
    """catalog.QUERY's rows, both parts: (part, kind, name) -> detail."""
    return {(part, kind, name): detail for part, kind, name, detail in db.sql(catalog.QUERY)}


@pytest.fixture(scope="module")
def fresh(pg_server: ThrowawayServer, template_db: Database) -> Iterator[Database]:
    """A fresh install of this package (once per module), to compare each upgrade with."""
    db = _create_database(pg_server, "template0")
    try:
        with db.connect(autocommit=False) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.commit()
        yield db
    finally:
        _drop_database(db)


@pytest.fixture
def release(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The release's tree, as a worktree of this repository (removed afterwards)."""
    commit: str = request.param
    path = tmp_path / f"release-{commit[:7]}"
    _git("worktree", "add", "--detach", str(path), commit)
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path))


def _install_release(db: SqlDatabase, tree: Path) -> None:
    # The release's own installer: its aidb_memory package first on the path, so that its CLI
    # runs its own sql/, migrations/ and plpython/ (every release's installer runs with this
    # venv's psycopg, so no release needs today's installer as a fallback).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "DATABASE_URL"}
    env["PYTHONPATH"] = str(tree / "src")
    result = subprocess.run(
        [sys.executable, "-m", "aidb_memory", "install", "--dsn", db.dsn()],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert db.value("SELECT to_regclass('aidb_memory.schema_migrations')") is not None


def _has(db: Database, signature: str) -> bool:
    return bool(db.value("SELECT to_regprocedure(%s) IS NOT NULL", (signature,)))


def _fill(db: Database) -> None:
    """Data through the release's own API, as an application uses it: what the release has."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,))

    def add(actor: str, session: str | None, turns: list[dict[str, Any]]) -> None:
        db.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s, 'agent-1')",
            (NS, actor, json.dumps(turns), session),
            user=APP_USER,
        )

    for actor in ("alice", "bob"):
        add(
            actor,
            "s1",
            [
                {"role": "user", "content": f"hello, I am {actor}"},
                {"role": "assistant", "content": "hello!"},
            ],
        )
        add(actor, "s1", TOOLS)
        add(actor, "s2", [{"role": "user", "content": "a second conversation"}])
        add(actor, None, [{"role": "user", "content": "I moved to Porto"}])
    if _has(db, "aidb_memory.session_end(text, text, text, text)"):
        db.sql(
            "SELECT * FROM aidb_memory.session_end(%s, 'alice', 's2', 'notes')",
            (NS,),
            user=APP_USER,
        )
    if _has(db, "aidb_memory.session_start(text, text, text, text)"):
        db.sql(
            "SELECT * FROM aidb_memory.session_start(%s, 'alice', 'agent-1', 's3')",
            (NS,),
            user=APP_USER,
        )


def _columns(db: Database, table: str) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "pg_get_expr(d.adbin, d.adrelid), a.attacl::text, col_description(a.attrelid, a.attnum) "
        "FROM pg_attribute a "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table,),
    )


def _out_of_order(tree: Path) -> bool:
    """Whether the release lacks a migration numbered below one it has: its upgrade applies that
    one after the later ones, so ALTER TABLE ADD COLUMN puts columns in another order than a
    fresh install does (f1b3d92 had 0011 but not 0010, which arrived on main after it)."""
    have = sorted(p.name for p in (tree / "migrations").glob("*.sql"))
    today = sorted(p.name for p in (REPO / "migrations").glob("*.sql"))
    return have != today[: len(have)]


def _catalog_diff(fresh: Database, upgraded: Database, column_order_may_differ: bool) -> list[str]:
    """Every object that only one side has, or that differs, in words."""
    want, have = _objects(fresh), _objects(upgraded)
    out = [f"only after the upgrade: {p}: {k} {n}" for p, k, n in sorted(have.keys() - want.keys())]
    out += [
        f"only in a fresh install: {p}: {k} {n}" for p, k, n in sorted(want.keys() - have.keys())
    ]
    for key in sorted(want.keys() & have.keys()):
        part, kind, name = key
        if want[key] == have[key]:
            continue
        if kind in ("table", "privileges of table"):
            before, after = _columns(fresh, name), _columns(upgraded, name)
            if column_order_may_differ and sorted(before) == sorted(after):
                continue
            out.append(f"differs: {part}: {kind} {name}: fresh {before} upgraded {after}")
        else:
            out.append(f"differs: {part}: {kind} {name}")
    return out


def _app_reads(db: Database) -> None:
    """Today's API on the release's data, as the application role."""

    def sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
        return db.sql(query, params, user=APP_USER)

    for actor in ("alice", "bob"):
        items = sql("SELECT items FROM aidb_memory.session_get(%s, %s, 's1', 3000)", NS, actor)
        contents = [i.get("content") for i in items[0][0]]
        assert f"hello, I am {actor}" in contents and "Sunny and 24 degrees." in contents, items
        messages = sql("SELECT aidb_memory.session_messages(%s, %s, 's1', 3000)", NS, actor)
        assert messages[0][0][-1]["content"] == "Sunny and 24 degrees.", messages
        tool_calls = [m for m in messages[0][0] if m.get("tool_calls")]
        assert tool_calls and tool_calls[0]["tool_calls"][0]["id"] == "call_1", messages
        sessions = {r[0] for r in sql("SELECT session_id FROM aidb_memory.session_list(%s, %s)",
                                      NS, actor)}  # fmt: skip
        assert {"s1", "s2"} <= sessions, sessions
        sql("SELECT aidb_memory.search(%s, %s, 'Porto')", NS, actor)
        sql("SELECT aidb_memory.list_memories(%s, %s)", NS, actor)
    sql(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's1')",
        NS,
        json.dumps([{"role": "user", "content": "still here"}]),
    )
    items = sql("SELECT items FROM aidb_memory.session_get(%s, 'alice', 's1', 3000)", NS)[0][0]
    assert items[-1]["content"] == "still here", items


@pytest.mark.parametrize("release", _release_params(), indirect=True)
def test_an_upgrade_from_a_release_reaches_a_fresh_install(
    empty_db: Database, release: Path, fresh: Database
) -> None:
    db = empty_db
    _install_release(db, release)
    _fill(db)

    with db.connect(autocommit=False) as conn:
        install(conn, Package.load(), say=lambda _line: None)
        conn.commit()

    diff = _catalog_diff(fresh, db, _out_of_order(release))
    assert not diff, "the upgraded catalog is not a fresh install's:\n" + "\n".join(diff)
    _app_reads(db)
    result = run_cli("verify", dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
