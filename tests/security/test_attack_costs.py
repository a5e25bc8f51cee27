"""Issue 9, acceptance 6: every single call of an application role has a bounded cost.

The attacker is ``app_user`` (aidb_users only). Measured before the caps: a 16,000-char search of
or-joined words ran 29.7 s against 200 memories, 17,576 distinct short words more than 30 s; one
add of 1,000 turns of 100,000 chars took 5.3 s and 1.2 GB; one add of 100 such turns sent the
model a 10 MB extraction request. Each cap refuses with 22023 and a hint naming its config key,
before anything is stored and before any model is called; what is accepted is bounded by the
caps. Costs are asserted by structure (refused, how much reached the model), never by the clock:
the ``statement_timeout`` below only keeps a run against the old code from hanging.
"""

from __future__ import annotations

import itertools
import json
import string
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "costs"
ACTOR = "alice"
# Enough for every call below on the hardened code, far below what the attacks cost without it.
GUARD = "SET statement_timeout = '20s'"


def _namespace(db: Database, spec: dict[str, Any] | None = None, **config: Any) -> None:
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(spec or {}), json.dumps(config)),
        user=ADMIN_USER,
    )


def _memories(
    db: Database, n: int, embedding: list[float] | None = None, model: str | None = None
) -> None:
    """``n`` memories of the actor, as the worker writes them (words from a small vocabulary)."""
    words = ["tea", "coffee", "lyon", "oslo", "peanuts", "falafel", "chess", "piano", "nurse"]
    db.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, content, content_hash, embedding,
                embedding_model, lexemes)
           SELECT aidb_memory.actor_key(%s, %s),
                  (SELECT id FROM aidb_memory.namespace WHERE name = %s), %s, x.c,
                  md5(i::text), %s::real[], %s, to_tsvector('english', x.c)
           FROM generate_series(1, %s) AS i,
                LATERAL (SELECT 'The user likes ' || (%s::text[])[1 + i %% 9] || ' and ' ||
                         (%s::text[])[1 + (i / 9) %% 9] || ' number ' || i AS c) AS x""",
        (NS, ACTOR, NS, ACTOR, embedding, model, n, words, words),
    )


def _call(db: Database, sql: str, params: Any, user: str = APP_USER) -> list[tuple[Any, ...]]:
    with db.connect(user) as conn:
        conn.execute(GUARD)
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _refused(db: Database, sql: str, params: Any, user: str = APP_USER) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        _call(db, sql, params, user)
    return info.value


def _search(db: Database, query: str) -> list[tuple[Any, ...]]:
    return _call(db, "SELECT id, content FROM aidb_memory.search(%s, %s, %s)", (NS, ACTOR, query))


def _search_refused(db: Database, query: str) -> psycopg.Error:
    return _refused(
        db, "SELECT id, content FROM aidb_memory.search(%s, %s, %s)", (NS, ACTOR, query)
    )


def _short_words(n: int) -> list[str]:
    """``n`` distinct three-letter words: aaa, aab, ... (17,576 of them at most)."""
    return [
        "".join(w) for w in itertools.islice(itertools.product(string.ascii_lowercase, repeat=3), n)
    ]


# --- search -------------------------------------------------------------------------------------


def test_a_long_or_query_is_refused_before_the_embedding_model_is_called(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('emb', 'openai', %s::jsonb)", (json.dumps(opts),))
    _namespace(db, {"embedding": "emb"})
    _memories(db, 200, embedding=[1.0, 0.0, 0.0], model="emb")
    query = " or ".join(_short_words(4000))[:16_000]
    e = _search_refused(db, query)
    assert e.sqlstate == "22023"
    assert e.diag.message_primary is not None and "query" in e.diag.message_primary
    assert "config.search_max_query_chars" in (e.diag.message_hint or "")
    assert fake.calls("/embeddings") == [], "refused before any model was paid"


def test_many_distinct_short_words_are_refused_even_under_a_raised_length_cap(
    db: Database,
) -> None:
    # An admin allows long queries; the distinct-word cap still bounds what one search costs.
    _namespace(db, search_max_query_chars=100_000)
    _memories(db, 200)
    query = " ".join(_short_words(17_576))
    e = _search_refused(db, query)
    assert e.sqlstate == "22023"
    assert "17576 distinct words" in (e.diag.message_primary or "")
    assert "config.search_max_words" in (e.diag.message_hint or "")


def test_a_query_of_many_operators_over_one_word_is_refused(db: Database) -> None:
    # One distinct word, within the default length cap: 999 words and operators.
    _namespace(db)
    _memories(db, 200)
    query = " or ".join(["tea"] * 500)
    assert len(query) <= 4000
    e = _search_refused(db, query)
    assert e.sqlstate == "22023"
    assert "999 words and operators" in (e.diag.message_primary or "")
    assert "config.search_max_query_nodes" in (e.diag.message_hint or "")
    # 40 words, no operator written: the tsquery ANDs them, 79 nodes; counted exactly.
    e = _search_refused(db, " ".join(["tea"] * 40))
    assert "makes a full-text query of 79 terms and operators" in (e.diag.message_primary or "")
    assert "config.search_max_query_nodes" in (e.diag.message_hint or "")


def test_a_long_or_query_is_refused_by_its_nodes_under_a_raised_length_cap(db: Database) -> None:
    _namespace(db, search_max_query_chars=100_000, search_max_words=100_000 // 10)
    _memories(db, 200)
    query = " or ".join(_short_words(4000))[:16_000]
    e = _search_refused(db, query)
    assert e.sqlstate == "22023"
    assert "config.search_max_query_nodes" in (e.diag.message_hint or "")


def test_a_query_within_the_caps_still_searches(db: Database) -> None:
    _namespace(db)
    _memories(db, 200)
    # 32 distinct words (the default cap; "or" is one of them, as to_tsvector sees the query),
    # or-joined: 61 nodes (the default cap is 64).
    query = " or ".join(["tea", *_short_words(30)])
    hits = _search(db, query)
    assert len(hits) == 10 and all("tea" in content for _, content in hits)
    e = _search_refused(db, " ".join(["tea", *_short_words(32)]))
    assert "33 distinct words" in (e.diag.message_primary or "")


def test_a_broad_query_scores_at_most_search_max_ranked_memories(db: Database) -> None:
    # Every memory matches "user": the full-text signal scores only search_max_ranked of them (the
    # only signal here: one known word), so no more than that can come back, whatever the limit.
    _namespace(db, search_max_ranked=10)
    _memories(db, 200)
    hits = _call(
        db, 'SELECT id FROM aidb_memory.search(%s, %s, %s, "limit" => 100)', (NS, ACTOR, "user")
    )
    assert len(hits) == 10
    db.sql(
        "SELECT aidb_memory.namespace_update(%s, config => '{\"search_max_ranked\": 50}')", (NS,)
    )
    hits = _call(
        db, 'SELECT id FROM aidb_memory.search(%s, %s, %s, "limit" => 100)', (NS, ACTOR, "user")
    )
    assert len(hits) == 50


def test_caps_are_namespace_config_validated_like_the_others(db: Database) -> None:
    for key in (
        "max_add_chars",
        "search_max_query_chars",
        "search_max_words",
        "search_max_query_nodes",
        "search_max_ranked",
        "extraction_max_input_chars",
    ):
        e = _refused(
            db,
            "SELECT aidb_memory.init('bad', '{}', %s::jsonb)",
            (json.dumps({key: 0}),),
            user=ADMIN_USER,
        )
        assert e.sqlstate == "22023" and f"config.{key} must be between" in str(e)


# --- add ----------------------------------------------------------------------------------------


def _counts(db: Database) -> tuple[int, int, int]:
    row = db.sql(
        "SELECT (SELECT count(*) FROM aidb_memory.event), (SELECT count(*) FROM aidb_memory.turn),"
        " (SELECT count(*) FROM aidb_memory.session)"
    )[0]
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.parametrize("session_id", [None, "s1"])
def test_an_add_over_the_batch_size_is_refused_before_parsing_and_stores_nothing(
    db: Database, session_id: str | None
) -> None:
    _namespace(db)
    # 100 turns of 100,000 chars: each turn within max_turn_chars, the batch within
    # max_turns_per_add, 10 MB in all.
    turns = json.dumps([{"role": "user", "content": "x" * 100_000}] * 100)
    e = _refused(
        db,
        "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)",
        (NS, ACTOR, turns, session_id),
    )
    assert e.sqlstate == "22023"
    assert (e.diag.message_primary or "").startswith("aidb_memory.add: turns has ")
    assert "config.max_add_chars" in (e.diag.message_hint or "")
    assert _counts(db) == (0, 0, 0)


def test_an_add_within_the_batch_size_is_stored(db: Database) -> None:
    _namespace(db)
    turns = json.dumps([{"role": "user", "content": "x" * 100_000}] * 9)
    _call(db, "SELECT aidb_memory.add(%s, %s, %s::jsonb, 's1')", (NS, ACTOR, turns))
    assert _counts(db) == (1, 9, 1)


# --- extraction ---------------------------------------------------------------------------------


def test_one_add_cannot_make_the_worker_send_a_request_over_the_extraction_cap(
    db: Database, fake: FakeOpenAI
) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    _namespace(db, {"llm": "chat"})
    # 9 turns of 100,000 chars, within every cap of add: 900,000 chars for the worker.
    turns = json.dumps([{"role": "user", "content": f"{i} " + "x" * 99_998} for i in range(9)])
    _call(db, "SELECT aidb_memory.add(%s, %s, %s::jsonb)", (NS, ACTOR, turns))
    fake.queue(Reply(content=json.dumps({"operations": []})))
    with db.connect(WORKER_USER) as conn:
        conn.execute(GUARD)
        conn.execute("CALL aidb_memory.process_events(max_events => 10)")
    (request,) = fake.calls()
    sent = sum(len(m["content"]) for m in request.body["messages"])
    # The turns' share is the cap (200,000 by default); instructions and memories are small.
    assert sent < 200_000 + 10_000
    user = request.body["messages"][-1]["content"]
    assert "700000 more characters of these turns are not shown" in user
    assert db.value("SELECT status FROM aidb_memory.event") == "processed"
