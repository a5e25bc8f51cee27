"""A backend's first call (issue 13, acceptance 4): it loads only what it needs, from bytecode that
install compiled with the server's Python, and never a stale or foreign bytecode.

Every PL/Python function and DO block of one backend shares one interpreter, so a DO block run as
the superuser on the connection that made a call sees that call's ``sys.modules``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from conftest import Database, run_cli
from fake_openai import FakeOpenAI, Reply

NS = "firsts"
MODULE = "aidb_memory_server.introspection"
# What a read or an add must not load: the model client and everything that only a model call,
# extraction or a conversion needs.
NEVER_ON_READ_OR_ADD = (
    "openai",
    "aidb_memory_server.llm",
    "aidb_memory_server.extraction",
    "aidb_memory_server.compactor",
    "aidb_memory_server.eventqueue",
    "aidb_memory_server.memories",
)
# What a read (session_get) must not load either: these cost a first call milliseconds each
# (json's decoder imports re, which imports enum).
NEVER_ON_READ = (
    *NEVER_ON_READ_OR_ADD,
    "typing",
    "dataclasses",
    "json",
    "re",
    "enum",
    "collections",
    "functools",
    "aidb_memory_server.turns",
    "aidb_memory_server.adding",
)


def _modules(conn: psycopg.Connection[Any]) -> set[str]:
    """The modules loaded in ``conn``'s backend (a DO block: ``conn`` must be a superuser's)."""
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    # Names joined by spaces: importing json here would hide whether the call loaded it.
    conn.execute("DO LANGUAGE plpython3u $$\nimport sys\nplpy.notice(' '.join(sys.modules))$$")
    return set(seen[-1].split())


def _turns(text: str) -> str:
    return json.dumps([{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}])


def _setup(db: Database, config: dict[str, Any] | None = None, llm: str | None = None) -> None:
    spec = {"llm": llm} if llm else {}
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(spec), json.dumps(config or {})),
    )
    db.sql("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, _turns("hello")))


def test_a_first_read_then_a_first_add_load_no_model_code(db: Database) -> None:
    _setup(db)
    with db.connect() as conn:
        conn.execute(
            "SELECT * FROM aidb_memory.session_get(%s, 'alice', 's', limit_chars => 8000)", (NS,)
        ).fetchall()
        # The common read: planned by PL/pgSQL (session_read_plan_sql), no module of ours loaded.
        after_plain_read = _modules(conn)
        # limit_items: planned by the PL/Python code.
        conn.execute(
            "SELECT * FROM aidb_memory.session_get(%s, 'alice', 's', limit_items => 8)", (NS,)
        ).fetchall()
        after_read = _modules(conn)
        # Plain messages: written by PL/pgSQL (sql/31_add_fast.sql), no module of ours loaded.
        conn.execute("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, _turns("more")))
        after_plain_add = _modules(conn)
        # A named turn is the PL/Python code's.
        named = json.dumps([{"role": "user", "content": "more", "name": "bob"}])
        conn.execute("SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, named))
        after_add = _modules(conn)
    assert sorted(m for m in after_plain_read if m.startswith("aidb_memory_server")) == []
    assert "aidb_memory_server.sessions" in after_read, "the read really ran our code"
    assert sorted(after_read & set(NEVER_ON_READ)) == []
    assert "aidb_memory_server.adding" not in after_plain_add
    assert after_plain_add - after_read == set(), after_plain_add - after_read
    assert "aidb_memory_server.turns" in after_add, "the add really ran our code"
    assert sorted(after_add & set(NEVER_ON_READ_OR_ADD)) == []


def test_a_compacting_read_imports_the_model_client_once_per_backend(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    _setup(db, llm="chat")
    for i in range(12):
        db.sql(
            "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')", (NS, _turns("x" * 200 + str(i)))
        )
    fake.queue(Reply(content="S" * 100), Reply(content="T" * 100))
    read = "SELECT warnings FROM aidb_memory.session_get(%s, 'alice', 's', limit_chars => 1000)"
    identity = (
        "DO LANGUAGE plpython3u $$\nimport sys\n"
        "plpy.notice(str(id(sys.modules['openai'])) if 'openai' in sys.modules else 'none')$$"
    )
    with db.connect() as conn:
        seen: list[str] = []
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute(identity)
        assert seen[-1] == "none"
        conn.execute(read, (NS,)).fetchall()
        assert len(fake.calls()) == 1
        conn.execute(identity)
        first = seen[-1]
        assert first != "none", "the model call imported the client"
        for i in range(12):
            conn.execute(
                "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, 's')",
                (NS, _turns("y" * 200 + str(i))),
            )
        conn.execute(read, (NS,)).fetchall()
        assert len(fake.calls()) == 2
        conn.execute(identity)
        assert seen[-1] == first, "the second model call of the backend imported nothing again"


def _bytecode(db: Database) -> dict[str, tuple[bytes, str, str]]:
    return {
        r[0]: (bytes(r[1]), r[2], r[3])
        for r in db.sql(
            "SELECT b.name, b.magic, b.source_md5, md5(m.source) "
            "FROM aidb_memory.runtime_bytecode b JOIN aidb_memory.runtime_modules m USING (name)"
        )
    }


def _server_magic(db: Database) -> bytes:
    with db.connect() as conn:
        seen: list[str] = []
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute(
            "DO LANGUAGE plpython3u $$\nimport importlib.util\n"
            "plpy.notice(importlib.util.MAGIC_NUMBER.hex())$$"
        )
    return bytes.fromhex(seen[-1])


def test_install_stores_bytecode_of_every_module_for_the_servers_python(db: Database) -> None:
    modules = {r[0] for r in db.sql("SELECT name FROM aidb_memory.runtime_modules")}
    stored = _bytecode(db)
    assert set(stored) == modules
    magic = _server_magic(db)
    for name, (row_magic, row_md5, source_md5) in stored.items():
        assert row_magic == magic, name
        assert row_md5 == source_md5, name


def _plant(db: Database, replace: str, by: str) -> None:
    """Store as MODULE's bytecode the code of its source with ``replace`` replaced, compiled in
    the server under the same name, keeping the row's magic and source md5: a backend that loads
    it shows the change (so the change shows which of bytecode and source a backend ran)."""
    db.sql(
        "DO LANGUAGE plpython3u $$\nimport marshal\n"
        'src = plpy.execute("SELECT source FROM aidb_memory.runtime_modules '
        f"WHERE name = '{MODULE}'\")[0]['source']\n"
        f"assert {replace!r} in src\n"
        f"code = compile(src.replace({replace!r}, {by!r}), "
        f"'<aidb_memory.runtime_modules:{MODULE}>', 'exec')\n"
        "plan = plpy.prepare('UPDATE aidb_memory.runtime_bytecode SET code = $1 WHERE name = $2', "
        "['bytea', 'text'])\n"
        f"plpy.execute(plan, [marshal.dumps(code), '{MODULE}'])$$"
    )


def _info(db: Database) -> dict[str, Any]:
    # A new connection: a new backend, which loads the code again.
    return dict(db.value("SELECT aidb_memory.runtime_info()::json"))


def _info_of(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute("SELECT aidb_memory.runtime_info()::json").fetchone()
    assert row is not None
    return dict(row[0])


PLANTED = ('"generation": rt.generation', '"generation": "from-bytecode"')


def test_a_backend_runs_the_stored_bytecode(db: Database) -> None:
    generation = _info(db)["generation"]
    _plant(db, *PLANTED)
    assert _info(db)["generation"] == "from-bytecode"
    # The bytecode counts only as the compiled form of the source stored now.
    db.sql(
        "UPDATE aidb_memory.runtime_modules SET source = source || E'\\n# edited\\n' "
        "WHERE name = %s",
        (MODULE,),
    )
    assert _info(db)["generation"] == generation, "bytecode of another source is not used"


def test_bytecode_of_another_python_is_ignored(db: Database) -> None:
    generation = _info(db)["generation"]
    _plant(db, *PLANTED)
    db.sql(
        "UPDATE aidb_memory.runtime_bytecode SET magic = '\\x00000d0a'::bytea WHERE name = %s",
        (MODULE,),
    )
    assert _info(db)["generation"] == generation


def test_unreadable_bytecode_falls_back_to_the_source_and_install_repairs_it(db: Database) -> None:
    generation = _info(db)["generation"]
    db.sql(
        "UPDATE aidb_memory.runtime_bytecode SET code = '\\xdeadbeef'::bytea WHERE name = %s",
        (MODULE,),
    )
    assert _info(db)["generation"] == generation
    out = run_cli("install", dsn=db.dsn())
    assert out.returncode == 0, out.stderr
    assert "compiled 1 server-side modules" in out.stdout + out.stderr
    assert db.value(
        "SELECT code <> '\\xdeadbeef'::bytea FROM aidb_memory.runtime_bytecode WHERE name = %s",
        (MODULE,),
    )
    assert _info(db)["generation"] == generation


def test_install_recompiles_an_edited_module_and_drops_bytecode_of_removed_ones(
    db: Database,
) -> None:
    db.sql(
        "UPDATE aidb_memory.runtime_modules SET source = source || E'\\n# edited\\n' "
        "WHERE name = %s",
        (MODULE,),
    )
    db.sql(
        "INSERT INTO aidb_memory.runtime_bytecode (name, magic, python, source_md5, code) "
        "VALUES ('aidb_memory_server.planted', '\\x00'::bytea, '0', '', '\\x00'::bytea)"
    )
    out = run_cli("install", dsn=db.dsn())
    assert out.returncode == 0, out.stderr
    stored = _bytecode(db)
    assert "aidb_memory_server.planted" not in {
        r[0] for r in db.sql("SELECT name FROM aidb_memory.runtime_bytecode")
    }
    # Install restored the module's source and compiled bytecode for it.
    assert stored[MODULE][1] == stored[MODULE][2]


def test_a_second_install_compiles_nothing(db: Database) -> None:
    before = db.sql("SELECT name, xmin::text FROM aidb_memory.runtime_bytecode ORDER BY 1")
    out = run_cli("install", dsn=db.dsn())
    assert out.returncode == 0, out.stderr
    assert "compiled" not in out.stdout + out.stderr
    assert db.sql("SELECT name, xmin::text FROM aidb_memory.runtime_bytecode ORDER BY 1") == before


def test_an_upgrade_compiles_the_changed_module_and_open_connections_run_it(
    db: Database, source_tree: Path
) -> None:
    # A new package (a changed module: a new code generation), installed while a connection
    # that has loaded the old code stays open.
    path = source_tree / "plpython" / "aidb_memory_server" / "introspection.py"
    path.write_text(path.read_text().replace(*PLANTED))
    old = _bytecode(db)
    with db.connect() as conn:
        before = _info_of(conn)
        out = run_cli("install", "--source", str(source_tree), dsn=db.dsn())
        assert out.returncode == 0, out.stderr
        assert "compiled 1 server-side modules" in out.stdout + out.stderr
        after = _info_of(conn)
    assert before["generation"] != "from-bytecode"
    assert after["generation"] == "from-bytecode", "the open connection loaded the new code"
    new = _bytecode(db)
    assert new[MODULE][1] == new[MODULE][2] != old[MODULE][1], "compiled from the new source"
    assert {n: v for n, v in new.items() if n != MODULE} == {
        n: v for n, v in old.items() if n != MODULE
    }, "the other modules' bytecode is still valid and was kept"
