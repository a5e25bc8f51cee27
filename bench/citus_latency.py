"""Rows (q) and (r) (issue 37): the hot calls of one actor through a Citus coordinator, against
one server, in the same run.

    .venv/bin/python bench/citus_latency.py [--quick]

Starts a single server and a Citus cluster of a coordinator and two workers
(tests/deployments.py, with the citus extension ../shared/citus/build.sh installs), installs
aidb_memory into each (``install --citus`` on the cluster), then:

(q) latency: ``add`` (one turn), ``session_get`` and ``session_messages`` (the newest 2,000
    chars), ``remember`` and ``search`` (full text) of one actor, each call made on the
    coordinator and on the single server in turn, prepared, autocommit: the median and p90 of
    each and their ratios, targets median <= 2x and p90 <= 3x one server; and the commands the
    coordinator sends to the workers for one call (``citus.log_remote_commands``), target 1.
(r) throughput: CLIENTS clients of different actors, each a loop of ``add`` then
    ``session_get``, for a fixed time, on the single server and through the coordinator of the
    two-worker cluster, then of a one-worker one: calls/s, and the CPU per call of every process
    of the server or of the coordinator over the run (from /proc), whose ratio to one server's
    is the coordinator's share of the work (target <= 1.5). On these 2-core machines the calls/s
    of a cluster, all of whose nodes share the cores, are noise-bound; the CPU per call is not.
(s) the worker: EVENTS events (an ``add`` of one user turn each, over CLIENTS actors) drained by
    ``CALL aidb_memory.process_events(max_events => 100)`` until it finds none, on the single
    server and through the two-worker coordinator, with verbatim extraction (no model) and with
    a model (the tests' fake OpenAI-compatible server, answering at once; its calls recorded in
    model_usage and counted in the metrics, as every model call): events/s, and the CPU per
    event of the server's or the coordinator's processes (issue 37, item 5: the worker runs
    through the coordinator; no target).

``make bench`` runs the rows when the citus extension is installed (bench/run.py), the suite's
Citus module runs :func:`latency` and :func:`drain` on its own cluster
(tests/db/test_citus_cluster.py), and this script alone prints them and writes no JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from chat_ahead import server_packages
from concurrency import process_cpu_s

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))
from aidb_memory.throwaway import ThrowawayServer  # noqa: E402
from deployments import citus_available, citus_cluster  # noqa: E402  (the suite's cluster)
from fake_openai import Reply, serve  # noqa: E402  (the tests' fake model server)

NS, DB = "latency", "latency"
CALLS = 300  # of each call on each side, for (q)
WARMUP = 30
CLIENTS = 4  # for (r)
SECONDS = 10.0  # each side of (r)
FACTS = 20  # the searched actor's memories
TARGET_MEDIAN, TARGET_P90, TARGET_CPU = 2.0, 3.0, 1.5
EVENTS = 200  # drained on each side of (s), in each namespace
# (s)'s namespaces: extraction without a model (verbatim: the user's turn stored as it is), and
# with the fake model, which answers every extraction with one fact.
DRAIN_MODEL = "drain_model"
DRAIN = {"verbatim": "drain_verbatim", "model": "drain_model"}
FACT = json.dumps({"operations": [{"op": "add", "text": "The user likes tea.", "target": None}]})

# One actor's hot calls; %(i)s is the call's number (remember writes a new fact each time).
HOT: dict[str, str] = {
    "add": "SELECT aidb_memory.add(%(ns)s, %(actor)s, %(turn)s::jsonb, 's')",
    "session_get": "SELECT * FROM aidb_memory.session_get(%(ns)s, %(actor)s, 's', 2000)",
    "session_messages": "SELECT aidb_memory.session_messages(%(ns)s, %(actor)s, 's', 2000)",
    "remember": "SELECT aidb_memory.remember(%(ns)s, %(actor)s, 'note ' || %(i)s || ' on tea')",
    "search": "SELECT * FROM aidb_memory.search(%(ns)s, %(actor)s, 'tea')",
}
TURN = json.dumps([{"role": "user", "content": "hello there, a line of a conversation"}])


def install(dsn: str, citus: bool) -> None:
    """``aidb-memory install`` (``--citus``) as an operator runs it."""
    args = [sys.executable, "-m", "aidb_memory", "install", "--dsn", dsn]
    done = subprocess.run(args + (["--citus"] if citus else []), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)


def prepare(dsn: str, actors: list[str]) -> None:
    """The namespace (no extraction: no worker runs here), and for each actor a session and
    FACTS memories."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT aidb_memory.init(%s, '{}', '{\"extraction\": false}')", (NS,))
        for actor in actors:
            conn.execute("SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')", (NS, actor, TURN))
            for i in range(FACTS):
                conn.execute(
                    "SELECT aidb_memory.remember(%s, %s, %s)", (NS, actor, f"fact {i} about tea")
                )


