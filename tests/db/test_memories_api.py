"""Long-term memory's API (SPEC §5, §2; issue 5 acceptance 4, 5, 6): search, list_memories,
delete, forget and namespace_drop.

Memories are inserted directly as the superuser (what the extraction worker writes); the API is
called as the application role. Embeddings come from the fake OpenAI-compatible server
(tests/fake_openai.py), which answers /v1/embeddings with the vector a test queues.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from aidb_memory_server import ranking
from conftest import ADMIN_USER, APP_USER, Database
from fake_openai import FakeOpenAI, Reply

NS = "mem"


def _namespace(db: Database, name: str = NS, spec: dict[str, Any] | None = None) -> None:
    db.sql("SELECT aidb_memory.init(%s, %s::jsonb)", (name, json.dumps(spec or {})))


def _embedding_model(db: Database, fake: FakeOpenAI, name: str = "emb") -> None:
    opts = {"model": "fake-embedding", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))


def _memory(
    db: Database,
    content: str,
    actor: str = "alice",
    *,
    ns: str = NS,
    session: str | None = None,
    agent: str | None = None,
    embedding: list[float] | None = None,
    model: str | None = None,
    current: bool = True,
    created_at: str | None = None,
) -> str:
    """Insert a memory as the worker would; returns its public id."""
    return str(
        db.value(
            """INSERT INTO aidb_memory.memory
                   (actor_key, namespace_id, actor_id, agent_id, session_id, content,
                    content_hash, embedding, embedding_model, valid_to, created_at, lexemes)
               VALUES (aidb_memory.actor_key(%s, %s),
                       (SELECT id FROM aidb_memory.namespace WHERE name = %s), %s, %s, %s, %s,
                       md5(%s), %s::real[], %s, CASE WHEN %s THEN NULL ELSE now() END,
                       coalesce(%s::timestamptz, now()), to_tsvector('english', %s))
               RETURNING public_id::text""",
            (
                ns,
                actor,
                ns,
                actor,
                agent,
                session,
                content,
                content + ("" if current else str(uuid.uuid4())),
                None if embedding is None else [float(x) for x in embedding],
                model if embedding is not None else None,
                current,
                created_at,
                content,
            ),
        )
    )


def _supersede(db: Database, old: str, new: str) -> None:
    db.sql(
        """UPDATE aidb_memory.memory SET valid_to = now(),
               superseded_by = (SELECT id FROM aidb_memory.memory WHERE public_id = %s)
           WHERE public_id = %s""",
        (new, old),
    )


def _search(
    db: Database, query: str | None, actor: str = "alice", **kwargs: Any
) -> list[tuple[Any, ...]]:
    names = "".join(f', "{k}" => %({k})s' for k in kwargs)
    return db.sql(
        f"SELECT id::text, content, score, agent_id, session_id, created_at "
        f"FROM aidb_memory.search(%(ns)s, %(actor)s, %(query)s{names})",
        {"ns": NS, "actor": actor, "query": query, **kwargs},
        user=APP_USER,
    )


def _fails(db: Database, query: str, params: Any, sqlstate: str, user: str = APP_USER) -> str:
    with db.connect(user) as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, str(info.value)
    return str(info.value.diag.message_primary)


FACTS = [
    "Alice prefers green tea over coffee",
    "Alice's favourite colour is turquoise",
    "Alice lives in Lisbon near the river",
    "Alice works at Acme as a data engineer",
    "Alice has a cat called Miso",
]


@pytest.fixture
def facts(db: Database) -> dict[str, str]:
    _namespace(db)
    return {content: _memory(db, content) for content in FACTS}


# --- search ------------------------------------------------------------------------------------


def test_an_exact_match_ranks_first(db: Database, facts: dict[str, str]) -> None:
    rows = _search(db, "Alice lives in Lisbon near the river")
    assert rows[0][0] == facts["Alice lives in Lisbon near the river"]
    assert rows[0][2] > 0.95  # every word, once, at about the average length
    assert rows[1][2] < 0.5  # only "Alice", in every memory: worth little
    scores = [r[2] for r in rows]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores == sorted(scores, reverse=True)
    # Every fact names Alice: all match.
    assert {r[1] for r in _search(db, "Alice")} == set(FACTS)
    assert _search(db, "Lisbon")[0][1] == "Alice lives in Lisbon near the river"


def test_a_misspelled_word_is_found_by_trigrams(db: Database, facts: dict[str, str]) -> None:
    assert not db.value(
        "SELECT bool_or(tsv @@ websearch_to_tsquery('simple', 'turqoise')) FROM aidb_memory.memory"
    ), "full-text search alone cannot find it"
    rows = _search(db, "turqoise")
    assert [r[0] for r in rows] == [facts["Alice's favourite colour is turquoise"]]
    # The word it stands for, once, and nothing else: what a near word counts for.
    assert rows[0][2] == pytest.approx(ranking.NEAR_WORD_WEIGHT)
    assert _search(db, "enginer at Acme")[0][1] == "Alice works at Acme as a data engineer"


@pytest.mark.parametrize(
    "query", ["Alice prefers green tea in Lisbon", "where does Alice live", "tea or coffee"]
)
def test_the_score_is_the_bm25_that_ranking_states(
    db: Database, facts: dict[str, str], query: str
) -> None:
    """The statement computes what ranking.lexical says, from the actor's own counts."""
    words = db.sql(
        "SELECT lexeme FROM unnest(to_tsvector('english', %s)) ORDER BY min(positions[1]) "
        "OVER (PARTITION BY lexeme)",
        (query,),
    )
    groups = {w: i for i, (w,) in enumerate(words)}
    held: dict[str, dict[str, float]] = {}
    lengths: dict[str, float] = {}
    whole: dict[str, bool] = {}
    for content, lexemes, length, matches in db.sql(
        "SELECT content, lexemes::text, length(lexemes), "
        "lexemes @@ websearch_to_tsquery('english', %s) FROM aidb_memory.memory",
        (query,),
    ):
        counts = db.sql(
            "SELECT lexeme, array_length(positions, 1) FROM unnest(%s::tsvector)", (lexemes,)
        )
        held[content] = {x: float(n) for x, n in counts if x in groups}
        lengths[content], whole[content] = float(length), bool(matches)
    candidates = [c for c in held if held[c]]
    average = sum(lengths[c] for c in candidates) / len(candidates)
    df = {w: sum(1 for c in held if w in held[c]) for w in groups}
    idfs = {w: ranking.idf(len(held), df[w]) for w in groups}
    absent = frozenset(w for w in groups if df[w] == 0)
    expected = {
        c: ranking.lexical(held[c], lengths[c], average, idfs, groups, whole[c], absent)
        for c in candidates
    }
    got = {r[1]: r[2] for r in _search(db, query, limit=100)}
    assert got == pytest.approx({c: v for c, v in expected.items() if v > 0}, rel=1e-5)


