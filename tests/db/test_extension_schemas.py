"""Installs into databases that already have pg_trgm and btree_gin, wherever they are; uninstall
drops only what install created and nothing still in use; a database that applied the first text
of 0005 upgrades (issue 10, item 9). Near duplicates with other identifiers stay apart (item 11).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.types.json import Jsonb

from conftest import ADMIN_USER, APP_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply

NS = "ext"
FIRST_0005 = "6f5d8e2a6763f85670459adab9d8747a017c9bdc39710cff183674c62f4f4cd8"


def ok(result: Any, what: str) -> str:
    assert result.returncode == 0, f"{what}: {result.stdout}{result.stderr}"
    return str(result.stdout) + str(result.stderr)


def extension_schemas(db: Database) -> dict[str, str]:
    rows = db.sql(
        "SELECT e.extname, n.nspname FROM pg_extension e "
        "JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname IN ('pg_trgm', 'btree_gin')"
    )
    return {str(name): str(schema) for name, schema in rows}


def ops(*texts: str) -> str:
    return json.dumps({"operations": [{"op": "add", "text": t, "target": None} for t in texts]})


def extract(db: Database, fake: FakeOpenAI, actor: str, *facts: str) -> None:
    """One event per fact; the fake model extracts the fact from it; one worker run."""
    for fact in facts:
        turns = [{"role": "user", "content": f"Remember: {fact}"}]
        db.sql("SELECT aidb_memory.add(%s, %s, %s)", (NS, actor, Jsonb(turns)), user=APP_USER)
    fake.queue(*(Reply(content=ops(fact)) for fact in facts))
    with db.connect(WORKER_USER) as worker:
        row = worker.execute("CALL aidb_memory.process_events(max_events => 100)").fetchone()
    assert row is not None and int(row[0]) == len(facts), row


def current(db: Database, actor: str) -> list[str]:
    rows = db.sql(
        "SELECT content FROM aidb_memory.memory WHERE actor_id = %s AND valid_to IS NULL "
        "ORDER BY id",
        (actor,),
    )
    return [str(r[0]) for r in rows]


def with_model(db: Database, fake: FakeOpenAI) -> None:
    opts = Jsonb({"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0})
    with db.connect(ADMIN_USER) as admin:
        admin.execute("SELECT aidb_memory.create_model('chat', 'openai', %s)", (opts,))
        admin.execute("SELECT aidb_memory.init(%s, %s)", (NS, Jsonb({"llm": "chat"})))


# --- item 11: near duplicates ---------------------------------------------------------------


def test_facts_with_other_numbers_are_not_near_duplicates(db: Database, fake: FakeOpenAI) -> None:
    """The issue's example (trigram similarity 0.875): two facts; a near duplicate naming the
    same identifiers is still stored once."""
    a, b = "Alice's order number is 4417.", "Alice's order number is 4418."
    same = "Alice's order number is now 4417."
    assert db.value("SELECT pg_catalog.similarity(%s, %s)", (a, b)) >= 0.8
    assert db.value("SELECT pg_catalog.similarity(%s, %s)", (a, same)) >= 0.8
    with_model(db, fake)
    extract(db, fake, "alice", a, b, same)
    assert current(db, "alice") == [a, b]
    # Dates, emails and versions too.
    facts = [
        "Alice's flight leaves on 2026-03-05 at 14:30.",
        "Alice's flight leaves on 2026-03-06 at 14:30.",
        "Alice's work email is alice.smith@example.com.",
        "Alice's work email is alice.smyth@example.com.",
        "Alice's laptop runs version 1.2.3 of the app.",
        "Alice's laptop runs version 1.2.4 of the app.",
    ]
    extract(db, fake, "bob", *facts)
    assert current(db, "bob") == facts


# --- item 9: extensions in any schema ---------------------------------------------------------


@pytest.mark.parametrize("schema", ["public", 'Odd "ext"'])
def test_install_uses_the_extensions_where_they_are_and_uninstall_keeps_them(
    empty_db: Database, fake: FakeOpenAI, server_pylib: Path, schema: str
) -> None:
    db = empty_db
    with db.connect() as conn:
        conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
        for ext in ("pg_trgm", "btree_gin"):
            conn.execute(
                pgsql.SQL("CREATE EXTENSION {} WITH SCHEMA {}").format(
                    pgsql.Identifier(ext), pgsql.Identifier(schema)
                )
            )
    ok(run_cli("install", dsn=db.dsn()), "install")
    assert extension_schemas(db) == {"pg_trgm": schema, "btree_gin": schema}
    # The trigram index uses pg_trgm's opclass, in its schema.
    opclasses = db.sql(
        "SELECT n.nspname, c.opcname FROM pg_index i "
        "JOIN pg_opclass c ON c.oid = i.indclass[1] "
        "JOIN pg_namespace n ON n.oid = c.opcnamespace "
        "WHERE i.indexrelid = 'aidb_memory.memory_word_trgm_idx'::regclass"
    )
    assert opclasses == [(schema, "gin_trgm_ops")]
    created = "SELECT key FROM aidb_memory.runtime_settings WHERE key IN (%s, %s)"
    assert db.sql(created, ("created_pg_trgm", "created_btree_gin")) == []

    # The application's objects that use them work: reconciliation (similarity) and search's
    # near words (the % operator, through the trigram index).
    db.sql(
        "INSERT INTO aidb_memory.runtime_settings (key, value) VALUES ('server_pythonpath', %s)",
        (str(server_pylib),),
    )
    with_model(db, fake)
    extract(db, fake, "alice", "Alice's order number is 4417.", "Alice's order number is 4418.")
    extract(db, fake, "alice", "Alice's order number is now 4417.")
    assert current(db, "alice") == [
        "Alice's order number is 4417.",
        "Alice's order number is 4418.",
    ]
    found = db.sql(
        "SELECT content FROM aidb_memory.search(%s, %s, %s) ORDER BY content",
        (NS, "alice", "ordre nubmer"),
        user=APP_USER,
    )
    assert [r[0] for r in found] == [
        "Alice's order number is 4417.",
        "Alice's order number is 4418.",
    ]
    ok(run_cli("verify", dsn=db.dsn()), "verify")
    ok(run_cli("install", dsn=db.dsn()), "a second install")

    out = ok(run_cli("uninstall", "--yes", dsn=db.dsn()), "uninstall")
    assert "pg_trgm" not in out and "btree_gin" not in out, out
    assert extension_schemas(db) == {"pg_trgm": schema, "btree_gin": schema}


def test_uninstall_drops_the_extensions_it_created_unless_something_uses_them(
    empty_db: Database,
) -> None:
    db = empty_db
    ok(run_cli("install", dsn=db.dsn()), "install")
    assert extension_schemas(db) == {"pg_trgm": "pg_catalog", "btree_gin": "pg_catalog"}
    # Someone else's trigram index, made after install.
    db.sql("CREATE TABLE public.words (w text)")
    db.sql("CREATE INDEX ON public.words USING gin (w pg_catalog.gin_trgm_ops)")
    out = ok(run_cli("uninstall", "--yes", dsn=db.dsn()), "uninstall")
    assert "kept extension pg_trgm: still used" in out
    assert "dropped extension btree_gin" in out
    assert extension_schemas(db) == {"pg_trgm": "pg_catalog"}


def test_a_database_that_applied_the_first_text_of_0005_upgrades(db: Database) -> None:
    """The corrected 0005 supersedes the text first released: a database that applied that text
    (recorded with its checksum) is neither refused nor migrated again."""
    db.sql(
        "UPDATE aidb_memory.schema_migrations SET checksum = %s WHERE name = '0005_memories'",
        (FIRST_0005,),
    )
    out = ok(run_cli("install", dsn=db.dsn()), "install")
    assert "migration 0005_memories skipped (already applied)" in out
    assert "edited" not in ok(run_cli("status", dsn=db.dsn()), "status")
    ok(run_cli("verify", dsn=db.dsn()), "verify")
    # Any other checksum is still an edit.
    db.sql(
        "UPDATE aidb_memory.schema_migrations SET checksum = %s WHERE name = '0005_memories'",
        ("0" * 64,),
    )
    refused = run_cli("install", dsn=db.dsn())
    assert refused.returncode != 0
    assert "0005_memories.sql was edited after it was applied" in refused.stdout + refused.stderr


def test_without_pg_trgm_search_says_so_and_works_again_once_it_is_back(db: Database) -> None:
    """pg_trgm dropped behind our back (CASCADE takes the trigram index): search's near words
    fail with 55000 naming search and the fix; once it is created again (elsewhere), search works
    on the same connection (the schema is looked up again until found)."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,), user=ADMIN_USER)
    db.sql("DROP EXTENSION pg_trgm CASCADE")
    search = "SELECT count(*) FROM aidb_memory.search(%s, %s, %s)"
    with db.connect(APP_USER) as app:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as info:
            app.execute(search, (NS, "alice", "ordre"))
        diag = info.value.diag
        assert str(diag.message_primary).startswith("aidb_memory.search: the pg_trgm extension")
        assert "CREATE EXTENSION pg_trgm" in str(diag.message_hint)
        db.sql("CREATE EXTENSION pg_trgm WITH SCHEMA public")
        assert app.execute(search, (NS, "alice", "ordre")).fetchone() == (0,)
