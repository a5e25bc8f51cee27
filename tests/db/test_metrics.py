"""aidb_memory.metrics() (issue 36): the samples an operator's Prometheus scrapes, from counters
kept as events finish, model calls are recorded and summaries are written, and from the queue's
partial indexes.

Events and model calls are driven through the worker (process_events) with the fake
OpenAI-compatible server (tests/fake_openai.py), which fails the calls it is told to.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import ADMIN_USER, APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply, Request, serve

NS = "metered"
FACT = json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
FAILING = "please fail"
LE = ["0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "120", "+Inf"]
Sample = tuple[str, dict[str, str], float]


def _answer(request: Request) -> Reply:
    """A fact, or HTTP 500 for an event whose turn holds FAILING."""
    if FAILING in json.dumps(request.body.get("messages", [])):
        return Reply(status=500, raw='{"error": {"message": "boom"}}')
    return Reply(content=FACT)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = _answer
        yield server


def _model(db: Database, fake: FakeOpenAI, name: str = "chat") -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))


def _init(db: Database, name: str, model_spec: dict[str, Any], **config: Any) -> None:
    db.sql(
        "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
        (name, json.dumps(model_spec), json.dumps({"llm_timeout_s": 5, **config})),
    )


def _add(db: Database, text: str, actor: str = "alice", ns: str = NS) -> str:
    return str(
        db.value(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')",
            (ns, actor, json.dumps([{"role": "user", "content": text}])),
            user=APP_USER,
        )
    )


def _work(db: Database, max_attempts: int = 5, backoff_s: float = 0.0) -> tuple[Any, ...]:
    with db.connect(WORKER_USER) as conn:
        row = conn.execute(
            "CALL aidb_memory.process_events(max_events => 100, lease_s => 60, "
            "max_attempts => %s::int, backoff_s => %s::real)",
            (max_attempts, backoff_s),
        ).fetchone()
    assert row is not None
    return tuple(row)


def _metrics(
    db: Database, max_namespaces: int | None = None, user: str = WORKER_USER
) -> list[Sample]:
    if max_namespaces is None:
        rows = db.sql("SELECT metric, labels, value FROM aidb_memory.metrics()", user=user)
    else:
        rows = db.sql(
            "SELECT metric, labels, value FROM aidb_memory.metrics(%s)",
            (max_namespaces,),
            user=user,
        )
    return [(str(m), dict(labels), float(v)) for m, labels, v in rows]


def _value(samples: list[Sample], metric: str, **labels: str) -> float | None:
    found = [v for m, lb, v in samples if m == metric and lb == labels]
    assert len(found) <= 1, (metric, labels, found)
    return found[0] if found else None


def test_every_gauge_is_there_before_anything_happened(db: Database) -> None:
    samples = _metrics(db)
    kinds = ("compaction", "embedding", "extraction")
    statuses = ("failed", "processing", "ready", "waiting")
    for kind in kinds:
        for status in statuses:
            assert _value(samples, "aidb_memory_queue_events", kind=kind, status=status) == 0
        assert _value(samples, "aidb_memory_queue_latency_seconds", kind=kind) == 0
    assert _value(samples, "aidb_memory_worker_last_batch_timestamp_seconds") == 0
    assert _value(samples, "aidb_memory_queue_events_estimated") == 0
    # Counters only once they have counted something.
    assert {m for m, _, _ in samples} == {
        "aidb_memory_queue_events",
        "aidb_memory_queue_events_estimated",
        "aidb_memory_queue_latency_seconds",
        "aidb_memory_worker_last_batch_timestamp_seconds",
    }
    # Ordered by metric, then labels (the contract with the exporters).
    keys = [(m, json.dumps(lb, sort_keys=True)) for m, lb, _ in samples]
    assert [k[0] for k in keys] == sorted(k[0] for k in keys)
    assert all(isinstance(v, str) for _, labels, _ in samples for v in labels.values())


def test_outcomes_and_model_calls_are_counted_as_the_worker_records_them(
    db: Database, fake: FakeOpenAI
) -> None:
    """One event extracted; one whose model call fails twice: retried once, then failed for
    good (max_attempts 2). The counters, the histogram and by_kind's events say so."""
    _model(db, fake)
    _init(db, NS, {"llm": "chat"})
    good = _add(db, "I collect stamps.")
    bad = _add(db, f"I {FAILING} now.", actor="bob")
    before = time.time()
    processed, failed, retried, by_kind = _work(db, max_attempts=2)
    assert (processed, failed, retried) == (1, 1, 1)

    samples = _metrics(db)
    ns = {"kind": "extraction", "namespace": NS}
    assert _value(samples, "aidb_memory_events_processed_total", **ns) == 1
    assert _value(samples, "aidb_memory_events_failed_total", **ns) == 1
    assert _value(samples, "aidb_memory_events_retried_total", **ns) == 1
    call = {"model": "chat", "purpose": "extraction", "namespace": NS}
    assert _value(samples, "aidb_memory_model_calls_total", outcome="ok", **call) == 1
    assert _value(samples, "aidb_memory_model_calls_total", outcome="error", **call) == 2
    # The histogram: cumulative buckets in le order, +Inf equal to _count, _sum the latencies.
    hist = {"model": "chat", "purpose": "extraction"}
    buckets = [
        (lb["le"], v)
        for m, lb, v in samples
        if m == "aidb_memory_model_call_duration_seconds_bucket" and lb["model"] == "chat"
    ]
    assert [le for le, _ in buckets] == LE
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == 3
    assert _value(samples, "aidb_memory_model_call_duration_seconds_count", **hist) == 3
    latency_ms = db.sql("SELECT latency_ms FROM aidb_memory.model_usage")
    total = sum(r[0] for r in latency_ms) / 1000
    assert _value(samples, "aidb_memory_model_call_duration_seconds_sum", **hist) == pytest.approx(
        total
    )
    bound = {le: float(le) for le in LE[:-1]}
    for le, count in buckets[:-1]:
        assert count == sum(1 for (ms,) in latency_ms if ms <= bound[le] * 1000), le
    tokens = db.sql(
        "SELECT coalesce(sum(tokens_in), 0), coalesce(sum(tokens_out), 0) "
        "FROM aidb_memory.model_usage"
    )[0]
    assert tokens[0] > 0 and tokens[1] > 0
    assert (
        _value(samples, "aidb_memory_model_tokens_total", model="chat", direction="in")
        == (tokens[0])
    )
    assert (
        _value(samples, "aidb_memory_model_tokens_total", model="chat", direction="out")
        == (tokens[1])
    )
    # The queue: the failed event, nothing else.
    assert _value(samples, "aidb_memory_queue_events", kind="extraction", status="failed") == 1
    assert _value(samples, "aidb_memory_queue_events", kind="extraction", status="ready") == 0
    last = _value(samples, "aidb_memory_worker_last_batch_timestamp_seconds")
    assert last is not None and before - 1 <= last <= time.time() + 1

    # by_kind's events: each event handled, in order, with its public id and no actor.
    events = by_kind["events"]
    assert [(e["event"], e["outcome"]) for e in events] == [
        (good, "processed"),
        (bad, "retry"),
        (bad, "failed"),
    ]
    for e in events:
        assert set(e) == {"event", "kind", "namespace", "outcome", "duration_ms"}
        assert (e["kind"], e["namespace"]) == ("extraction", NS)
        assert isinstance(e["duration_ms"], int) and e["duration_ms"] >= 0
    assert "bob" not in json.dumps(by_kind) and "boom" not in json.dumps(by_kind)