TYPO_FACTS = [
    "Alice prefers email over phone calls",
    "Alice prefers phone calls in the morning",
    "Alice has a cat called Miso",
    "Alice has a car called Betty",
    "Alice has a dog called Rex",
    "Alice drinks tea at the corner cafe",
    "Alice drinks coffee at home",
    "Alice flies to Oslo in June",
    "Alice flies to Rome in May",
    "Alice flies to Lima in July",
]


@pytest.mark.parametrize(
    ("query", "intended"),
    [
        # Two letters swapped: "emial" shares 2 of 10 trigrams with "email" (similarity 0.2).
        ("prefers emial", "Alice prefers email over phone calls"),
        ("a cta called Miso", "Alice has a cat called Miso"),
        ("flies to Olso", "Alice flies to Oslo in June"),
        # A letter missing, too many, replaced.
        ("tea at the cfe", "Alice drinks tea at the corner cafe"),
        ("drinks teaa", "Alice drinks tea at the corner cafe"),
        ("flies to Oclo", "Alice flies to Oslo in June"),
    ],
)
def test_a_word_one_edit_away_is_found_and_ranked_top_three(
    db: Database, query: str, intended: str
) -> None:
    _namespace(db)
    ids = {content: _memory(db, content) for content in TYPO_FACTS}
    assert not db.value(
        "SELECT bool_or(tsv @@ websearch_to_tsquery('simple', %s)) FROM aidb_memory.memory",
        (query,),
    ), "full-text search alone cannot find it"
    rows = _search(db, query)
    assert ids[intended] in [r[0] for r in rows[:3]], rows
    assert rows[0][0] == ids[intended], rows


def test_nothing_matches_nothing(db: Database, facts: dict[str, str]) -> None:
    assert _search(db, "xylophone") == []
    assert _search(db, "!!!") == []


