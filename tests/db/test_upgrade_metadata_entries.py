"""Issue 34, bench row (l): an upgrade puts the metadata of the memories a release before it
stored into memory.lexeme_keys (migration 0026), so that a search's filter is answered by the
index for them at once, and bounds the GIN indexes' pending lists. The release is this
repository's tree right before the migration arrived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_upgrade_actor_key import install_tree, tree_before

from conftest import APP_USER, Database

NS = "upgrade_entries"
MIGRATION = "migrations/0026_metadata_entries.sql"


@pytest.fixture(scope="module")
def release_before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tree_before(MIGRATION, tmp_path_factory.mktemp("before-0026"))


def test_metadata_stored_before_the_upgrade_is_in_the_index(
    empty_db: Database, release_before: Path
) -> None:
    db = empty_db
    install_tree(db, release_before)
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    for content, metadata in (
        ("Alice plays the cello", {"topic": "music", "since": {"year": 2019}}),
        ("Alice plays chess", {}),
    ):
        db.sql(
            "SELECT aidb_memory.remember(%s, 'alice', %s, metadata => %s)",
            (NS, content, json.dumps(metadata)),
            user=APP_USER,
        )
    assert (
        db.value("SELECT count(*) FROM aidb_memory.memory WHERE lexeme_keys::text LIKE '%#%'") == 0
    )

    install_tree(db, None)

    assert db.value(
        "SELECT bool_and(lexeme_keys = aidb_memory.actor_lexemes(actor_key, lexemes) "
        "                              || aidb_memory.actor_metadata(actor_key, metadata)) "
        "FROM aidb_memory.memory"
    )
    assert (
        db.value(
            "SELECT array_length(aidb_memory.actor_metadata(actor_key, metadata), 1) "
            "FROM aidb_memory.memory WHERE content = 'Alice plays the cello'"
        )
        == 2
    )
    rows = db.sql(
        "SELECT content FROM aidb_memory.search(%s, 'alice', 'plays', "
        'filter => \'{"since.year": 2019.0, "topic": "music"}\')',
        (NS,),
        user=APP_USER,
    )
    assert rows == [("Alice plays the cello",)]
    limits = db.sql(
        "SELECT c.relname, c.reloptions FROM pg_class c "
        "WHERE c.relname IN ('memory_lexemes_idx', 'memory_word_trgm_idx') ORDER BY 1"
    )
    assert limits == [
        ("memory_lexemes_idx", ["gin_pending_list_limit=256"]),
        ("memory_word_trgm_idx", ["gin_pending_list_limit=256"]),
    ]
