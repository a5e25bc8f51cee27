"""Bench row (g) (issue 13): a long chat read after every exchange, with the worker compacting
ahead of the reads.

One session gets ``exchanges`` exchanges (a 200-char question and a 600-char answer, one ``add``
each) and, after each, ``session_get(limit_chars => 8000)``; the namespace's model is the fake
OpenAI-compatible server of the tests (tests/fake_openai.py), answering every request after 1 s;
``aidb-memory worker`` runs as a subprocess against the same database. Between exchanges the
chat waits ``pace_s`` (the user typing, the application's own model answering: a real chat is
much slower).

The reference is the same chat, side by side: a twin session in a namespace where compaction is
never due (``compaction_min_target_chars`` above a quarter of the budget, so a read over budget
is a plain budgeted read of the newest turns), getting the same add and the same read right
after each exchange of the first, so that both reads are the first after an add, on the same
machine at the same moment.

Counted from ``model_usage.purpose``: the reads that called a model themselves (``compaction``)
against the worker's calls (``compaction_ahead``). Measured: p95 latency of the reads against
p95 of the reference reads, and the total model calls against the bound of compaction.py,
chars / (budget / 2) + 1.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from fake_openai import Reply, serve  # noqa: E402  (the tests' fake server, on a path of its own)

NS = "bench_g"
NS_REF = "bench_g_reference"
ACTOR = "carol"
SESSION = "g-chat"
MODEL = "bench_g_model"
BUDGET = 8000
QUESTION_CHARS, ANSWER_CHARS = 200, 600
MODEL_S = 1.0  # every model answer takes this long
# What the fake model answers: a summary well under the target (8000 / 4), as a model would.
SUMMARY = (
    "Carol is planning a trip and asked about routes, costs and dates; the assistant "
    "answered each question in detail. "
) * 4
INLINE_SHARE_TARGET = 0.02
P95_RATIO_TARGET = 1.5
EXCHANGES = 400
PACE_S = 0.6

ADD = "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)"
GET = "SELECT items, warnings FROM aidb_memory.session_get(%s, %s, %s, limit_chars => %s::int)"
# The namespace's calls by purpose: the reads' own (inline) and the worker's.
USAGE = """
SELECT count(*) FILTER (WHERE u.purpose = 'compaction') AS inline,
       count(*) FILTER (WHERE u.purpose = 'compaction_ahead') AS ahead
FROM aidb_memory.model_usage AS u JOIN aidb_memory.namespace AS n ON n.id = u.namespace_id
WHERE n.name = %s
"""


def exchange(i: int) -> str:
    """Exchange ``i``: a question of exactly 200 chars and an answer of exactly 600."""
    question = f"Question {i}: what about the next leg of the trip, the costs and the dates? "
    answer = f"Answer {i}: the next leg goes by train; here are the costs, times and options. "
    return json.dumps(
        [
            {"role": "user", "content": (question * 4)[:QUESTION_CHARS]},
            {"role": "assistant", "content": (answer * 10)[:ANSWER_CHARS]},
        ]
    )


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def server_packages(dsn: str, target: Path, say: Callable[[str], None]) -> Path:
    """``aidb-memory deps``: the server's Python needs openai to call the fake model; the
    directory, which deps records in ``dsn``'s database."""
    say(f"bench: installing the server's Python packages into {target}")
    done = subprocess.run(
        [sys.executable, "-m", "aidb_memory", "deps", "--target", str(target), "--dsn", dsn],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"aidb-memory deps failed: {done.stderr or done.stdout}")
    return target