def _params(actor: str, i: int) -> dict[str, Any]:
    return {"ns": NS, "actor": actor, "turn": TURN, "i": i}


def remote_commands(dsn: str, sql: str, actor: str) -> list[str]:
    """What the coordinator sends to the workers for the second of two calls."""
    seen: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, _params(actor, -1)).fetchall()
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute(sql, _params(actor, -2)).fetchall()
    return [s for s in seen if s.startswith("issuing ")]


def _summary(us: list[float]) -> dict[str, float]:
    us = sorted(us)
    return {"median_us": round(statistics.median(us)), "p90_us": round(us[int(0.9 * len(us))])}


def latency(coordinator: str, single: str, actor: str, calls: int = CALLS) -> dict[str, Any]:
    """(q): each hot call on the coordinator and on the single server in turn, ``calls`` times
    each after WARMUP; both must hold ``actor``'s session and memories (:func:`prepare`)."""
    found: dict[str, Any] = {}
    with (
        psycopg.connect(coordinator, autocommit=True) as on_cluster,
        psycopg.connect(single, autocommit=True) as on_one,
    ):
        for name, sql in HOT.items():
            times: dict[str, list[float]] = {"citus": [], "one": []}
            for i in range(WARMUP + calls):
                # Alternating which goes first, so that drift hits both alike.
                pairs = [("citus", on_cluster), ("one", on_one)]
                for side, conn in pairs if i % 2 else pairs[::-1]:
                    start = time.perf_counter()
                    conn.execute(sql, _params(actor, i), prepare=True).fetchall()
                    if i >= WARMUP:
                        times[side].append((time.perf_counter() - start) * 1e6)
            citus, one = _summary(times["citus"]), _summary(times["one"])
            found[name] = {
                "citus": citus,
                "one_server": one,
                "median_ratio": round(citus["median_us"] / one["median_us"], 2),
                "p90_ratio": round(citus["p90_us"] / one["p90_us"], 2),
                "remote_commands": len(remote_commands(coordinator, sql, actor)),
            }
    return found


def _cpu_by_process(pids: list[int]) -> dict[int, float]:
    """CPU seconds of each of these processes still running."""
    found = {}
    for pid in pids:
        try:
            found[pid] = process_cpu_s(pid)
        except OSError:
            continue
    return found


