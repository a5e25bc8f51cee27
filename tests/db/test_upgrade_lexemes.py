"""Issue 24, item 3: an upgrade computes what the new ranking needs for the memories a release
before it stored (migration 0018: memory.lexemes), so that they are found by stemmed words at
once. The release is this repository's tree right before the migration arrived."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_upgrade_actor_key import install_tree, tree_before

from conftest import APP_USER, Database

NS = "upgrade_lexemes"
MIGRATION = "migrations/0018_lexemes.sql"


@pytest.fixture(scope="module")
def release_before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tree_before(MIGRATION, tmp_path_factory.mktemp("before-0018"))


def test_memories_stored_before_the_upgrade_are_found_by_their_stems(
    empty_db: Database, release_before: Path
) -> None:
    db = empty_db
    install_tree(db, release_before)
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for content in ("Alice travelled to Kyoto last spring", "Alice plays the cello"):
        db.sql("SELECT aidb_memory.remember(%s, 'alice', %s)", (NS, content), user=APP_USER)
    assert db.value("SELECT to_regclass('aidb_memory.memory_lexemes_idx')") is None

    install_tree(db, None)

    assert db.value(
        "SELECT bool_and(lexemes = to_tsvector('english', content)) FROM aidb_memory.memory"
    )
    rows = db.sql(
        "SELECT content FROM aidb_memory.search(%s, 'alice', 'Where did Alice go travelling?')",
        (NS,),
        user=APP_USER,
    )
    assert rows[0][0] == "Alice travelled to Kyoto last spring"
    assert db.value("SELECT to_regclass('aidb_memory.memory_lexemes_idx')") is not None
