"""The harness itself: a cloned database has aidb_memory, the roles work."""

from aidb_memory import __version__
from conftest import APP_USER, Database


def test_clone_has_the_schema_installed(db: Database) -> None:
    assert db.value("SELECT aidb_memory.version()") == __version__
    assert db.value("SELECT aidb_memory.version()", user=APP_USER) == __version__