def test_meaning_is_found_by_embeddings(db: Database, fake: FakeOpenAI) -> None:
    _embedding_model(db, fake)
    _namespace(db, spec={"embedding": "emb"})
    pet = _memory(db, "The customer owns a dog named Rex", embedding=[1, 0, 0], model="emb")
    _memory(db, "Invoice 4411 was paid in March", embedding=[0, 1, 0], model="emb")
    _memory(db, "Prefers e-mail to phone calls", embedding=[0, 0.2, 1], model="emb")
    fake.queue(Reply(embedding=[0.9, 0.1, 0.0]))
    rows = _search(db, "which animal companion")
    assert [r[0] for r in rows] == [pet, *[r[0] for r in rows[1:]]]
    # No memory holds a word of the query (nor one near them): ranked by the cosine alone.
    norm = math.sqrt(0.82)
    cosines = [0.9 / norm, 0.1 / norm, 0.02 / (norm * math.sqrt(1.04))]
    assert [r[2] for r in rows] == pytest.approx(cosines, rel=1e-5)
    # Only the vector signal found it: without the embedding model the query finds nothing.
    calls = fake.calls("/embeddings")
    assert len(calls) == 1
    assert calls[0].body["input"] == ["which animal companion"]
    assert calls[0].body["model"] == "fake-embedding"
    assert db.sql(
        "SELECT purpose, outcome, chars_in FROM aidb_memory.model_usage WHERE model_name = 'emb'"
    ) == [("embedding", "ok", len("which animal companion"))]
    db.sql("SELECT * FROM aidb_memory.namespace_update(%s, '{\"embedding\": null}')", (NS,))
    assert _search(db, "which animal companion") == []
    assert len(fake.calls("/embeddings")) == 1


def test_every_signal_agreeing_scores_one(db: Database, fake: FakeOpenAI) -> None:
    _embedding_model(db, fake)
    _namespace(db, spec={"embedding": "emb"})
    exact = _memory(db, "Deploys happen on Tuesdays", embedding=[1, 0], model="emb")
    _memory(db, "Deploy freezes in December", embedding=[0, 1], model="emb")
    fake.queue(Reply(embedding=[1, 0]))
    rows = _search(db, "Deploys happen on Tuesdays")
    assert rows[0][0] == exact and rows[0][2] == pytest.approx(1.0)


def test_no_vector_signal_without_embedded_memories(db: Database, fake: FakeOpenAI) -> None:
    _embedding_model(db, fake)
    _namespace(db, spec={"embedding": "emb"})
    _memory(db, "Deploys happen on Tuesdays")
    assert _search(db, "Deploys happen on Tuesdays")[0][2] == pytest.approx(1.0)
    assert fake.calls("/embeddings") == []  # nothing to compare with: the model is not called


def test_another_embedding_model_is_refused_not_mixed(db: Database, fake: FakeOpenAI) -> None:
    _embedding_model(db, fake, "emb")
    _embedding_model(db, fake, "emb-v2")
    _namespace(db, spec={"embedding": "emb-v2"})
    _memory(db, "Deploys happen on Tuesdays", embedding=[1, 0], model="emb")
    message = _fails(db, "SELECT * FROM aidb_memory.search(%s, 'alice', 'deploys')", (NS,), "55000")
    assert message == (
        'aidb_memory.search: memories of actor_id "alice" were embedded with model "emb", '
        'but namespace "mem" now embeds with "emb-v2"'
    )
    assert fake.calls("/embeddings") == []


def test_a_failed_embedding_call_ranks_without_vectors(db: Database, fake: FakeOpenAI) -> None:
    _embedding_model(db, fake)
    _namespace(db, spec={"embedding": "emb"})
    rex = _memory(db, "The customer owns a dog named Rex", embedding=[1, 0], model="emb")
    fake.queue(Reply(status=500))
    notices: list[str] = []
    with db.connect(APP_USER) as conn:
        conn.add_notice_handler(lambda d: notices.append(f"{d.severity}: {d.message_primary}"))
        rows = conn.execute(
            "SELECT id::text, score FROM aidb_memory.search(%s, 'alice', 'dog named Rex')", (NS,)
        ).fetchall()
    assert rows == [(rex, pytest.approx(1.0))]  # first in both remaining signals
    assert len(notices) == 1 and notices[0].startswith(
        'WARNING: aidb_memory.search: the embedding model "emb" failed (error: HTTP 500'
    )
    assert notices[0].endswith("ranked without vector similarity")
    assert db.value("SELECT outcome FROM aidb_memory.model_usage") == "error"


def test_never_superseded_deleted_or_another_actors(db: Database) -> None:
    _namespace(db)
    old = _memory(db, "Alice lives in Porto")
    new = _memory(db, "Alice lives in Lisbon")
    _supersede(db, old, new)
    gone = _memory(db, "Alice lives in a houseboat")
    bob = _memory(db, "Alice lives in Porto says Bob", actor="bob")
    db.sql(
        "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, 'test')",
        (NS, json.dumps({"ids": [gone]})),
        user=APP_USER,
    )
    for query in ("Alice lives in Porto", "lives", "Porto", "houseboat", "Alice"):
        ids = {r[0] for r in _search(db, query)}
        assert ids <= {new}, query
    assert {r[0] for r in _search(db, "Porto", actor="bob")} == {bob}
    assert _search(db, "Porto", actor="carol") == []