def test_an_unfinished_attempt_failed_by_the_claim_is_counted(
    db: Database, fake: FakeOpenAI
) -> None:
    """An event whose last attempt ended without a result (a lapsed lease, attempts used) is
    failed by the next claim: counted as failed too."""
    _model(db, fake)
    _init(db, NS, {"llm": "chat"})
    _add(db, "I collect stamps.")
    db.sql(
        "UPDATE aidb_memory.event SET status = 'processing', attempts = 2, "
        "lease_until = now() - interval '1 second'"
    )
    assert _work(db, max_attempts=2)[:3] == (0, 0, 0)
    ns = {"kind": "extraction", "namespace": NS}
    samples = _metrics(db)
    assert _value(samples, "aidb_memory_events_failed_total", **ns) == 1
    assert _value(samples, "aidb_memory_queue_events", kind="extraction", status="failed") == 1


def test_the_queue_gauges_tell_ready_waiting_processing_and_latency(
    db: Database, fake: FakeOpenAI
) -> None:
    _model(db, fake)
    _init(db, NS, {"llm": "chat"})
    _add(db, f"I {FAILING} now.", actor="bob")
    _work(db, max_attempts=5, backoff_s=3600)  # one attempt failed: waits an hour
    for actor in ("carol", "dave"):
        _add(db, "I collect stamps.", actor=actor)
    # Carol's event was added a while ago (as if the queue had fallen behind).
    db.sql(
        "UPDATE aidb_memory.event SET created_at = now() - interval '100 seconds' "
        "WHERE actor_id = 'carol'"
    )
    # Dave's is being worked (as a claim leaves it).
    db.sql(
        "UPDATE aidb_memory.event SET status = 'processing', lease_until = now() + "
        "interval '1 minute' WHERE actor_id = 'dave'"
    )
    samples = _metrics(db)
    gauge = {
        s: _value(samples, "aidb_memory_queue_events", kind="extraction", status=s)
        for s in ("ready", "waiting", "processing", "failed")
    }
    assert gauge == {"ready": 1, "waiting": 1, "processing": 1, "failed": 0}
    latency = _value(samples, "aidb_memory_queue_latency_seconds", kind="extraction")
    assert latency is not None and 100 <= latency < 160
    assert _value(samples, "aidb_memory_queue_latency_seconds", kind="compaction") == 0


