"""The namespace's text search configuration (issue 24, config.text_search_config): what search
stems and leaves out, per namespace; memories re-indexed when it changes; only pg_catalog's."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, Database

NS = "languages"


def _init(db: Database, config: dict[str, Any], name: str = NS) -> None:
    db.sql("SELECT aidb_memory.init(%s, '{}', %s::jsonb)", (name, json.dumps(config)))


def _remember(db: Database, content: str, name: str = NS) -> None:
    db.sql("SELECT aidb_memory.remember(%s, 'anna', %s)", (name, content), user=APP_USER)


def _search(db: Database, query: str, name: str = NS) -> list[str]:
    rows = db.sql(
        "SELECT content FROM aidb_memory.search(%s, 'anna', %s)", (name, query), user=APP_USER
    )
    return [r[0] for r in rows]


def test_english_by_default_stems_and_drops_stop_words(db: Database) -> None:
    _init(db, {})
    _remember(db, "Anna travelled to Kyoto for the cherry blossoms")
    _remember(db, "Anna went to the dentist on Monday")
    # "travelling" and "travelled" share the stem travel; "when", "did", "to" count for nothing.
    assert _search(db, "When did Anna go travelling?")[0].startswith("Anna travelled")
    assert db.value(
        "SELECT lexemes = to_tsvector('english', content) FROM aidb_memory.memory LIMIT 1"
    )


def test_a_german_namespace_finds_german_inflections(db: Database) -> None:
    _init(db, {"text_search_config": "german"})
    _remember(db, "Anna wohnt mit ihren Katzen in einem kleinen Haus")
    _remember(db, "Anna arbeitet bei der Bahn")
    assert _search(db, "Welche Katze hat Anna?")[0] == (
        "Anna wohnt mit ihren Katzen in einem kleinen Haus"
    )
    # The same words under english: "Katze" and "Katzen" are two words, and only the near-word
    # guess (one letter away, at half weight) finds the cats.
    _init(db, {}, name="english_ns")
    _remember(db, "Anna wohnt mit ihren Katzen in einem kleinen Haus", name="english_ns")
    german = db.sql(
        "SELECT score FROM aidb_memory.search(%s, 'anna', 'Katze')", (NS,), user=APP_USER
    )
    english = db.sql(
        "SELECT score FROM aidb_memory.search('english_ns', 'anna', 'Katze')", user=APP_USER
    )
    assert german[0][0] > english[0][0]


def test_simple_keeps_every_word_as_written(db: Database) -> None:
    _init(db, {"text_search_config": "simple"})
    _remember(db, "The Who played in Leeds")
    _remember(db, "Anna plays the piano")
    # Under english "the" and "who" are stop words: the query would have no words.
    assert _search(db, "the who") == ["The Who played in Leeds", "Anna plays the piano"]


def test_a_change_of_configuration_reindexes_the_namespace_memories(db: Database) -> None:
    _init(db, {"text_search_config": "simple"})
    _init(db, {"text_search_config": "simple"}, name="other")
    _remember(db, "Anna likes to fly to Kyoto")
    _remember(db, "Anna likes to fly to Lima", name="other")
    # simple: no stems, and "fly" is neither one edit from "flies" nor close by trigrams.
    assert _search(db, "flies") == []
    db.sql(
        'SELECT aidb_memory.namespace_update(%s, config => \'{"text_search_config": "english"}\')',
        (NS,),
        user=ADMIN_USER,
    )
    assert _search(db, "flies") == ["Anna likes to fly to Kyoto"]
    # Another namespace keeps its own configuration and its index.
    assert _search(db, "flies", name="other") == []
    stale = db.value(
        """SELECT count(*) FROM aidb_memory.memory m JOIN aidb_memory.namespace n
               ON n.id = m.namespace_id
           WHERE m.lexemes <> to_tsvector(
               ('pg_catalog.' || coalesce(n.config->>'text_search_config', 'english'))::regconfig,
               m.content)"""
    )
    assert stale == 0
    # Back to the default (null resets the key): re-indexed again.
    db.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"text_search_config\": null}')",
        (NS,),
        user=ADMIN_USER,
    )
    assert db.value(
        "SELECT lexemes = to_tsvector('english', content) FROM aidb_memory.memory "
        "WHERE content = 'Anna likes to fly to Kyoto'"
    )


def test_a_configuration_outside_pg_catalog_is_refused(db: Database) -> None:
    # A superuser could create one in public; a namespace may still not name it: what memory.lexemes
    # holds must be made by the server's own code.
    db.sql("CREATE TEXT SEARCH CONFIGURATION public.mine (COPY = pg_catalog.english)")
    with pytest.raises(psycopg.Error) as info:
        _init(db, {"text_search_config": "mine"})
    assert info.value.sqlstate == "22023"
    assert "names no text search configuration of pg_catalog" in str(info.value)


_TRUE_COUNTS = """
SELECT m.actor_key, m.namespace_id, m.actor_id, l.lexeme, count(*)::int
FROM aidb_memory.memory m
CROSS JOIN LATERAL unnest(array_append(tsvector_to_array(m.lexemes), '')) AS l(lexeme)
WHERE m.valid_to IS NULL
GROUP BY 1, 2, 3, 4
ORDER BY 1, 2, 3, 4
"""
_KEPT_COUNTS = """
SELECT actor_key, namespace_id, actor_id, lexeme, memories FROM aidb_memory.memory_lexeme
ORDER BY 1, 2, 3, 4
"""


def test_the_word_counts_follow_every_write_close_reindex_and_erasure(db: Database) -> None:
    """memory_lexeme (BM25's statistics) equals a count over the current memories after each
    kind of change, and erasure leaves no count behind."""
    _init(db, {})
    _init(db, {}, name="other")
    for content in (
        "Anna likes green tea",
        "Anna likes black tea and tea cakes",
        "Anna lives in Lyon",
    ):
        _remember(db, content)
    _remember(db, "Anna likes green tea", name="other")
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)
    # Closed (superseded): no longer counted.
    db.sql("UPDATE aidb_memory.memory SET valid_to = now() WHERE content = 'Anna lives in Lyon'")
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)
    # Re-indexed under another configuration.
    db.sql(
        'SELECT aidb_memory.namespace_update(%s, config => \'{"text_search_config": "simple"}\')',
        (NS,),
        user=ADMIN_USER,
    )
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)
    # Deleted, then the actor forgotten: nothing of theirs is left in the counts.
    db.sql(
        "SELECT aidb_memory.delete(%s, 'anna', %s::jsonb, 'test')",
        (NS, json.dumps({"ids": [_id(db, "Anna likes green tea")]})),
        user=APP_USER,
    )
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)
    db.sql("SELECT aidb_memory.forget(%s, 'anna', 'test')", (NS,), user=APP_USER)
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)
    assert {r[1] for r in db.sql(_KEPT_COUNTS)} == {
        db.value("SELECT id FROM aidb_memory.namespace WHERE name = 'other'")
    }
    db.sql("SELECT aidb_memory.namespace_drop('other', 'test')", user=ADMIN_USER)
    assert db.sql(_KEPT_COUNTS) == []


def _id(db: Database, content: str) -> str:
    return str(
        db.value(
            "SELECT public_id::text FROM aidb_memory.memory "
            "WHERE namespace_id = (SELECT id FROM aidb_memory.namespace WHERE name = %s) "
            "AND content = %s",
            (NS, content),
        )
    )