def test_session_and_agent_filters(db: Database) -> None:
    _namespace(db)
    a = _memory(db, "Ticket 17 is about billing", session="s1", agent="support")
    b = _memory(db, "Ticket 18 is about billing", session="s2", agent="support")
    c = _memory(db, "Ticket 19 is about billing", session="s2", agent="sales")
    assert {r[0] for r in _search(db, "billing")} == {a, b, c}
    assert {r[0] for r in _search(db, "billing", session_id="s2")} == {b, c}
    assert {r[0] for r in _search(db, "billing", agent_id="support")} == {a, b}
    rows = _search(db, "billing", session_id="s2", agent_id="sales")
    assert [(r[0], r[3], r[4]) for r in rows] == [(c, "sales", "s2")]
    assert _search(db, "billing", session_id="s3") == []


def test_limit_bounds_and_query_checks(db: Database, facts: dict[str, str]) -> None:
    assert len(_search(db, "Alice")) == 5
    assert len(_search(db, "Alice", limit=2)) == 2
    assert len(_search(db, "Alice", limit=None)) == 5  # NULL: the default, 10
    q = "SELECT * FROM aidb_memory.search(%s, 'alice', %s, %s)"
    for bad in (0, -1, 101):
        message = _fails(db, q, (NS, "Alice", bad), "22023")
        assert message == "aidb_memory.search: limit must be between 1 and 100"
    assert len(_search(db, "Alice", limit=100)) == 5
    for blank in ("", "   "):
        assert _fails(db, q, (NS, blank, 10), "22023") == (
            "aidb_memory.search: query must not be empty"
        )
    assert _fails(db, q, (NS, None, 10), "22004") == "aidb_memory.search: query must not be NULL"
    assert _fails(db, q, ("nope", "x", 10), "42704").startswith(
        'aidb_memory.search: namespace "nope"'
    )
    assert _fails(db, "SELECT * FROM aidb_memory.search(%s, NULL, 'x')", (NS,), "22004")


def test_search_cost_is_bounded_by_candidates(db: Database) -> None:
    """Each signal ranks at most 200 candidates: 300 equally matching memories still answer."""
    _namespace(db)
    db.sql(
        """INSERT INTO aidb_memory.memory
               (actor_key, namespace_id, actor_id, content, content_hash, lexemes)
           SELECT aidb_memory.actor_key(n.name, 'alice'), n.id, 'alice',
                  'note number ' || i || ' about the garden', md5(i::text),
                  to_tsvector('english', 'note number ' || i || ' about the garden')
           FROM aidb_memory.namespace n, generate_series(1, 300) AS i WHERE n.name = %s""",
        (NS,),
    )
    rows = _search(db, "garden", limit=100)
    assert len(rows) == 100
    assert all(0.0 < r[2] <= 1.0 for r in rows)


# --- list_memories -----------------------------------------------------------------------------


def test_list_memories_newest_first_and_superseded_on_request(db: Database) -> None:
    _namespace(db)
    old = _memory(db, "Alice lives in Porto", created_at="2025-01-01T00:00:00Z")
    new = _memory(db, "Alice lives in Lisbon", created_at="2025-02-01T00:00:00Z", session="s")
    other = _memory(db, "Alice likes jazz", created_at="2025-03-01T00:00:00Z", agent="dj")
    _supersede(db, old, new)
    _memory(db, "Bob likes rock", actor="bob")
    q = (
        "SELECT id::text, content, agent_id, session_id, valid_to IS NOT NULL, "
        "superseded_by::text FROM aidb_memory.list_memories(%s, 'alice'{})"
    )
    rows = db.sql(q.format(""), (NS,), user=APP_USER)
    assert rows == [
        (other, "Alice likes jazz", "dj", None, False, None),
        (new, "Alice lives in Lisbon", None, "s", False, None),
    ]
    rows = db.sql(q.format(", include_superseded => true"), (NS,), user=APP_USER)
    assert [r[0] for r in rows] == [other, new, old]
    assert rows[2][4:] == (True, new)
    assert [r[0] for r in db.sql(q.format(", session_id => 's'"), (NS,), user=APP_USER)] == [new]
    assert [r[0] for r in db.sql(q.format(", agent_id => 'dj'"), (NS,), user=APP_USER)] == [other]
    assert [r[0] for r in db.sql(q.format(', "limit" => 1'), (NS,), user=APP_USER)] == [other]
    _fails(db, q.format(', "limit" => 0'), (NS,), "22023")
    _fails(db, q.format(', "limit" => 1001'), (NS,), "22023")


# --- delete ------------------------------------------------------------------------------------