def test_namespaces_past_the_cap_share_other_and_a_call_of_none_has_empty(
    db: Database, fake: FakeOpenAI
) -> None:
    names = ["ns_a", "ns_b", "ns_c"]
    for name in names:
        _init(db, name, {})  # no model: verbatim extraction by the worker
        _add(db, "I collect stamps.", ns=name)
    _work(db)
    ordered = [r[0] for r in db.sql("SELECT name FROM aidb_memory.namespace ORDER BY id")]
    cap = ordered.index("ns_b") + 1  # ns_a and ns_b get a label, ns_c does not
    samples = _metrics(db, cap)
    processed = {
        lb["namespace"]: v
        for m, lb, v in samples
        if m == "aidb_memory_events_processed_total" and lb["kind"] == "extraction"
    }
    assert processed == {"ns_a": 1, "ns_b": 1, "_other": 1}
    everything = _metrics(db, 0)
    assert {lb["namespace"] for _, lb, _ in everything if "namespace" in lb} == {"_other"}
    # A model call of no namespace (model_check) is "".
    _model(db, fake)
    db.sql("SELECT aidb_memory.model_check('chat')", user=ADMIN_USER)
    samples = _metrics(db, cap)
    assert (
        _value(
            samples,
            "aidb_memory_model_calls_total",
            model="chat",
            purpose="check",
            outcome="ok",
            namespace="",
        )
        == 1
    )
    # A dropped namespace's counts stay, under "_other": a sum over namespaces never goes down.
    db.sql("SELECT aidb_memory.namespace_drop('ns_a', 'gone')", user=ADMIN_USER)
    samples = _metrics(db, len(ordered))
    processed = {
        lb["namespace"]: v
        for m, lb, v in samples
        if m == "aidb_memory_events_processed_total" and lb["kind"] == "extraction"
    }
    assert processed == {"ns_b": 1, "ns_c": 1, "_other": 1}
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        _metrics(db, -1)
    assert "aidb_memory.metrics: max_namespaces" in str(info.value)