def _server_cpu(conn: psycopg.Connection[Any]) -> dict[int, float]:
    """CPU seconds of each process of ``conn``'s server (pg_stat_activity lists them all:
    backends, Citus' daemons, PostgreSQL's own)."""
    return _cpu_by_process([r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity")])


def _cpu_since(start: dict[int, float]) -> float:
    """CPU seconds the processes of ``start`` (:func:`_server_cpu`) spent since. A process that
    ended meanwhile (an autovacuum worker) is left out, not counted negative."""
    now = _cpu_by_process(list(start))
    return sum(now[pid] - start[pid] for pid in start.keys() & now.keys())


def throughput(dsn: str, actors: list[str], seconds: float = SECONDS) -> dict[str, Any]:
    """(r) on one server or coordinator: a client per actor, each a loop of add then
    session_get for ``seconds``; calls/s and the CPU per call of every process of the server
    (:func:`_server_cpu`)."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in actors]
    try:
        for conn, actor in zip(conns, actors, strict=True):
            for i in range(10):
                conn.execute(HOT["add"], _params(actor, i), prepare=True)
                conn.execute(HOT["session_get"], _params(actor, i), prepare=True).fetchall()
        counts = [0] * len(actors)
        stop = threading.Event()

        def client(k: int) -> None:
            conn, actor = conns[k], actors[k]
            while not stop.is_set():
                conn.execute(HOT["add"], _params(actor, counts[k]), prepare=True)
                conn.execute(HOT["session_get"], _params(actor, 0), prepare=True).fetchall()
                counts[k] += 2

        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(actors))]
        cpu0, t0 = _server_cpu(conns[0]), time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        wall, cpu = time.perf_counter() - t0, _cpu_since(cpu0)
    finally:
        for conn in conns:
            conn.close()
    calls = sum(counts)
    return {
        "clients": len(actors),
        "calls": calls,
        "calls_per_s": round(calls / wall),
        "cpu_us_per_call": round(cpu / calls * 1e6),
    }


def prepare_drain(dsn: str, base_url: str, pythonpath: Path) -> None:
    """(s)'s model and namespaces, and the server's package directory (openai, for the model
    calls; ``aidb-memory deps`` filled it for the single server)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO aidb_memory.runtime_settings (key, value) "
            "VALUES ('server_pythonpath', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(pythonpath),),
        )
        options = {"model": "fake-chat", "base_url": base_url, "max_retries": 0}
        conn.execute(
            "SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)",
            (DRAIN_MODEL, json.dumps(options)),
        )
        conn.execute("SELECT aidb_memory.init(%s)", (DRAIN["verbatim"],))
        conn.execute(
            "SELECT aidb_memory.init(%s, %s::jsonb)",
            (DRAIN["model"], json.dumps({"llm": DRAIN_MODEL})),
        )


def drain(dsn: str, ns: str, actors: list[str], events: int = EVENTS) -> dict[str, Any]:
    """(s) on one server or coordinator: ``events`` adds in ``ns``, then process_events until
    it finds none; events/s and the CPU per event of the server's processes
    (:func:`_server_cpu`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(events):
            turn = json.dumps([{"role": "user", "content": f"I drink tea, cup number {i}."}])
            conn.execute(
                "SELECT aidb_memory.add(%s, %s, %s::jsonb, 'drain')",
                (ns, actors[i % len(actors)], turn),
            )
        processed = 0
        cpu0, t0 = _server_cpu(conn), time.perf_counter()
        while True:
            row = conn.execute("CALL aidb_memory.process_events(max_events => 100)").fetchone()
            if not row or not row[0]:
                break
            processed += row[0]
        wall, cpu = time.perf_counter() - t0, _cpu_since(cpu0)
    return {
        "events": processed,
        "events_per_s": round(processed / wall, 1),
        "cpu_us_per_event": round(cpu / max(processed, 1) * 1e6),
    }


def _cluster_database(cluster: Any) -> str:
    cluster.create_database(DB)
    dsn: str = cluster.dsn(DB)
    install(dsn, citus=True)
    return dsn


def run(say: Callable[[str], None], quick: bool = False) -> dict[str, Any]:
    """The rows on servers of their own: a single server, a cluster of two workers, then one of
    one worker. ``{"skipped": why}`` when the citus extension is not installed."""
    calls, seconds, events = (60, 3.0, 40) if quick else (CALLS, SECONDS, EVENTS)
    actors = [f"client-{k}" for k in range(CLIENTS)]
    with ThrowawayServer() as single:
        if not citus_available(single):
            say("bench: (q) and (r) skipped: the citus extension is not installed")
            return {"skipped": "the citus extension is not installed"}
        with psycopg.connect(single.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        one = single.dsn(DB)
        install(one, citus=False)
        prepare(one, ["alice", *actors])
        rows: dict[str, Any] = {"throughput": {}, "worker": {}}
        with citus_cluster(2) as cluster:
            say("bench: (q) hot calls through a Citus coordinator (2 workers) and on one server")
            coordinator = _cluster_database(cluster)
            prepare(coordinator, ["alice", *actors])
            rows["latency"] = latency(coordinator, one, "alice", calls)
            say(f"bench: (r) {CLIENTS} clients of add and session_get, {seconds:g} s a side")
            rows["throughput"]["one_server"] = throughput(one, actors, seconds)
            rows["throughput"]["citus_2_workers"] = throughput(coordinator, actors, seconds)
            rows["worker"] = _drains(one, coordinator, actors, events, say)
        with citus_cluster(1) as cluster:
            coordinator = _cluster_database(cluster)
            prepare(coordinator, actors)
            rows["throughput"]["citus_1_worker"] = throughput(coordinator, actors, seconds)
    one_cpu = rows["throughput"]["one_server"]["cpu_us_per_call"]
    for side in ("citus_1_worker", "citus_2_workers"):
        found = rows["throughput"][side]
        found["cpu_ratio"] = round(found["cpu_us_per_call"] / one_cpu, 2)
    return rows


def _drains(
    one: str, coordinator: str, actors: list[str], events: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """(s): each namespace's drain on the single server, then through the coordinator."""
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aidb-memory-bench-pylib-") as tmp:
        Path(tmp).chmod(0o755)  # the servers' OS user reads it
        pythonpath = server_packages(one, Path(tmp) / "site-packages", say)
        with serve() as fake:
            fake.default = lambda _r: Reply(content=FACT)
            for dsn in (one, coordinator):
                prepare_drain(dsn, fake.base_url, pythonpath)
            say(f"bench: (s) the worker drains {events} events a side and namespace")
            for kind, ns in DRAIN.items():
                found[kind] = {
                    "one_server": drain(one, ns, actors, events),
                    "citus_2_workers": drain(coordinator, ns, actors, events),
                }
                o, c = found[kind]["one_server"], found[kind]["citus_2_workers"]
                found[kind]["cpu_ratio"] = round(c["cpu_us_per_event"] / o["cpu_us_per_event"], 2)
                found[kind]["rate_ratio"] = round(o["events_per_s"] / c["events_per_s"], 2)
    return found


def report(rows: dict[str, Any]) -> None:
    """The rows as tables."""
    if "skipped" in rows:
        print(f"(q), (r) Citus: skipped ({rows['skipped']})")
        return
    print(
        f"(q) through a Citus coordinator (2 workers) / one server, µs; targets median <= "
        f"{TARGET_MEDIAN:g}x, p90 <= {TARGET_P90:g}x, 1 remote command"
    )
    print(f"  {'call':18s} {'citus':>14s} {'one server':>14s} {'ratio':>11s} {'remote':>7s}")
    for name, r in rows["latency"].items():
        c, o = r["citus"], r["one_server"]
        print(
            f"  {name:18s} {c['median_us']:>6} / {c['p90_us']:<6} {o['median_us']:>6} / "
            f"{o['p90_us']:<6} {r['median_ratio']:>5.2f} / {r['p90_ratio']:<5.2f} "
            f"{r['remote_commands']:>6}"
        )
    print(
        f"(r) {CLIENTS} clients of add + session_get; CPU per call of the server's or the "
        f"coordinator's processes, target <= {TARGET_CPU:g}x one server's"
    )
    for side, r in rows["throughput"].items():
        ratio = f", {r['cpu_ratio']:.2f}x one server's" if "cpu_ratio" in r else ""
        print(
            f"  {side:16s} {r['calls_per_s']:>6} calls/s, {r['cpu_us_per_call']:>6} µs CPU a "
            f"call{ratio}"
        )
    for kind, r in rows.get("worker", {}).items():
        o, c = r["one_server"], r["citus_2_workers"]
        if kind == "verbatim":
            print(f"(s) the worker: {o['events']} events drained by process_events on each side")
        print(
            f"  {kind:9s} one server {o['events_per_s']:>7} events/s, {o['cpu_us_per_event']:>6} "
            f"µs CPU an event; coordinator {c['events_per_s']:>7} events/s "
            f"({r['rate_ratio']:.2f}x the time), {c['cpu_us_per_event']:>6} µs CPU an event "
            f"({r['cpu_ratio']:.2f}x)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 calls a side, 3 s of (r) a side")
    args = ap.parse_args()
    rows = run(lambda line: print(line, file=sys.stderr, flush=True), args.quick)
    print()
    report(rows)


if __name__ == "__main__":
    main()