def _delete(
    db: Database, selector: Any, reason: str | None = "asked", actor: str = "alice", **kw: Any
) -> int:
    names = "".join(f', "{k}" => %({k})s' for k in kw)
    return int(
        db.value(
            f"SELECT aidb_memory.delete(%(ns)s, %(actor)s, %(sel)s::jsonb, %(reason)s{names})",
            {"ns": NS, "actor": actor, "sel": json.dumps(selector), "reason": reason, **kw},
            user=APP_USER,
        )
    )


def _contents(db: Database, actor: str = "alice") -> set[str]:
    rows = db.sql("SELECT content FROM aidb_memory.memory WHERE actor_id = %s", (actor,))
    return {r[0] for r in rows}


def test_delete_by_ids_removes_exactly_those_with_their_history(db: Database) -> None:
    _namespace(db)
    a = _memory(db, "fact a")
    b = _memory(db, "fact b")
    _memory(db, "fact c")
    bobs = _memory(db, "fact of bob", actor="bob")
    db.sql(
        """INSERT INTO aidb_memory.memory_history
               (actor_key, memory_id, namespace_id, actor_id, operation, new_content)
           SELECT actor_key, id, namespace_id, actor_id, 'add', content FROM aidb_memory.memory"""
    )
    # Another actor's id and an unknown id are named too: neither is touched.
    assert _delete(db, {"ids": [a, b, bobs, str(uuid.uuid4())]}) == 2
    assert _contents(db) == {"fact c"}
    assert _contents(db, "bob") == {"fact of bob"}
    history = db.sql("SELECT actor_id, new_content FROM aidb_memory.memory_history ORDER BY 2")
    assert history == [("alice", "fact c"), ("bob", "fact of bob")]
    audit = db.sql("SELECT by_role, action, namespace, counts, reason FROM aidb_memory.audit_log")
    assert audit == [
        (
            APP_USER,
            "delete",
            NS,
            {"memories": 2, "memory_history": 2, "selector": "ids"},
            "asked",
        )
    ]
    row = db.sql("SELECT a::text FROM aidb_memory.audit_log a")[0][0]
    assert "fact" not in row and a not in row and "alice" not in row
    assert _delete(db, {"ids": []}) == 0
    assert db.value("SELECT count(*) FROM aidb_memory.audit_log") == 1  # nothing, no record


def test_delete_blanks_a_deleted_facts_text_in_other_history(db: Database) -> None:
    _namespace(db)
    old = _memory(db, "Alice lives in Porto")
    new = _memory(db, "Alice lives in Lisbon")
    _supersede(db, old, new)
    db.sql(
        """INSERT INTO aidb_memory.memory_history
               (actor_key, memory_id, namespace_id, actor_id, operation, old_content,
                new_content)
           SELECT actor_key, id, namespace_id, actor_id, 'supersede', 'Alice lives in Porto',
                  'Alice lives in Lisbon'
           FROM aidb_memory.memory WHERE public_id = %s""",
        (old,),
    )
    assert _delete(db, {"ids": [new]}) == 1
    assert db.sql("SELECT old_content, new_content FROM aidb_memory.memory_history") == [
        ("Alice lives in Porto", None)
    ]
    # The old fact stays superseded: deleting its successor does not make it current again.
    assert db.value("SELECT valid_to IS NOT NULL FROM aidb_memory.memory") is True


def test_delete_all_and_before_within_filters(db: Database) -> None:
    _namespace(db)
    _memory(db, "jan s1", session="s1", created_at="2025-01-15T00:00:00Z")
    _memory(db, "feb s1", session="s1", created_at="2025-02-15T00:00:00Z")
    _memory(db, "jan s2", session="s2", agent="x", created_at="2025-01-15T00:00:00Z")
    _memory(db, "mar s2", session="s2", agent="y", created_at="2025-03-15T00:00:00Z")
    _memory(db, "superseded jan", current=False, created_at="2025-01-20T00:00:00Z")
    _memory(db, "bob jan", actor="bob", created_at="2025-01-15T00:00:00Z")
    assert _delete(db, {"before": "2025-02-01T00:00:00Z"}, session_id="s1") == 1
    assert _contents(db) == {"feb s1", "jan s2", "mar s2", "superseded jan"}
    assert _delete(db, {"all": True}, agent_id="y") == 1
    assert _delete(db, {"before": "2025-02-01"}) == 2  # current or superseded
    assert _contents(db) == {"feb s1"}
    assert _delete(db, {"all": True}) == 1
    assert _contents(db) == set()
    assert _contents(db, "bob") == {"bob jan"}
    counts = db.sql("SELECT counts->>'selector', counts->>'memories' FROM aidb_memory.audit_log")
    assert counts == [("before", "1"), ("all", "1"), ("before", "2"), ("all", "1")]


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({}, "selector must be an object with exactly one key"),
        ([], "selector must be an object with exactly one key"),
        ({"all": True, "ids": []}, "selector must be an object with exactly one key"),
        ({"every": True}, "selector.every is not a selector"),
        ({"all": False}, "selector.all must be true"),
        ({"all": "yes"}, "selector.all must be true"),
        ({"ids": "abc"}, "selector.ids must be an array of at most 10000 memory ids"),
        ({"ids": ["not-a-uuid"]}, "selector.ids[0] is not a memory id (a UUID)"),
        ({"ids": [str(uuid.uuid4()), 7]}, "selector.ids[1] is not a memory id (a UUID)"),
        ({"before": 20250101}, "selector.before must be a timestamp string"),
        ({"before": "last tuesday"}, 'selector.before is not a timestamp: "last tuesday"'),
    ],
)
def test_a_bad_selector_is_refused(db: Database, selector: Any, message: str) -> None:
    _namespace(db)
    _memory(db, "kept")
    got = _fails(
        db,
        "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, 'r')",
        (NS, json.dumps(selector)),
        "22023",
    )
    assert got == f"aidb_memory.delete: {message}"
    assert _contents(db) == {"kept"}