class _Worker:
    """``aidb-memory worker`` as a child process whose output is read as it comes (a pipe nobody
    reads fills at 64 kB, ~340 lines of "worker: processed ...", and the worker then blocks
    writing its next line), keeping its last line of standard output."""

    def __init__(self, dsn: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aidb_memory", "worker", "--dsn", dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        first = self.process.stdout.readline()
        if not first.startswith("worker: started"):
            self.process.kill()
            raise RuntimeError(f"the worker did not start: {first}{self.process.communicate()[1]}")
        self.last = ""
        self._readers = [
            threading.Thread(target=self._keep_last, args=(self.process.stdout,), daemon=True),
            threading.Thread(target=self._discard, args=(self.process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _keep_last(self, stream: Any) -> None:
        for line in stream:
            if line.strip():
                self.last = line.strip()

    @staticmethod
    def _discard(stream: Any) -> None:
        for _line in stream:
            pass

    def stop(self) -> str:
        """SIGTERM, then the worker's last line (its totals per kind)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        return self.last


def run(
    dsn: str,
    say: Callable[[str], None],
    exchanges: int = EXCHANGES,
    pace_s: float = PACE_S,
) -> dict[str, Any]:
    """Row (g): the chat, then its numbers (and whether each meets its target)."""
    with tempfile.TemporaryDirectory(prefix="aidb-memory-bench-pylib-") as tmp:
        Path(tmp).chmod(0o755)  # the server's OS user reads it
        server_packages(dsn, Path(tmp) / "site-packages", say)
        with serve() as fake:
            fake.default = lambda _r: Reply(content=SUMMARY, delay=MODEL_S)
            with psycopg.connect(dsn, autocommit=True) as setup:
                options = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
                setup.execute(
                    "SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)",
                    (MODEL, json.dumps(options)),
                )
                setup.execute(
                    "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
                    (NS, json.dumps({"llm": MODEL}), json.dumps({"extraction": False})),
                )
                never = {"extraction": False, "compaction_min_target_chars": 1_000_000}
                setup.execute(
                    "SELECT aidb_memory.init(%s, %s::jsonb, %s::jsonb)",
                    (NS_REF, json.dumps({"llm": MODEL}), json.dumps(never)),
                )
            say(
                f"bench: (g) {exchanges} exchanges, a read of {BUDGET} chars after each, the "
                f"model answering in {MODEL_S:g} s, {pace_s:g} s between exchanges"
            )
            worker = _Worker(dsn)
            try:
                measured = _chat(dsn, exchanges, pace_s)
            finally:
                worker_line = worker.stop()
            requests = len(fake.calls())
    return _result(dsn, measured, exchanges, pace_s, worker_line, requests)


def _chat(dsn: str, exchanges: int, pace_s: float) -> dict[str, Any]:
    reads_ns: list[int] = []
    reference_ns: list[int] = []
    nothing_due_ns: list[int] = []  # the reads of the chat that found nothing due
    inline_reads = busy_reads = other_warnings = 0
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as app, psycopg.connect(dsn) as probe:
        probe.autocommit = True
        app.adapters.register_loader("jsonb", TextLoader)  # server work, not client parsing

        def inline_calls() -> int:
            row = probe.execute(USAGE, (NS,)).fetchone()
            assert row is not None
            return int(row[0])

        read = (NS, ACTOR, SESSION, BUDGET)
        twin = (NS_REF, ACTOR, SESSION, BUDGET)
        for i in range(1, exchanges + 1):
            batch = exchange(i)
            app.execute(ADD, (NS, ACTOR, batch, SESSION), prepare=True)
            before = inline_calls()
            t0 = time.perf_counter_ns()
            row = app.execute(GET, read, prepare=True).fetchone()
            reads_ns.append(time.perf_counter_ns() - t0)
            assert row is not None
            warnings = list(row[1])
            inline = inline_calls() > before
            inline_reads += inline
            busy_reads += "compaction_busy" in warnings
            other_warnings += bool(set(warnings) - {"compaction_busy"})
            if not inline and not warnings:
                nothing_due_ns.append(reads_ns[-1])
            # The reference: the twin, the same add and read, no compaction ever due.
            app.execute(ADD, (NS_REF, ACTOR, batch, SESSION), prepare=True)
            t0 = time.perf_counter_ns()
            app.execute(GET, twin, prepare=True).fetchone()
            reference_ns.append(time.perf_counter_ns() - t0)
            time.sleep(pace_s)
    return {
        "reads_ns": reads_ns,
        "reference_ns": reference_ns,
        "nothing_due_ns": nothing_due_ns,
        "inline_reads": inline_reads,
        "busy_reads": busy_reads,
        "reads_with_other_warnings": other_warnings,
        "seconds": round(time.monotonic() - started, 1),
    }


def _result(
    dsn: str,
    measured: dict[str, Any],
    exchanges: int,
    pace_s: float,
    worker_line: str,
    requests: int,
) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        usage = conn.execute(USAGE, (NS,)).fetchone()
        assert usage is not None
        inline_calls, ahead_calls = int(usage[0]), int(usage[1])
        chars_row = conn.execute(
            "SELECT total_chars FROM aidb_memory.sessions WHERE namespace = %s AND session_id = %s",
            (NS, SESSION),
        ).fetchone()
        assert chars_row is not None
        chars = int(chars_row[0])
        tasks = dict(
            conn.execute(
                "SELECT e.status, count(*) FROM aidb_memory.events AS e "
                "JOIN aidb_memory.namespaces AS n ON n.id = e.namespace_id "
                "WHERE n.name = %s AND e.kind = 'compaction' GROUP BY e.status",
                (NS,),
            ).fetchall()
        )
        summaries = conn.execute(
            "SELECT count(*) FROM aidb_memory.summary AS m "
            "JOIN aidb_memory.session AS s ON s.id = m.session_ref WHERE s.session_id = %s",
            (SESSION,),
        ).fetchone()
    reads = len(measured["reads_ns"])
    read_p95 = p95(measured["reads_ns"]) / 1000
    reference_p95 = p95(measured["reference_ns"]) / 1000
    nothing_due = measured["nothing_due_ns"]
    share = measured["inline_reads"] / reads
    ratio = read_p95 / reference_p95
    calls = inline_calls + ahead_calls
    bound = chars / (BUDGET / 2) + 1
    return {
        "exchanges": exchanges,
        "budget_chars": BUDGET,
        "model_answer_s": MODEL_S,
        "pace_s": pace_s,
        "chat_seconds": measured["seconds"],
        "chars": chars,
        "reads": reads,
        "inline_reads": measured["inline_reads"],
        "inline_share": round(share, 4),
        "inline_share_target": f"<= {INLINE_SHARE_TARGET}",
        "busy_reads": measured["busy_reads"],
        "reads_with_other_warnings": measured["reads_with_other_warnings"],
        "read_p95_us": round(read_p95),
        "reference_p95_us": round(reference_p95),
        "nothing_due_reads": len(nothing_due),
        "nothing_due_p95_us": round(p95(nothing_due) / 1000) if nothing_due else None,
        "read_mean_us": round(sum(measured["reads_ns"]) / reads / 1000),
        "p95_ratio": round(ratio, 3),
        "p95_ratio_target": f"<= {P95_RATIO_TARGET}",
        "model_calls": {"compaction": inline_calls, "compaction_ahead": ahead_calls},
        "fake_model_requests": requests,
        "model_calls_bound": round(bound, 1),
        "summaries": int(summaries[0]) if summaries else 0,
        "tasks": {str(k): int(v) for k, v in tasks.items()},
        "worker": worker_line,
        "result": {
            "inline_share": "PASS" if share <= INLINE_SHARE_TARGET else "MISS",
            "p95_ratio": "PASS" if ratio <= P95_RATIO_TARGET else "MISS",
            "model_calls": "PASS" if calls <= bound else "MISS",
        },
    }


def report(g: dict[str, Any]) -> None:
    """Row (g) as printed lines."""
    r = g["result"]
    calls = g["model_calls"]
    print(
        f"(g) compaction ahead of reads: {g['exchanges']} exchanges of "
        f"{QUESTION_CHARS}+{ANSWER_CHARS} chars, session_get(limit_chars => {g['budget_chars']}) "
        f"after each, model answering in {g['model_answer_s']:g} s, worker running, "
        f"{g['pace_s']:g} s between exchanges ({g['chat_seconds']:.0f} s)"
    )
    print(
        f"    reads calling a model inline: {g['inline_reads']} of {g['reads']} "
        f"({100 * g['inline_share']:.2f}%, target <= {100 * INLINE_SHARE_TARGET:g}%)  "
        f"{r['inline_share']}"
    )
    print(
        f"    p95 read {g['read_p95_us']} µs / p95 of the same reads of a twin session with no "
        f"compaction ever due {g['reference_p95_us']} µs = {g['p95_ratio']:.2f} "
        f"(target <= {P95_RATIO_TARGET:g})  {r['p95_ratio']}"
    )
    print(
        f"    (the chat's own reads that found nothing due: {g['nothing_due_reads']}, p95 "
        f"{g['nothing_due_p95_us']} µs; mean of all its reads {g['read_mean_us']} µs)"
    )
    print(
        f"    model calls {calls['compaction'] + calls['compaction_ahead']} "
        f"(inline {calls['compaction']}, ahead {calls['compaction_ahead']}) <= chars/(budget/2)+1 "
        f"= {g['chars']:,}/{g['budget_chars'] // 2}+1 = {g['model_calls_bound']:g}  "
        f"{r['model_calls']}"
    )
    print(
        f"    reads with compaction_busy: {g['busy_reads']}; summaries: {g['summaries']}; "
        f"tasks: {g['tasks']}"
    )
    print(f"    {g['worker']}")
