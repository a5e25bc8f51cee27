"""Bench rows (o) and (p) (issue 36): what watching the product costs.

(o) ``aidb_memory.metrics()``, the rows a Prometheus scrape reads (through the worker's exporter
or postgres_exporter), with 1,000,000 events and 1,000,000 model calls in the database: p95 of
100 calls, every row fetched, must be at most 50 ms (a scrape every 15 s). The events and model
calls are generated in SQL (most events processed, 1,000 ready, 100 failed, over 50 namespaces),
and so are the counters they would have left (every namespace, kind, outcome, model, purpose and
slot: the most rows the counter tables hold for such a database), as (e)'s memories are.

(p) The worker's throughput while it is scraped, against the same worker unscraped: rounds in
alternating order, each a backlog of events (``add`` of plain chat turns in a namespace without a
model: verbatim extraction, no model to wait on) committed at once and drained by a fresh
``aidb-memory worker`` process, one side started with ``--metrics-port`` and fetched every second
(15 times as often as the usual scrape), the other without; events per second from the commit to
the last event done. Median of the scraped side over the other: at least 0.98.

It runs in two databases of its own on the first server, while (j)'s index builds.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import gate
import psycopg

DB = "monitoring"
O_TARGET_MS = 50.0
O_CALLS = 100
P_TARGET = 0.98
P_NS = "p_worker"
NAMESPACES = 50
EVENTS = 1_000_000
MODEL_CALLS = 1_000_000
MODELS = ("gpt-4o-mini", "claude-haiku", "local-llama")
PURPOSES = ("extraction", "compaction", "compaction_ahead", "embedding")
OUTCOMES = ("ok", "error")
SLOTS = 8
INIT = "SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')"

# Events of 50 actors per namespace, created over the last 30 days; 1,000 ready and 100 failed
# (a healthy queue), the rest processed.
_EVENTS = """
INSERT INTO aidb_memory.event
    (actor_key, namespace_id, actor_id, turn_count, status, attempts, created_at, processed_at)
SELECT aidb_memory.actor_key(n.name, 'user' || (g %% 50)), n.id, 'user' || (g %% 50), 2,
       CASE WHEN g <= 1000 THEN 'accepted' WHEN g <= 1100 THEN 'failed' ELSE 'processed' END,
       CASE WHEN g <= 1000 THEN 0 ELSE 1 END,
       now() - make_interval(secs => (%(events)s - g) * 2.5),
       CASE WHEN g > 1000 THEN now() - make_interval(secs => (%(events)s - g) * 2.5) END
FROM generate_series(1, %(events)s) AS g
JOIN aidb_memory.namespace AS n ON n.name = 'ns' || (1 + g %% %(namespaces)s)
"""
_MODEL_CALLS = """
INSERT INTO aidb_memory.model_usage
    (at, model_name, namespace_id, purpose, chars_in, chars_out, tokens_in, tokens_out,
     latency_ms, outcome)
SELECT now() - make_interval(secs => g * 2.5), (%(models)s::text[])[1 + g %% 3], n.id,
       (%(purposes)s::text[])[1 + g %% 4], 2000, 300, 500, 80, 200 + g %% 5000,
       CASE WHEN g %% 50 = 0 THEN 'error' ELSE 'ok' END