def test_delete_needs_a_reason_and_a_selector(db: Database) -> None:
    _namespace(db)
    _memory(db, "kept")
    q = "SELECT aidb_memory.delete(%s, 'alice', %s::jsonb, %s)"
    all_ = json.dumps({"all": True})
    assert _fails(db, q, (NS, all_, None), "22004") == "aidb_memory.delete: reason must not be NULL"
    assert _fails(db, q, (NS, all_, " "), "22023") == "aidb_memory.delete: reason must not be empty"
    assert (
        _fails(db, q, (NS, None, "r"), "22004") == "aidb_memory.delete: selector must not be NULL"
    )
    assert _contents(db) == {"kept"}
    assert db.value("SELECT count(*) FROM aidb_memory.audit_log") == 0


# --- forget ------------------------------------------------------------------------------------


def _tables(db: Database) -> list[str]:
    return [
        r[0]
        for r in db.sql(
            "SELECT c.relname FROM pg_class c "
            "WHERE c.relnamespace = 'aidb_memory'::regnamespace AND c.relkind IN ('r', 'p') "
            # In name order: the order of a scan of pg_class changes when a migration rewrites a
            # table's row there, and the expected lists below are sorted.
            "ORDER BY c.relname"
        )
    ]


def _traces(db: Database, needles: list[str]) -> dict[str, list[str]]:
    """For each needle, the tables of the schema one of whose rows (as text) contains it, in any
    case (full text keeps words lower-cased)."""
    found: dict[str, list[str]] = {}
    for table in _tables(db):
        for needle in needles:
            hit = db.value(
                pgsql.SQL(
                    "SELECT count(*) FROM {} t WHERE strpos(lower(t::text), lower(%s)) > 0"
                ).format(pgsql.Identifier("aidb_memory", table)),
                (needle,),
            )
            if hit:
                found.setdefault(needle, []).append(table)
    return found


def _add(db: Database, actor: str, turns: list[dict[str, Any]], **kw: Any) -> None:
    names = "".join(f', "{k}" => %({k})s' for k in kw)
    db.sql(
        f"SELECT aidb_memory.add(%(ns)s, %(actor)s, %(turns)s::jsonb{names})",
        {"ns": NS, "actor": actor, "turns": json.dumps(turns), **kw},
        user=APP_USER,
    )


