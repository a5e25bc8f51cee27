"""Issue 13: the stored bytecode is code the server runs, so nobody but install may write it.

``aidb_memory.runtime_bytecode`` holds the marshalled code of every server-side module; a backend
loads a row as the module (``marshal.loads`` then ``exec``, as the function owner). A role that
could write a row would run its own code as the owner in every caller's backend, and marshal
data is not safe to load from an untrusted source at all. So: no role but the owner has any
privilege on the table; a row is used only for a module of ``runtime_modules`` (a planted name
is never importable) and only as the compiled form of the source stored now.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, NO_GRANT_USER, OWNER_USER, WORKER_USER, Database

ATTEMPTS = (
    "SELECT code FROM aidb_memory.runtime_bytecode LIMIT 1",
    "UPDATE aidb_memory.runtime_bytecode SET code = '\\x00'::bytea",
    "INSERT INTO aidb_memory.runtime_bytecode (name, magic, python, source_md5, code) "
    "VALUES ('aidb_memory_server.evil', '\\x00'::bytea, '3', '', '\\x00'::bytea)",
    "DELETE FROM aidb_memory.runtime_bytecode",
    "TRUNCATE aidb_memory.runtime_bytecode",
)


def _state(db: Database) -> list[tuple[Any, ...]]:
    return db.sql("SELECT name, md5(code), magic, source_md5 FROM aidb_memory.runtime_bytecode")


@pytest.mark.parametrize("user", [APP_USER, ADMIN_USER, WORKER_USER, NO_GRANT_USER, OWNER_USER])
def test_no_role_but_the_owner_can_read_or_write_the_bytecode(
    owned_db: Database, user: str
) -> None:
    # owned_db: the database (and schema public) belong to dbowner_user, who is no superuser.
    before = _state(owned_db)
    assert before, "install stored bytecode"
    for attempt in ATTEMPTS:
        with owned_db.connect(user) as conn, pytest.raises(psycopg.Error) as info:
            conn.execute(attempt)
        assert info.value.sqlstate == "42501", f"{attempt!r} as {user}: {info.value}"
    assert _state(owned_db) == before


def test_the_table_grants_nothing_and_belongs_to_a_superuser(db: Database) -> None:
    owner_is_superuser, grantees = db.sql(
        "SELECT r.rolsuper, (SELECT array_agg(DISTINCT a.grantee = c.relowner) "
        "                    FROM aclexplode(c.relacl) AS a) "
        "FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
        "WHERE c.oid = 'aidb_memory.runtime_bytecode'::regclass"
    )[0]
    assert owner_is_superuser
    assert grantees in (None, [True]), "a privilege for a role other than the owner"


def test_bytecode_of_a_module_that_is_not_stored_is_never_imported(db: Database) -> None:
    # Even a superuser's planted row: only the names of runtime_modules are importable.
    db.sql(
        "DO LANGUAGE plpython3u $$\nimport marshal, importlib.util\n"
        "plan = plpy.prepare('INSERT INTO aidb_memory.runtime_bytecode "
        "(name, magic, python, source_md5, code) VALUES ($1, $2, $3, $4, $5)', "
        "['text', 'bytea', 'text', 'text', 'bytea'])\n"
        "plpy.execute(plan, ['aidb_memory_server.planted', importlib.util.MAGIC_NUMBER, '3', "
        "'', marshal.dumps(compile('PLANTED = True', 'x', 'exec'))])$$"
    )
    with db.connect() as conn:
        conn.execute("SELECT aidb_memory.runtime_info()")  # loads the code in this backend
        with pytest.raises(psycopg.Error, match=r"No module named 'aidb_memory_server\.planted'"):
            conn.execute("DO LANGUAGE plpython3u $$\nimport aidb_memory_server.planted$$")