def _exchange(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {i:04d} ".ljust(100, "q")},
        {"role": "assistant", "content": f"answer {i:04d} ".ljust(100, "a")},
    ]


def test_compactions_are_counted_ahead_and_inline(db: Database, fake: FakeOpenAI) -> None:
    """As tests/db/test_compaction_ahead.py: a read over budget compacts inline; adds past the
    ahead threshold queue a task, which the worker compacts."""
    fake.default = lambda _r: Reply(content="S" * 200)
    _model(db, fake)
    _init(db, "ahead", {"llm": "chat"}, extraction=False)
    with db.connect(APP_USER) as app:
        for i in range(1, 11):
            app.execute(
                "SELECT aidb_memory.add('ahead', 'alice', %s::jsonb, 's')",
                (json.dumps(_exchange(i)),),
            )
        app.execute("SELECT * FROM aidb_memory.session_get('ahead', 'alice', 's', 1000)")
        samples = _metrics(db)
        assert (
            _value(samples, "aidb_memory_compactions_total", mode="inline", namespace="ahead") == 1
        )
        assert (
            _value(samples, "aidb_memory_compactions_total", mode="ahead", namespace="ahead")
            is None
        )
        for i in range(11, 14):
            app.execute(
                "SELECT aidb_memory.add('ahead', 'alice', %s::jsonb, 's')",
                (json.dumps(_exchange(i)),),
            )
    _work(db)
    samples = _metrics(db)
    assert _value(samples, "aidb_memory_compactions_total", mode="ahead", namespace="ahead") == 1
    assert _value(samples, "aidb_memory_compactions_total", mode="inline", namespace="ahead") == 1
    task = {"kind": "compaction", "namespace": "ahead"}
    assert _value(samples, "aidb_memory_events_processed_total", **task) == 1
    purposes = {
        lb["purpose"]: v
        for m, lb, v in samples
        if m == "aidb_memory_model_calls_total" and lb["model"] == "chat"
    }
    assert purposes == {"compaction": 1, "compaction_ahead": 1}