def test_forget_leaves_no_trace(db: Database) -> None:
    # Letters only: the full-text parser reads a hex tag such as "12345e6789" or "1e2a3b4c5d" as
    # a number, and then "{tag}-bob" is no word of memory_word (1 run in ~30 failed so).
    tag = "".join(chr(ord("g") + int(c, 16)) for c in uuid.uuid4().hex[:10])
    actor = f"actor-{tag}"
    secret_turn = f"my passport number is P{tag}Q"
    secret_answer = f"noted the passport P{tag}Q"
    secret_notes = f"handoff notes {tag} zebra"
    secret_fact = f"Has passport P{tag}Q and a parrot named Kiwi{tag}"
    secret_key = f"idem-{tag}"
    secret_summary = f"summary of {tag} turns"
    _namespace(db)
    _namespace(db, "other")
    # Two sessions (the second one's prev_handoff is the first's handoff), an add without a
    # session (its turns live on the event), an idempotency key, a summary, memories and their
    # history, and usage of a model.
    _add(
        db,
        actor,
        [{"role": "user", "content": secret_turn}, {"role": "assistant", "content": secret_answer}],
        session_id=f"s1-{tag}",
        agent_id=f"agent-{tag}",
        idempotency_key=secret_key,
    )
    db.sql(
        "SELECT * FROM aidb_memory.session_end(%s, %s, %s, %s)",
        (NS, actor, f"s1-{tag}", secret_notes),
        user=APP_USER,
    )
    db.sql(
        "SELECT * FROM aidb_memory.session_start(%s, %s, %s, %s)",
        (NS, actor, f"agent-{tag}", f"s2-{tag}"),
        user=APP_USER,
    )
    assert (
        db.value(
            "SELECT prev_handoff->>'notes' FROM aidb_memory.session WHERE session_id = %s",
            (f"s2-{tag}",),
        )
        == secret_notes
    )
    _add(db, actor, [{"role": "user", "content": f"{secret_turn} again"}])
    db.sql(
        """INSERT INTO aidb_memory.summary
               (actor_key, session_ref, from_seq, to_seq, turn_count, content, chars,
                from_offset, to_offset)
           SELECT actor_key, id, 1, 1, 1, %s, 10, 0, 10 FROM aidb_memory.session
           WHERE session_id = %s""",
        (secret_summary, f"s1-{tag}"),
    )
    fact = _memory(db, secret_fact, actor, session=f"s1-{tag}", agent=f"agent-{tag}")
    old = _memory(db, f"old fact {tag}", actor, current=False)
    _supersede(db, old, fact)
    db.sql(
        """INSERT INTO aidb_memory.memory_history
               (actor_key, memory_id, namespace_id, actor_id, event_id, operation,
                old_content, new_content)
           SELECT m.actor_key, m.id, m.namespace_id, m.actor_id, e.id, 'supersede', %s,
                  m.content
           FROM aidb_memory.memory m, aidb_memory.event e
           WHERE m.public_id = %s AND e.idempotency_key = %s AND e.actor_key = m.actor_key""",
        (f"old fact {tag}", fact, secret_key),
    )
    # What must stay: bob in the same namespace, and the same actor id in another namespace.
    _add(db, "bob", [{"role": "user", "content": f"bob says {tag}-bob"}], session_id="b1")
    _memory(db, f"bob fact {tag}-bob", "bob")
    _memory(db, f"same actor elsewhere {tag}-else", actor, ns="other")

    needles = [
        actor,
        secret_turn,
        secret_answer,
        secret_notes,
        secret_fact,
        secret_key,
        secret_summary,
        f"old fact {tag}",
        f"s1-{tag}",
        f"agent-{tag}",
        f"Kiwi{tag}",
        fact,
    ]
    before = _traces(db, needles)
    assert set(before) == set(needles), "every needle is somewhere before forget"

    counts = db.value(
        "SELECT aidb_memory.forget(%s, %s, %s)", (NS, actor, "GDPR erasure request"), user=APP_USER
    )
    assert counts == {
        "sessions": 2,
        "turns": 2,
        "summaries": 1,
        "events": 2,
        "memories": 2,
        "memory_history": 1,
    }
    after = _traces(db, needles)
    # The same actor id in the other namespace: its memory and that memory's words and counts.
    assert after == {actor: ["memory", "memory_lexeme", "memory_word"]}, after
    assert db.value("SELECT count(*) FROM aidb_memory.memory WHERE actor_id = %s", (actor,)) == 1
    bob = {"turn", "memory", "memory_word", "memory_lexeme"}
    assert set(_traces(db, [f"{tag}-bob"])[f"{tag}-bob"]) == bob  # bob stays
    audit = db.sql(
        "SELECT by_role, action, namespace, subject_hash, counts, reason, a::text "
        "FROM aidb_memory.audit_log a"
    )
    assert len(audit) == 1
    by_role, action, namespace, subject, audit_counts, reason, text = audit[0]
    assert (by_role, action, namespace, audit_counts, reason) == (
        APP_USER,
        "forget",
        NS,
        counts,
        "GDPR erasure request",
    )
    assert subject and len(subject) == 64
    assert tag not in text
    # forget again: nothing left, still audited.
    again = db.value("SELECT aidb_memory.forget(%s, %s, 'again')", (NS, actor), user=APP_USER)
    assert set(again.values()) == {0}


def test_forget_needs_a_reason(db: Database) -> None:
    _namespace(db)
    _memory(db, "kept")
    q = "SELECT aidb_memory.forget(%s, 'alice', %s)"
    assert _fails(db, q, (NS, None), "22004") == "aidb_memory.forget: reason must not be NULL"
    assert _fails(db, q, (NS, ""), "22023") == "aidb_memory.forget: reason must not be empty"
    assert _contents(db) == {"kept"}


# --- namespace_drop ----------------------------------------------------------------------------