FROM generate_series(1, %(calls)s) AS g
JOIN aidb_memory.namespace AS n ON n.name = 'ns' || (1 + g %% %(namespaces)s)
"""
# The counters such a database has: one row per label set and slot.
_COUNTERS = [
    """
    INSERT INTO aidb_memory.metric_event (kind, outcome, namespace_id, slot, events)
    SELECT k, o, n.id, s, 1 + (n.id * 7 + s) %% 5000
    FROM aidb_memory.namespace AS n,
         unnest('{extraction,compaction,embedding}'::text[]) AS k,
         unnest('{processed,skipped,failed,retry}'::text[]) AS o, generate_series(0, 7) AS s
    """,
    """
    INSERT INTO aidb_memory.metric_model_call
        (model_name, purpose, outcome, namespace_id, slot, calls)
    SELECT m, p, o, n.id, s, 220
    FROM aidb_memory.namespace AS n, unnest(%(models)s::text[]) AS m,
         unnest(%(purposes)s::text[]) AS p, unnest(%(outcomes)s::text[]) AS o,
         generate_series(0, 7) AS s
    """,
    """
    INSERT INTO aidb_memory.metric_model_latency
        (model_name, purpose, slot, calls, tokens_in, tokens_out, duration_ms, buckets)
    SELECT m, p, s, 22000, 11000000, 1760000, 66000000,
           '{100,200,300,1000,6000,10000,3000,1000,300,100,0}'::bigint[]
    FROM unnest(%(models)s::text[]) AS m, unnest(%(purposes)s::text[]) AS p,
         generate_series(0, 7) AS s
    """,
    """
    INSERT INTO aidb_memory.metric_compaction (mode, namespace_id, slot, summaries)
    SELECT d, n.id, s, 40
    FROM aidb_memory.namespace AS n, unnest('{ahead,inline}'::text[]) AS d,
         generate_series(0, 7) AS s
    """,
]


def build_o(dsn: str, say: Callable[[str], None]) -> dict[str, Any]:
    """(o)'s database: 50 namespaces, the events, the model calls, the counters; analyzed."""
    started = time.perf_counter()
    params = {
        "events": EVENTS,
        "calls": MODEL_CALLS,
        "namespaces": NAMESPACES,
        "models": list(MODELS),
        "purposes": list(PURPOSES),
        "outcomes": list(OUTCOMES),
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(1, NAMESPACES + 1):
            conn.execute(
                "SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')", (f"ns{i}",)
            )
        conn.execute(_EVENTS, params)
        conn.execute(_MODEL_CALLS, params)
        for statement in _COUNTERS:
            conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE aidb_memory.event")
        conn.execute("VACUUM ANALYZE aidb_memory.model_usage")
        conn.execute("ANALYZE")
        [[events]] = conn.execute("SELECT count(*) FROM aidb_memory.event")
        [[calls]] = conn.execute("SELECT count(*) FROM aidb_memory.model_usage")
    seconds = time.perf_counter() - started
    say(f"  (o) {events:,} events and {calls:,} model calls generated in {seconds:.0f} s")
    return {"events": events, "model_calls": calls, "namespaces": NAMESPACES, "seconds": seconds}


def measure_o(dsn: str) -> dict[str, Any]:
    """p95 of ``O_CALLS`` calls of metrics(), every row fetched, after 5 untimed ones."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        sql = "SELECT metric, labels, value FROM aidb_memory.metrics(20)"
        for _ in range(5):
            rows = conn.execute(sql, prepare=True).fetchall()
        times = []
        for _ in range(O_CALLS):
            t0 = time.perf_counter()
            rows = conn.execute(sql, prepare=True).fetchall()
            times.append((time.perf_counter() - t0) * 1000)
    p95 = gate.percentile(times, 0.95)
    return {
        "what": "p95 of aidb_memory.metrics(20), every row fetched, with 1,000,000 events and "
        "1,000,000 model calls",
        "calls": O_CALLS,
        "rows": len(rows),
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(p95, 2),
        "target": f"p95 <= {O_TARGET_MS:g} ms",
        "result": "PASS" if p95 <= O_TARGET_MS else "MISS",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_worker(dsn: str, port: int | None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "aidb_memory", "worker", "--dsn", dsn, "--batch", "20"]
    if port is not None:
        command += ["--metrics-port", str(port)]
    worker = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
    )
    assert worker.stdout is not None
    said = []
    for _ in range(3):  # "worker: started" comes after the line saying where the metrics are
        said.append(worker.stdout.readline())
        if said[-1].startswith("worker: started"):
            # Read what it says from then on: a pipe nobody reads fills (64 kB, ~340 lines of
            # "worker: processed ...") and the worker then blocks writing its next line.
            for stream in (worker.stdout, worker.stderr):
                threading.Thread(target=_discard, args=(stream,), daemon=True).start()
            return worker
    worker.kill()
    raise RuntimeError(f"the worker did not start: {''.join(said)}{worker.communicate()[1]}")


def _discard(stream: Any) -> None:
    for _line in stream:
        pass


def _stop_worker(worker: subprocess.Popen[str]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _scrape(port: int, on: threading.Event, stop: threading.Event, scrapes: list[int]) -> None:
    """GET /metrics every second while ``on`` is set, until ``stop``; counts the answers."""
    url = f"http://127.0.0.1:{port}/metrics"
    while not stop.wait(1.0):
        if not on.is_set():
            continue
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                answer.read()
                if answer.status == 200:
                    scrapes.append(1)
        except OSError:
            pass


# A backlog of plain exchanges in one statement, so that it is committed at once and made
# without a round trip per add.
_BACKLOG = """
SELECT count(aidb_memory.add(
    %(ns)s, 'actor' || (g %% 20),
    jsonb_build_array(
        jsonb_build_object('role', 'user', 'content', 'I moved to city ' || g || ' in ' || %(r)s),
        jsonb_build_object('role', 'assistant', 'content', 'Noted.'))))
FROM generate_series(1, %(n)s) AS g
"""
# Events the worker finished so far (its counters: a few rows).
_DONE = "SELECT coalesce(sum(events), 0)::bigint FROM aidb_memory.metric_event"


WARM_UP = 3000


def _wait_for(conn: psycopg.Connection[Any], done: int, seconds: float) -> None:
    """Until the worker has finished ``done`` events in all, or ``seconds``."""
    deadline = time.perf_counter() + seconds
    while _done(conn) < done and time.perf_counter() < deadline:
        time.sleep(0.1)


def _done(conn: psycopg.Connection[Any]) -> int:
    [[n]] = conn.execute(_DONE, prepare=True)
    return int(n)


def measure_p(dsn: str, say: Callable[[str], None], pairs: int, slice_s: float) -> dict[str, Any]:
    """(p): one worker with --metrics-port drains a backlog; in alternating slices of
    ``slice_s`` seconds (``pairs`` of each, in alternating order) /metrics is fetched every
    second or not at all; events finished per second in each slice."""
    port = _free_port()
    on, stop = threading.Event(), threading.Event()
    scrapes: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT aidb_memory.init(%s, '{}', '{}')", (P_NS,))
        worker = _start_worker(dsn, port)
        scraper = threading.Thread(target=_scrape, args=(port, on, stop, scrapes), daemon=True)
        scraper.start()
        try:
            # Warm-up, and how fast this worker drains in its steady state (the backlog's size
            # follows from it): with the tables analyzed, as autovacuum soon has them. Before
            # that the same worker drained 75 events/s, after it 500 (a full run, 12-07).
            conn.execute(_BACKLOG, {"ns": P_NS, "n": WARM_UP, "r": 0})
            conn.execute("ANALYZE aidb_memory.event")
            _wait_for(conn, _done(conn) + 1, 60)  # the worker is at work
            conn.execute("ANALYZE")
            t0, d0 = time.perf_counter(), _done(conn)
            _wait_for(conn, WARM_UP, 300)
            rate = (_done(conn) - d0) / (time.perf_counter() - t0)
            backlog = int(rate * slice_s * 2 * pairs * 2) + WARM_UP
            conn.execute(_BACKLOG, {"ns": P_NS, "n": backlog, "r": 1})
            conn.execute("ANALYZE aidb_memory.event")
            _wait_for(conn, _done(conn) + 1, 60)
            plain: list[float] = []
            scraped: list[float] = []
            for i in range(pairs):
                for side in (False, True) if i % 2 == 0 else (True, False):
                    if side:
                        on.set()
                    else:
                        on.clear()
                    before, t = _done(conn), time.perf_counter()
                    time.sleep(slice_s)
                    rate_now = (_done(conn) - before) / (time.perf_counter() - t)
                    (scraped if side else plain).append(rate_now)
            on.clear()
            # Every slice must have had events to work: the backlog outlasted the last one.
            [[waiting]] = conn.execute(
                "SELECT count(*) FROM aidb_memory.event WHERE status = 'accepted'"
            )
        finally:
            stop.set()
            scraper.join()
            _stop_worker(worker)
    if not waiting:
        raise RuntimeError("(p): the backlog ran out before the last slice; make it larger")
    if not (statistics.median(plain) and statistics.median(scraped)):
        # A slice in which the worker finished nothing with events waiting: no ratio.
        say(f"  (p) the worker stopped claiming with {waiting:,} events waiting")
        return {
            "what": "worker throughput (events/s) while /metrics is fetched every second / "
            "while not",
            "plain_events_per_s": [round(x, 1) for x in plain],
            "scraped_events_per_s": [round(x, 1) for x in scraped],
            "stalled_with_waiting": waiting,
            "measured": None,
            "target": f">= {P_TARGET}",
            "result": "MISS",
        }
    say(
        f"  (p) {backlog:,} events; {statistics.median(plain):.0f} events/s unscraped, "
        f"{statistics.median(scraped):.0f} scraped ({len(scrapes)} scrapes)"
    )
    ratio = statistics.median(scraped) / statistics.median(plain)
    return {
        "what": "worker throughput (events/s) while /metrics is fetched every second / while not",
        "pairs": pairs,
        "slice_s": slice_s,
        "backlog": backlog,
        "plain_events_per_s": [round(x, 1) for x in plain],
        "scraped_events_per_s": [round(x, 1) for x in scraped],
        "scrapes": len(scrapes),
        "measured": round(ratio, 3),
        "target": f">= {P_TARGET}",
        "result": "PASS" if ratio >= P_TARGET else "MISS",
    }


def run(
    server_dsn: Callable[[str], str], say: Callable[[str], None], quick: bool
) -> dict[str, Any]:
    """(o) in the database ``monitoring``, (p) in ``monitoring_p`` (its worker must not meet
    (o)'s generated queue), both on the server of ``server_dsn`` (created and installed here)."""
    from aidb_memory.install.installer import Package, install

    dsns = []
    for name in (DB, DB + "_p"):
        with psycopg.connect(server_dsn("postgres"), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        dsns.append(server_dsn(name))
        with psycopg.connect(dsns[-1]) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.commit()
    say("bench: (o) metrics() with 1,000,000 events and 1,000,000 model calls")
    data = build_o(dsns[0], say)
    o = measure_o(dsns[0])
    say("bench: (p) the worker's throughput, scraped every second and not")
    p = measure_p(dsns[1], say, pairs=2 if quick else 10, slice_s=1.5 if quick else 3.0)
    return {"data": data, "o": o, "p": p}


def report(found: dict[str, Any]) -> None:
    o, p = found["o"], found["p"]
    print(
        f"(o) {o['what']}: p50 {o['p50_ms']:.1f} ms, p95 {o['p95_ms']:.1f} ms "
        f"({o['rows']} rows), target {o['target']}  {o['result']}"
    )
    scraped, plain = (
        statistics.median(p[k]) for k in ("scraped_events_per_s", "plain_events_per_s")
    )
    if p["measured"] is None:
        print(
            f"(p) {p['what']}: none, the worker stopped claiming with "
            f"{p['stalled_with_waiting']:,} events waiting  {p['result']}"
        )
        return
    print(
        f"(p) {p['what']}: {p['measured']:.3f} (median {scraped} / {plain} events/s, "
        f"{p['scrapes']} scrapes), "
        f"target {p['target']}  {p['result']}"
    )
