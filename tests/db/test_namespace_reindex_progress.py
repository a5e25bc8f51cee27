"""Issue 36, item 6: namespace_update re-indexing a namespace's memories (a change of
text_search_config) tells the caller how far it got, as NOTICEs (psql prints them on stderr): at
most one per aidb_memory.progress_interval seconds and none for work shorter than that; the
batches it works in write what the one statement wrote."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from test_text_search_config import _KEPT_COUNTS, _TRUE_COUNTS

from conftest import ADMIN_USER, Database

NS = "reindexed"
MEMORIES = 2500  # batches of 1,000 memories (namespaces._REINDEX_BATCH): 3


def _memories(db: Database, name: str, count: int) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (name,))
    db.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, content, content_hash, lexemes, valid_to)
           SELECT aidb_memory.actor_key(n.name, a.actor), n.id, a.actor, c.content,
                  md5(c.content), to_tsvector('english', c.content),
                  CASE WHEN i %% 9 = 0 THEN now() END
           FROM aidb_memory.namespace AS n
           CROSS JOIN generate_series(1, %s) AS i
           CROSS JOIN LATERAL (SELECT 'actor-' || i %% 7 AS actor) AS a
           CROSS JOIN LATERAL (SELECT format('The %%s travellers were flying to city %%s',
                                             i, i %% 31) AS content) AS c
           WHERE n.name = %s""",
        (count, name),
    )


def _update(db: Database, config: str, *settings: str) -> list[str]:
    """namespace_update of the namespace's text_search_config, as an admin; its NOTICEs."""
    notices: list[str] = []
    with db.connect(ADMIN_USER) as conn:

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            notices.append(diag.message_primary or "")

        conn.add_notice_handler(on_notice)
        for setting in settings:
            conn.execute(setting)
        conn.execute(
            "SELECT aidb_memory.namespace_update(%s, config => %s::jsonb)",
            (NS, json.dumps({"text_search_config": config})),
        )
    return notices


def _indexed_as(db: Database, name: str, config: str) -> Any:
    return db.value(
        "SELECT bool_and(m.lexemes = to_tsvector(%s::regconfig, m.content)) "
        "FROM aidb_memory.memory m JOIN aidb_memory.namespace n ON n.id = m.namespace_id "
        "WHERE n.name = %s",
        (config, name),
    )


def test_a_reindex_reports_memories_done_of_total_and_writes_what_one_statement_does(
    db: Database,
) -> None:
    _memories(db, NS, MEMORIES)
    _memories(db, "bystander", 50)

    notices = _update(db, "simple", "SET aidb_memory.progress_interval = 0")

    what = f'aidb_memory.namespace_update: re-indexing namespace "{NS}": '
    assert [n.split(" memories")[0] for n in notices] == [
        what + "1,000 of 2,500",
        what + "2,000 of 2,500",
        what + "done, 2,500",
    ], notices
    assert notices[0].startswith(what + "1,000 of 2,500 memories (40%), ")
    assert "memories/s" in notices[0] and "left" in notices[0]
    assert notices[1].startswith(what + "2,000 of 2,500 memories (80%), ")
    # Every memory of the namespace once, with simple's lexemes; the other namespace untouched;
    # BM25's counts (kept by the row triggers) as a count over the memories says.
    assert _indexed_as(db, NS, "simple")
    assert _indexed_as(db, "bystander", "english")
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)
    assert db.value(
        "SELECT count(*) FROM aidb_memory.memory m JOIN aidb_memory.namespace n "
        "ON n.id = m.namespace_id WHERE n.name = %s",
        (NS,),
    ) == (MEMORIES)


@pytest.mark.parametrize(
    "settings",
    [
        (),  # the default interval (5 s): this re-index takes less
        ("SET aidb_memory.progress_interval = 0", "SET client_min_messages = warning"),
    ],
)
def test_short_work_or_client_min_messages_warning_gets_no_notice(
    db: Database, settings: tuple[str, ...]
) -> None:
    _memories(db, NS, MEMORIES)
    assert _update(db, "simple", *settings) == []
    assert _indexed_as(db, NS, "simple")
    assert db.sql(_KEPT_COUNTS) == db.sql(_TRUE_COUNTS)


def test_a_small_namespace_is_reindexed_in_one_statement_without_notices(db: Database) -> None:
    _memories(db, NS, 999)
    assert _update(db, "german", "SET aidb_memory.progress_interval = 0") == []
    assert _indexed_as(db, NS, "german")