def test_namespace_drop_erases_everything_in_it(db: Database) -> None:
    _namespace(db)
    _namespace(db, "kept")
    _add(db, "alice", [{"role": "user", "content": "hello there"}], session_id="s")
    _add(db, "bob", [{"role": "user", "content": "hi"}])
    _memory(db, "Alice likes jazz")
    _memory(db, "kept memory", ns="kept")
    counts = db.value(
        "SELECT aidb_memory.namespace_drop(%s, 'project closed')", (NS,), user=ADMIN_USER
    )
    assert counts == {"actors": 2, "sessions": 1, "turns": 1, "events": 2, "memories": 1}
    assert db.sql("SELECT name FROM aidb_memory.namespace ORDER BY name") == [
        ("kept",),
        ("pg_agents",),
    ]
    for table in ("session", "turn", "event", "memory"):
        assert db.value(f"SELECT count(*) FROM aidb_memory.{table}") == (
            1 if table == "memory" else 0
        ), table
    assert db.sql(
        "SELECT by_role, action, namespace, counts, reason FROM aidb_memory.audit_log"
    ) == [(ADMIN_USER, "namespace_drop", NS, counts, "project closed")]
    _fails(
        db,
        "SELECT aidb_memory.namespace_drop(%s, 'again')",
        (NS,),
        "42704",
        user=ADMIN_USER,
    )


def test_namespace_drop_refusals(db: Database) -> None:
    q = "SELECT aidb_memory.namespace_drop(%s, %s)"
    message = _fails(db, q, ("pg_agents", "tidy"), "55000", user=ADMIN_USER)
    assert message.startswith('aidb_memory.namespace_drop: namespace "pg_agents" belongs to')
    assert _fails(db, q, ("x", None), "22004", user=ADMIN_USER).endswith("reason must not be NULL")
    assert _fails(db, q, ("x", ""), "22023", user=ADMIN_USER).endswith("reason must not be empty")
    assert _fails(db, q, (None, "r"), "22004", user=ADMIN_USER).endswith("name must not be NULL")


# --- privileges --------------------------------------------------------------------------------


def test_application_roles_cannot_drop_namespaces_or_read_memories(db: Database) -> None:
    _namespace(db)
    _memory(db, "Alice likes jazz")
    message = _fails(db, "SELECT aidb_memory.namespace_drop(%s, 'r')", (NS,), "42501")
    assert message == "permission denied for function namespace_drop"
    for table in ("memory", "memory_history", "audit_log"):
        for user in (APP_USER, ADMIN_USER):
            _fails(db, f"SELECT count(*) FROM aidb_memory.{table}", None, "42501", user=user)
    assert db.value("SELECT count(*) FROM aidb_memory.namespace WHERE name = %s", (NS,)) == 1
    for signature in (
        "search(text, text, text, integer, text, text, double precision[], jsonb, integer)",
        "list_memories(text, text, text, text, integer, boolean, jsonb, uuid)",
        "get_memory(text, text, uuid, text, boolean)",
        "remember(text, text, text, text, text, jsonb, text, timestamptz, integer)",
        "update_memory(text, text, uuid, text, jsonb, text)",
        "memory_history(text, text, uuid)",
        "delete(text, text, jsonb, text, text, text)",
        "forget(text, text, text)",
    ):
        assert db.value(
            "SELECT has_function_privilege('aidb_users', %s::regprocedure, 'EXECUTE')",
            (f"aidb_memory.{signature}",),
        ), signature
    assert db.value(
        "SELECT has_function_privilege('aidb_admins', "
        "'aidb_memory.namespace_drop(text, text)'::regprocedure, 'EXECUTE')"
    )


def test_the_trigram_threshold_is_the_functions_not_the_sessions(db: Database) -> None:
    """A misspelling whose similarity to the right word is above 0.3 (search's threshold) is
    corrected, whatever the session set."""
    _namespace(db)
    fact = _memory(db, "Alice's favourite colour is turquoise")
    candidates = ["turkish", "turnips", "quoits", "tortoise", "turquoyz", "torquise"]
    similarity = {q: db.value("SELECT similarity(%s, 'turquoise')", (q,)) for q in candidates}
    above = [q for q, s in similarity.items() if s > 0.3]
    assert above, similarity
    with db.connect(APP_USER) as conn:
        conn.execute("SET pg_trgm.similarity_threshold = 0.9")
        for q in above:
            rows = conn.execute(
                "SELECT id::text FROM aidb_memory.search(%s, 'alice', %s)", (NS, q)
            ).fetchall()
            assert rows == [(fact,)], q
        assert conn.execute("SHOW pg_trgm.similarity_threshold").fetchone() == ("0.9",)