def _scans(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int, int]]:
    """This transaction's (seq_scan, idx_scan, rows written) of our tables so far."""
    rows = conn.execute(
        "SELECT relname, seq_scan, coalesce(idx_scan, 0), n_tup_ins + n_tup_upd + n_tup_del "
        "FROM pg_catalog.pg_stat_xact_user_tables WHERE schemaname = 'aidb_memory'"
    ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_a_scrape_reads_no_aggregate_of_events_or_model_calls(db: Database) -> None:
    """With 20,000 finished events and 20,000 model calls (analyzed), metrics() scans neither
    table whole: model_usage not at all, event only through its partial indexes."""
    db.sql("SELECT aidb_memory.init('bulk', '{}')")
    db.sql(
        """
        INSERT INTO aidb_memory.event (actor_key, namespace_id, actor_id, turn_count, status,
                                       kind, processed_at)
        SELECT aidb_memory.actor_key('bulk', 'a' || (i % 100)), n.id, 'a' || (i % 100), 1,
               CASE WHEN i % 1000 = 0 THEN 'failed' ELSE 'processed' END, 'extraction', now()
        FROM pg_catalog.generate_series(1, 20000) AS i, aidb_memory.namespace AS n
        WHERE n.name = 'bulk'
        """
    )
    db.sql(
        """
        INSERT INTO aidb_memory.model_usage (model_name, namespace_id, purpose, latency_ms, outcome)
        SELECT 'chat', NULL, 'extraction', i % 5000, 'ok'
        FROM pg_catalog.generate_series(1, 20000) AS i
        """
    )
    db.sql("VACUUM ANALYZE aidb_memory.event")
    db.sql("ANALYZE aidb_memory.model_usage")
    with db.connect() as conn, conn.transaction():
        conn.execute("SELECT count(*) FROM aidb_memory.metrics()").fetchone()
        scans = _scans(conn)
    assert scans["model_usage"] == (0, 0, 0)
    assert scans["event"][0] == 0, "no sequential scan of the events"
    assert scans["event"][1] >= 1, "the queue's partial indexes"
    samples = _metrics(db)
    assert _value(samples, "aidb_memory_queue_events", kind="extraction", status="failed") == 20


def test_add_and_reads_never_touch_the_counters(db: Database) -> None:
    """No new work on the hot paths: add, session_get, session_messages, remember and search
    (no model: no model call) neither read nor write a counter table."""
    db.sql("SELECT aidb_memory.init('hot', '{}')")
    turns = json.dumps([{"role": "user", "content": "I collect stamps."}])
    with db.connect(APP_USER) as conn, conn.transaction():
        conn.execute("SELECT aidb_memory.add('hot', 'alice', %s::jsonb, 's')", (turns,))
        conn.execute("SELECT * FROM aidb_memory.session_get('hot', 'alice', 's', 1000)")
        conn.execute("SELECT aidb_memory.session_messages('hot', 'alice', 's', 1000)")
        conn.execute("SELECT aidb_memory.remember('hot', 'alice', 'likes stamps')")
        conn.execute("SELECT * FROM aidb_memory.search('hot', 'alice', 'stamps')")
        scans = _scans(conn)
    touched = {t: s for t, s in scans.items() if t.startswith("metric_") and any(s)}
    assert touched == {}
    assert any(scans["event"]), "the statistics saw the add"


def test_an_error_of_the_query_names_the_function_and_hides_the_sql(db: Database) -> None:
    """A lock held on the queue (as by a migration) and lock_timeout: 55P03, one line naming
    metrics, and no internal SQL in the CONTEXT."""
    with db.connect() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE aidb_memory.event IN ACCESS EXCLUSIVE MODE")
        with db.connect(WORKER_USER) as conn:
            conn.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable) as info:
                conn.execute("SELECT * FROM aidb_memory.metrics()")
    primary = info.value.diag.message_primary or ""
    assert primary.startswith("aidb_memory.metrics: "), primary
    context = info.value.diag.context or ""
    assert "SELECT" not in context and "SQL statement" not in context, context


def _pending(db: Database, n: int, waiting_every: int, done_every: int) -> None:
    """``n`` extraction events in id order: every ``waiting_every``-th of the oldest fifth
    waiting out a backoff, every ``done_every``-th of the rest already processed (as events of
    a namespace without extraction are), the others ready."""
    db.sql("SELECT aidb_memory.init('backlog', '{}')")
    db.sql(
        """
        INSERT INTO aidb_memory.event (actor_key, namespace_id, actor_id, turn_count, status,
                                       kind, next_attempt_at, processed_at)
        SELECT aidb_memory.actor_key('backlog', 'a' || (i %% 100)), n.id, 'a' || (i %% 100), 1,
               CASE WHEN i > %(n)s / 5 AND i %% %(done)s = 0 THEN 'processed' ELSE 'accepted' END,
               'extraction',
               CASE WHEN i <= %(n)s / 5 AND i %% %(waiting)s = 0
                    THEN now() + interval '1 hour' END,
               CASE WHEN i > %(n)s / 5 AND i %% %(done)s = 0 THEN now() END
        FROM pg_catalog.generate_series(1, %(n)s) AS i, aidb_memory.namespace AS n
        WHERE n.name = 'backlog'
        ORDER BY i
        """,
        {"n": n, "waiting": waiting_every, "done": done_every},
    )
    db.sql("ANALYZE aidb_memory.event")


