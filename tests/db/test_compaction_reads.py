"""Compaction in budgeted reads (SPEC §3; issue 4 acceptance 1-6).

The model is the fake OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py): its request
log shows what the database sent and how many calls it made.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import APP_USER, Database
from fake_openai import FakeOpenAI, Reply, refused_port, serve

NS = "support"


def _model(db: Database, name: str, base_url: str, **options: Any) -> None:
    opts = {"model": "fake-chat", "base_url": base_url, "max_retries": 0, **options}
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))


def _namespace(db: Database, llm: str | None = None, **config: Any) -> None:
    spec = {"llm": llm} if llm else {}
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (NS, json.dumps(spec), json.dumps(config)),
    )


def _exchange(i: int, size: int = 100) -> list[dict[str, Any]]:
    """One user turn and one assistant turn, each exactly ``size`` chars."""
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(size, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(size, "a")},
    ]


def _add(conn: psycopg.Connection[Any], turns: list[dict[str, Any]], session: str = "s") -> None:
    conn.execute(
        "SELECT aidb_memory.add(%s, 'alice', %s::jsonb, %s)", (NS, json.dumps(turns), session)
    )


def _get(
    conn: psycopg.Connection[Any],
    limit_chars: int | None,
    fallback_model: str | None = None,
    session: str = "s",
) -> tuple[list[dict[str, Any]], int, int, list[str]]:
    row = conn.execute(
        "SELECT items, overflow_chars, compacted_entries, warnings FROM aidb_memory.session_get("
        "%s, 'alice', %s, limit_chars => %s, fallback_model => %s)",
        (NS, session, limit_chars, fallback_model),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3]


def _summaries(db: Database) -> list[tuple[Any, ...]]:
    return db.sql(
        "SELECT from_seq, to_seq, turn_count, chars, model, from_offset, to_offset, content "
        "FROM aidb_memory.summary ORDER BY from_seq"
    )


@pytest.fixture
def app(db: Database) -> Iterator[psycopg.Connection[Any]]:
    with db.connect(APP_USER) as conn:
        yield conn


def test_a_long_session_read_with_a_budget_gets_one_new_summary_then_the_newest_rounds(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    for i in range(1, 11):  # 20 turns of 100 chars: 2,000 chars
        _add(app, _exchange(i))
    fake.queue(Reply(content="S" * 200))
    items, overflow, compacted, warnings = _get(app, 1000)
    assert warnings == []
    # Three quarters of 2,000 chars = 1,500: turns 1-15 (each plain turn is a round of its own).
    summary, *turns = items
    assert summary["kind"] == "summary" and summary["role"] == "system"
    assert summary["content"] == "S" * 200
    assert summary["seq"] is None
    assert summary["meta"] == {"from_seq": 1, "to_seq": 15, "turn_count": 15, "model": "chat"}
    assert [t["seq"] for t in turns] == [16, 17, 18, 19, 20]
    assert compacted == 15
    assert overflow == 0
    (request,) = fake.calls()
    sent = request.body["messages"][-1]["content"]
    assert "question 0001" in sent and "answer 0007" in sent and "question 0008" in sent
    assert "[15]" in sent and "[16]" not in sent and "answer 0008" not in sent, "nothing newer"
    assert _summaries(db) == [(1, 15, 15, 200, "chat", 0, 1500, "S" * 200)]


def _usage(db: Database) -> list[tuple[Any, ...]]:
    return db.sql("SELECT model_name, purpose, outcome FROM aidb_memory.model_usage ORDER BY id")


def _ordinary(turns: int, size: int, limit_chars: int) -> tuple[list[int], int]:
    """The ordinary budgeted result of ``turns`` one-turn rounds of ``size`` chars: the seqs of
    the newest turns that fit, and the overflow."""
    kept = min(turns, limit_chars // size)
    return list(range(turns - kept + 1, turns + 1)), (turns - kept) * size


def _long_session(app: psycopg.Connection[Any], exchanges: int = 10) -> None:
    for i in range(1, exchanges + 1):
        _add(app, _exchange(i))


def _assert_ordinary(result: tuple[Any, ...], warning: str, limit_chars: int = 1000) -> None:
    items, overflow, compacted, warnings = result
    seqs, expected_overflow = _ordinary(20, 100, limit_chars)
    assert warnings == [warning]
    assert [i["seq"] for i in items] == seqs
    assert all(i["kind"] != "summary" for i in items)
    assert (overflow, compacted) == (expected_overflow, 0)


def test_the_summary_covers_whole_rounds_and_the_model_sees_only_them(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """Rounds of four turns sharing a sequence_id (a question, a tool call, its result, an
    answer): the cut at three quarters falls between rounds, never inside one."""
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    for r in range(1, 6):
        meta: dict[str, Any] = {"meta": {"sequence_id": f"round-{r}"}}
        call = {
            "id": f"call_{r}",
            "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order": r})},
        }
        _add(
            app,
            [
                {"role": "user", "content": f"Where is order {r}? ".ljust(200, "."), **meta},
                {"role": "assistant", "content": None, "tool_calls": [call], **meta},
                {"role": "tool", "tool_call_id": f"call_{r}", "content": f"order {r} shipped"},
                {"role": "assistant", "content": f"Order {r} shipped. ".ljust(200, "."), **meta},
            ],
        )
    rounds = db.sql("SELECT seq, round_start, chars FROM aidb_memory.turn ORDER BY seq")
    total = sum(r[2] for r in rounds)
    fake.queue(Reply(content="Five orders asked about."))
    items, overflow, compacted, warnings = _get(app, total - 1)
    assert warnings == []
    ((from_seq, to_seq, turn_count, *_),) = _summaries(db)
    starts = {r[1] for r in rounds}
    assert from_seq == 1 and to_seq + 1 in starts, "the summary ends where a round ends"
    # Three quarters of five equal rounds: the first boundary past 75% is after round 4 (80%);
    # the one after round 3 (60%) falls short.
    assert (to_seq, turn_count, compacted) == (16, 16, 16)
    assert [i["seq"] for i in items[1:]] == [17, 18, 19, 20]
    assert overflow == 0
    (request,) = fake.calls()
    sent = request.body["messages"][-1]["content"]
    assert "lookup_order" in sent and "call_4" in sent and "order 4 shipped" in sent
    assert "call_5" not in sent and "Where is order 5" not in sent


def test_the_summary_reaches_session_messages_and_the_handoff(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(Reply(content="The user asked ten questions."))
    messages = app.execute(
        "SELECT aidb_memory.session_messages(%s, 'alice', 's', 1000)", (NS,)
    ).fetchone()
    assert messages is not None
    assert messages[0][0] == {"role": "system", "content": "The user asked ten questions."}
    assert [m["role"] for m in messages[0][1:]] == [
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    row = app.execute("SELECT handoff FROM aidb_memory.session_end(%s, 'alice', 's')", (NS,))
    handoff = row.fetchone()
    assert handoff is not None
    assert handoff[0]["summary"] == {
        "content": "The user asked ten questions.",
        "from_seq": 1,
        "to_seq": 15,
        "model": "chat",
    }


def test_a_read_within_budget_never_compacts(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    items, overflow, compacted, warnings = _get(app, 2000)
    assert (len(items), overflow, compacted, warnings) == (20, 0, 0, [])
    items, *_ = _get(app, None)
    assert len(items) == 20, "an unbudgeted read returns every turn"
    assert fake.calls() == []


def test_a_second_read_uses_the_summary_without_calling_the_model(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(Reply(content="S" * 200))
    first = _get(app, 1000)
    second = _get(app, 1000)
    assert second == first
    assert len(fake.calls()) == 1
    # Four more turns: the unsummarized 900 chars and the summary's 200 no longer fit 1,000.
    # The next summary starts where the last one ended: 3/4 of 900 is first reached by 7 turns.
    for i in (11, 12):
        _add(app, _exchange(i))
    fake.queue(Reply(content="T" * 100))
    items, overflow, compacted, warnings = _get(app, 1000)
    assert warnings == []
    assert [(s[0], s[1]) for s in _summaries(db)] == [(1, 15), (16, 22)]
    assert [i["content"][:1] for i in items[:2]] == ["S", "T"], "oldest summary first"
    assert [i["seq"] for i in items[2:]] == [23, 24]
    assert (compacted, overflow) == (22, 0)
    sent = fake.calls()[1].body["messages"][-1]["content"]
    assert "S" * 50 not in sent, "a summary is never summarized again"
    assert "[15]" not in sent and "[16]" in sent and "[22]" in sent and "[23]" not in sent
    # A budget with room for the newer summary only: the older one, and the turns it stands
    # for, are left out (history stays contiguous).
    items, overflow, compacted, warnings = _get(app, 400)
    assert [i["content"] for i in items[:1]] == ["T" * 100]
    assert [i["seq"] for i in items[1:]] == [23, 24]
    assert (compacted, overflow, warnings) == (7, 1500, [])
    assert len(fake.calls()) == 2


# --- each warning, and the read still succeeds (acceptance 2) ------------------------------------


def test_budget_too_small_contacts_no_model(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat", compaction_min_target_chars=300)
    _long_session(app)
    _assert_ordinary(_get(app, 1000), "compaction_budget_too_small")
    assert fake.calls() == [] and _usage(db) == []


def test_no_model_is_model_unavailable(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _namespace(db)
    _long_session(app)
    _assert_ordinary(_get(app, 1000), "compaction_model_unavailable")
    _assert_ordinary(_get(app, 1000, "no_such_model"), "compaction_model_unavailable")
    assert fake.calls() == [] and _summaries(db) == []


def test_fallback_model_only_when_the_namespace_names_none(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    with serve() as other:
        _model(db, "own", fake.base_url)
        _model(db, "fallback", other.base_url)
        _namespace(db)
        _long_session(app)
        other.queue(Reply(content="from the fallback"))
        items, *_ = _get(app, 1000, "fallback")
        assert items[0]["meta"]["model"] == "fallback"
        assert len(other.calls()) == 1
        db.sql('SELECT aidb_memory.namespace_update(%s, \'{"llm": "own"}\')', (NS,))
        fake.queue(Reply(content="from its own model"))
        for i in (11, 12, 13):
            _add(app, _exchange(i))
        items, *_ = _get(app, 1000, "fallback")
        summaries = [(i["meta"]["model"], i["content"]) for i in items if i["kind"] == "summary"]
        assert summaries == [("fallback", "from the fallback"), ("own", "from its own model")]
        assert (len(fake.calls()), len(other.calls())) == (1, 1)


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        (Reply(status=500), "error"),
        (Reply(raw="{this is not json"), "error"),
        (Reply(raw=json.dumps({"choices": []})), "error"),
        (Reply(content="   "), "ok"),
    ],
    ids=["http-500", "malformed-json", "no-choices", "blank-answer"],
)
def test_a_failed_call_is_call_failed(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any], reply: Reply, outcome: str
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(reply)
    _assert_ordinary(_get(app, 1000), "compaction_call_failed")
    assert _summaries(db) == []
    assert _usage(db) == [("chat", "compaction", outcome)]


def test_connection_refused_is_call_failed(db: Database, app: psycopg.Connection[Any]) -> None:
    _model(db, "chat", f"http://127.0.0.1:{refused_port()}/v1")
    _namespace(db, "chat")
    _long_session(app)
    _assert_ordinary(_get(app, 1000), "compaction_call_failed")


def test_a_timeout_is_call_failed(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat", llm_timeout_s=1)
    _long_session(app)
    fake.queue(Reply(content="too late", delay=30))
    started = time.monotonic()
    _assert_ordinary(_get(app, 1000), "compaction_call_failed")
    # Long before the answer would come: the 1 s timeout ended the call (the margin is for a
    # loaded machine, where the backend's first `import openai` alone can take seconds).
    assert time.monotonic() - started < 20
    assert _usage(db) == [("chat", "compaction", "timeout")]


def test_overlength_twice_is_summary_overlength(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(Reply(content="L" * 251), Reply(content="M" * 300))
    _assert_ordinary(_get(app, 1000), "compaction_summary_overlength")
    first, retry = fake.calls()
    assert retry.body["messages"][:2] == first.body["messages"]
    assert retry.body["messages"][2] == {"role": "assistant", "content": "L" * 251}
    assert "251 characters; the limit is 250" in retry.body["messages"][3]["content"]
    assert _summaries(db) == []


def test_one_overlength_answer_is_retried_once(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(Reply(content="L" * 251), Reply(content="short enough"))
    items, _, compacted, warnings = _get(app, 1000)
    assert warnings == [] and compacted == 15
    assert items[0]["content"] == "short enough"
    assert len(fake.calls()) == 2


def test_the_builtin_summarizer_compacts_offline(
    db: Database, app: psycopg.Connection[Any]
) -> None:
    db.sql("SELECT aidb_memory.create_model('extractive', 'builtin', '{\"kind\": \"extractive\"}')")
    _namespace(db, "extractive")
    _long_session(app)
    items, overflow, compacted, warnings = _get(app, 1000)
    assert warnings == [] and compacted == 15 and overflow == 0
    summary = items[0]["content"]
    assert summary.startswith("[Extractive summary of turns 1-15")
    assert "not a model" in summary.splitlines()[0]
    assert len(summary) <= 250
    assert _get(app, 1000) == (items, overflow, compacted, warnings), "deterministic, stored"


# --- a database error inside compaction (acceptance 3) --------------------------------------------


def test_a_database_error_inside_compaction_does_not_fail_the_read(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    db.sql(
        """
        CREATE FUNCTION public.refuse_summaries() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'summaries are refused today'; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON aidb_memory.summary
            FOR EACH ROW EXECUTE FUNCTION public.refuse_summaries();
        """
    )
    fake.queue(Reply(content="a fine summary"))
    _assert_ordinary(_get(app, 1000), "compaction_call_failed")
    assert _summaries(db) == []
    assert _usage(db) == [("chat", "compaction", "ok")], "the call's usage is kept"
    # In an explicit transaction too: the read's transaction is still usable afterwards.
    with db.connect(APP_USER, autocommit=False) as conn:
        _assert_ordinary(_get(conn, 1000), "compaction_call_failed")
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.commit()


# --- concurrency (acceptance 4) ------------------------------------------------------------------


def test_a_concurrent_read_returns_at_once_with_compaction_busy(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(Reply(content="the slow summary", delay=3))
    first: dict[str, Any] = {}

    def slow_read() -> None:
        with db.connect(APP_USER) as conn:
            first["result"] = _get(conn, 1000)
            first["done"] = time.monotonic()

    thread = threading.Thread(target=slow_read)
    thread.start()
    deadline = time.monotonic() + 10
    while not fake.calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.calls(), "the first read is waiting on the model"
    second = _get(app, 1000)
    second_done = time.monotonic()
    thread.join(15)
    assert not thread.is_alive()
    assert second_done < first["done"], "the second read did not wait for the first"
    _assert_ordinary(second, "compaction_busy")
    items, _, compacted, warnings = first["result"]
    assert warnings == [] and compacted == 15 and items[0]["content"] == "the slow summary"
    assert len(fake.calls()) == 1, "exactly one model call"
    assert len(_summaries(db)) == 1


def test_a_pop_waits_for_a_compaction_in_flight(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    """session_pop never removes a turn that a compaction is summarizing."""
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    _long_session(app)
    fake.queue(Reply(content="summary of 1-15", delay=2))
    thread = threading.Thread(target=lambda: _get(db.connect(APP_USER), 1000))
    thread.start()
    deadline = time.monotonic() + 10
    while not fake.calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    popped = [
        app.execute("SELECT aidb_memory.session_pop(%s, 'alice', 's')", (NS,)).fetchone()
        for _ in range(6)
    ]
    thread.join(15)
    assert [p[0]["seq"] for p in popped if p] == [20, 19, 18, 17, 16, 15]
    # Popping turn 15 and then 14 made 14 the newest round: the summary of 1-15 went with it.
    assert _summaries(db) == []
    items, *_ = _get(app, None)
    assert [i["seq"] for i in items] == list(range(1, 15))


# --- amortization (acceptance 5) -----------------------------------------------------------------


def test_amortized_compaction_over_400_exchanges(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat")
    budget = 2000
    made: list[str] = []

    def answer(_request: Any) -> Reply:
        made.append(f"summary number {len(made) + 1}: " + "z" * (len(made) * 37 % 400))
        return Reply(content=made[-1])

    fake.default = answer
    total_chars = 0
    for i in range(1, 401):
        user = f"q{i} " + "u" * (i * 13 % 150)
        assistant = f"a{i} " + "v" * (i * 29 % 220)
        total_chars += len(user) + len(assistant)
        _add(app, [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}])
        before = len(fake.calls())
        items, _, _, warnings = _get(app, budget)
        assert len(fake.calls()) - before <= 1, f"more than one call in read {i}"
        assert warnings == [], (i, warnings)
        assert sum(len(x["content"]) for x in items) <= budget
        assert items[-1]["content"] == assistant, "the newest turn is always there"
    calls = fake.calls()
    assert len(calls) <= total_chars // (budget // 2) + 1, (len(calls), total_chars)
    assert len(calls) >= 2
    for request in calls:
        sent = json.dumps(request.body["messages"])
        assert "summary number" not in sent, "a summary was summarized"
    ranges = [(s[0], s[1]) for s in _summaries(db)]
    assert ranges[0][0] == 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges)), "contiguous, disjoint"


# --- cancellation (acceptance 6) -----------------------------------------------------------------


def test_cancelling_a_read_that_waits_on_the_model(
    db: Database, fake: FakeOpenAI, app: psycopg.Connection[Any]
) -> None:
    _model(db, "chat", fake.base_url)
    _namespace(db, "chat", llm_timeout_s=30)
    _long_session(app)
    before = db.sql("SELECT seq, content FROM aidb_memory.turn ORDER BY seq")
    fake.queue(Reply(content="much too late", delay=20))
    outcome: dict[str, Any] = {}
    with db.connect(APP_USER) as conn:
        pid = conn.info.backend_pid

        def run() -> None:
            try:
                _get(conn, 1000)
                outcome["result"] = "returned"
            except psycopg.Error as e:
                outcome["error"] = e
            outcome["at"] = time.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        while not fake.calls() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake.calls()
        cancelled_at = time.monotonic()
        assert db.value("SELECT pg_cancel_backend(%s)", (pid,)) is True
        thread.join(10)
        assert not thread.is_alive()
        error = outcome.get("error")
        assert isinstance(error, psycopg.Error), outcome
        assert error.sqlstate == "57014"
        assert outcome["at"] - cancelled_at < 2.5
        assert db.sql("SELECT seq, content FROM aidb_memory.turn ORDER BY seq") == before
        assert _summaries(db) == [] and _usage(db) == []
        # The lock went with the cancelled transaction: the next read compacts.
        fake.queue(Reply(content="on time"))
        items, *_ = _get(conn, 1000)
        assert items[0]["content"] == "on time"
