"""Attack: pg_trgm and btree_gin in schema public, which the database's owner controls (issue 10,
item 9, with issue 9's search_path rules).

pg_trgm and btree_gin are trusted extensions: a database owner who is not a superuser may create
them (their objects are then the bootstrap superuser's, the extension the owner's). Install now
uses them where they are, so the owner of public may plant look-alikes of pg_trgm's similarity()
and % beside the real ones, with other argument types, and make public come first in the
database's search_path. Our statements name pg_trgm's schema and call with the exact argument
types (text, text), so none of the look-alikes may ever run. And the owner may add functions of
their own to the extension: install refuses an extension with a member it cannot trust.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from conftest import ADMIN_USER, APP_USER, OWNER_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply

PINNED = "-c search_path=pg_catalog,pg_temp"
NS = "trapped"
_TRAP = """
CREATE FUNCTION public.trap_fire() RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_catalog.nextval('public.trap_seq'::pg_catalog.regclass);
    RAISE EXCEPTION 'trap ran as %', current_user;
END
$$
"""
# Look-alikes of what our SQL uses of pg_trgm, with argument types that an unqualified or
# loosely typed call could pick.
_TYPES = ["text", "character varying", "name", "character", '"char"']


def _look_alike(args: str, result: str, name: str) -> str:
    return (
        f"CREATE FUNCTION {name}({args}) RETURNS {result} LANGUAGE plpgsql IMMUTABLE AS $t$\n"
        "BEGIN PERFORM public.trap_fire(); RETURN NULL; END $t$"
    )


def pinned(db: Database, user: str = "postgres") -> psycopg.Connection[Any]:
    return psycopg.connect(db.dsn(user), autocommit=True, options=PINNED)


def ok(result: Any, what: str) -> str:
    assert result.returncode == 0, f"{what}: {result.stdout}{result.stderr}"
    return str(result.stdout) + str(result.stderr)


def plant(db: Database) -> int:
    """As the database's owner: both extensions in public, look-alikes beside them, and public
    first in the database's search_path. How many look-alikes were planted."""
    planted = 0
    with pinned(db, OWNER_USER) as conn:
        conn.execute("CREATE EXTENSION pg_trgm WITH SCHEMA public")
        conn.execute("CREATE EXTENSION btree_gin WITH SCHEMA public")
        conn.execute("CREATE SEQUENCE public.trap_seq")
        conn.execute("GRANT USAGE ON SEQUENCE public.trap_seq TO PUBLIC")
        conn.execute(_TRAP)
        for i, left in enumerate(_TYPES):
            for j, right in enumerate(_TYPES):
                if (left, right) == ("text", "text"):
                    continue  # pg_trgm's own: the owner cannot replace it
                conn.execute(_look_alike(f"{left}, {right}", "real", "public.similarity"))
                fn = f"public.trap_op_{i}_{j}"
                conn.execute(_look_alike(f"{left}, {right}", "boolean", fn))
                conn.execute(
                    f"CREATE OPERATOR public.% (LEFTARG = {left}, RIGHTARG = {right}, "
                    f"FUNCTION = {fn})"
                )
                planted += 2
        conn.execute(
            pgsql.SQL("ALTER DATABASE {} SET search_path = public, pg_catalog").format(
                pgsql.Identifier(db.name)
            )
        )
    return planted


def fired(db: Database) -> bool:
    with pinned(db) as conn:
        row = conn.execute(
            "SELECT last_value IS NOT NULL FROM pg_catalog.pg_sequences "
            "WHERE schemaname OPERATOR(pg_catalog.=) 'public' "
            "AND sequencename OPERATOR(pg_catalog.=) 'trap_seq'"
        ).fetchone()
    assert row is not None
    return bool(row[0])


def extract(db: Database, fake: FakeOpenAI, actor: str, *facts: str) -> None:
    for fact in facts:
        turns = [{"role": "user", "content": f"Remember: {fact}"}]
        db.sql("SELECT aidb_memory.add(%s, %s, %s)", (NS, actor, Jsonb(turns)), user=APP_USER)
    fake.queue(
        *(
            Reply(content=json.dumps({"operations": [{"op": "add", "text": f, "target": None}]}))
            for f in facts
        )
    )
    with db.connect(WORKER_USER) as worker:
        worker.execute("CALL aidb_memory.process_events(max_events => 100)")


def test_pg_trgm_in_the_owners_public_runs_none_of_the_owners_look_alikes(
    owned_empty_db: Database, fake: FakeOpenAI, server_pylib: Path
) -> None:
    db = owned_empty_db
    assert plant(db) > 40
    ok(run_cli("install", dsn=db.dsn()), "install")
    assert not fired(db), "install ran a look-alike"
    # pg_trgm's functions are a superuser's though the owner made the extension.
    owners = db.sql(
        "SELECT DISTINCT r.rolsuper FROM pg_catalog.pg_depend d "
        "JOIN pg_catalog.pg_proc p ON p.oid = d.objid "
        "JOIN pg_catalog.pg_roles r ON r.oid = p.proowner "
        "WHERE d.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'pg_trgm') "
        "AND d.deptype = 'e' AND d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass"
    )
    assert owners == [(True,)]
    db.sql(
        "INSERT INTO aidb_memory.runtime_settings (key, value) VALUES ('server_pythonpath', %s)",
        (str(server_pylib),),
    )
    opts = Jsonb({"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0})
    with db.connect(ADMIN_USER) as admin:
        admin.execute("SELECT aidb_memory.create_model('chat', 'openai', %s)", (opts,))
        admin.execute("SELECT aidb_memory.init(%s, %s)", (NS, Jsonb({"llm": "chat"})))
    # Reconciliation calls similarity(); the worker runs as aidb_workers and as the superuser.
    extract(db, fake, "alice", "Alice's order number is 4417.", "Alice's order number is 4418.")
    extract(db, fake, "alice", "Alice's order number is now 4417.")
    assert not fired(db), "the worker ran a look-alike"
    with pinned(db) as conn:
        rows = conn.execute(
            "SELECT content FROM aidb_memory.memory WHERE valid_to IS NULL ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == [
        "Alice's order number is 4417.",
        "Alice's order number is 4418.",
    ]
    # Search's near words use %, on a connection with the database's (hostile) search_path.
    with db.connect(APP_USER) as app:
        assert app.execute("SHOW search_path").fetchone() == ("public, pg_catalog",)
        found = app.execute(
            "SELECT content FROM aidb_memory.search(%s, %s, %s)", (NS, "alice", "ordre nubmer")
        ).fetchall()
    assert len(found) == 2
    assert not fired(db), "search ran a look-alike"
    ok(run_cli("uninstall", "--yes", dsn=db.dsn()), "uninstall")
    assert not fired(db), "uninstall ran a look-alike"


def test_an_extension_with_a_member_of_the_owners_is_refused(owned_empty_db: Database) -> None:
    db = owned_empty_db
    with pinned(db, OWNER_USER) as conn:
        conn.execute("CREATE EXTENSION pg_trgm WITH SCHEMA public")
        conn.execute(
            "CREATE FUNCTION public.similarity_of_mine(text) RETURNS real LANGUAGE sql "
            "IMMUTABLE RETURN 1"
        )
        conn.execute("ALTER EXTENSION pg_trgm ADD FUNCTION public.similarity_of_mine(text)")
    refused = run_cli("install", dsn=db.dsn())
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out
    assert f"a function of extension pg_trgm is owned by role {OWNER_USER}, not a superuser" in out
    assert "DROP EXTENSION" in out
    assert db.sql("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'aidb_memory'") == []