def _queue(db: Database) -> dict[str, int]:
    """The extraction queue's true depth by status, counted."""
    rows = db.sql(
        """
        SELECT CASE WHEN next_attempt_at > now() THEN 'waiting' ELSE 'ready' END, count(*)
        FROM aidb_memory.event WHERE status = 'accepted' GROUP BY 1
        """
    )
    return {status: int(n) for status, n in rows}


def test_a_queue_of_up_to_5000_pending_events_is_counted_exactly(db: Database) -> None:
    _pending(db, 5000, waiting_every=7, done_every=1_000_000)
    samples = _metrics(db)
    truth = _queue(db)
    assert sum(truth.values()) == 5000
    for status in ("ready", "waiting"):
        assert (
            _value(samples, "aidb_memory_queue_events", kind="extraction", status=status)
            == (truth[status])
        )
    assert _value(samples, "aidb_memory_queue_events_estimated") == 0


def test_a_backlog_past_5000_is_estimated_from_a_bounded_read(db: Database) -> None:
    """60,000 events: the oldest fifth with some waiting out a backoff (far older than the
    rest), a third of the others already processed. metrics() reads at most the oldest 5,000
    pending events and a sample of the rest, says its depth is an estimate, and the estimate is
    near the truth; the queue's latency stays exact (the age of the oldest ready event)."""
    _pending(db, 60_000, waiting_every=3, done_every=3)
    db.sql(
        "UPDATE aidb_memory.event SET created_at = now() - interval '1 hour' "
        "WHERE id = (SELECT min(id) FROM aidb_memory.event WHERE status = 'accepted' "
        "AND next_attempt_at IS NULL)"
    )
    truth = _queue(db)
    with db.connect() as conn, conn.transaction():
        rows = conn.execute("SELECT metric, labels, value FROM aidb_memory.metrics()").fetchall()
        [[fetched]] = conn.execute(
            "SELECT idx_tup_fetch + seq_tup_read FROM pg_catalog.pg_stat_xact_user_tables "
            "WHERE relid = 'aidb_memory.event'::regclass"
        ).fetchall()
    samples = [(m, lb, v) for m, lb, v in rows]
    assert fetched <= 6_100, "the oldest 5,000 pending events, 1,000 sampled, a few more"
    assert _value(samples, "aidb_memory_queue_events_estimated") == 1
    ready = _value(samples, "aidb_memory_queue_events", kind="extraction", status="ready")
    waiting = _value(samples, "aidb_memory_queue_events", kind="extraction", status="waiting")
    assert ready is not None and waiting is not None
    assert abs(ready + waiting - sum(truth.values())) <= 0.1 * sum(truth.values()), (truth, ready)
    assert abs(ready - truth["ready"]) <= 0.1 * truth["ready"], (truth, ready)
    assert abs(waiting - truth["waiting"]) <= 0.2 * truth["waiting"], (truth, waiting)
    latency = _value(samples, "aidb_memory_queue_latency_seconds", kind="extraction")
    assert latency is not None and 3600 <= latency < 3700


def test_the_latency_is_exact_when_the_oldest_5000_pending_events_are_all_waiting(
    db: Database,
) -> None:
    """A window of waiting events only (a model failing for hours): the oldest ready event
    behind them is found through the queue's index, not taken as none."""
    _pending(db, 6000, waiting_every=1, done_every=1_000_000)
    db.sql(
        "UPDATE aidb_memory.event SET next_attempt_at = now() + interval '1 hour', "
        "created_at = now() - interval '2 hours' WHERE id <= (SELECT min(id) + 5099 "
        "FROM aidb_memory.event)"
    )
    db.sql(
        "UPDATE aidb_memory.event SET created_at = now() - interval '1 hour' "
        "WHERE id = (SELECT min(id) FROM aidb_memory.event WHERE next_attempt_at IS NULL)"
    )
    samples = _metrics(db)
    assert _value(samples, "aidb_memory_queue_events_estimated") == 1
    latency = _value(samples, "aidb_memory_queue_latency_seconds", kind="extraction")
    assert latency is not None and 3600 <= latency < 3700
