"""`make bench-compare BASE=<rev>`: our hot paths at two versions of the code, side by side.

`make bench` compares us with plain SQL and with the peer within one version; its ratios move by
±0.05 from run to run because the machine drifts between and within runs. A question such as
"did this change make `add` 5% slower?" needs both versions measured in the same run, in the same
server, alternating: this script installs each source tree into its own database of one
throwaway server and times (a) `add` of the 2-turn exchange and (b) `session_get` with
`limit_chars => 8000` on a 1,000-turn session, a burst of one version, then of the other, in
alternating order, and prints each version's median and its ratio to the first. With
`--ops` it times the reads of (d) and (d2) too. When the server runs on this machine it also
prints each version's backend CPU time per call (from /proc/<pid>/schedstat), which a busy
machine disturbs much less than the wall-clock time of a round trip.

    .venv/bin/python bench/compare.py before=/path/to/old/checkout after=.

Each tree is installed by its own installer (``PYTHONPATH=<tree>/src``), so any two commits
that have the installer can be compared; `make bench-compare` makes the worktree of BASE.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import INIT, NS  # noqa: E402  (bench/ is not a package)
from sessions import A_TURNS, ADD, GET, exchange  # noqa: E402

from aidb_memory.throwaway import ThrowawayServer  # noqa: E402

ACTOR = "alice"
# The tree's own installer, run in a child process so that each version imports its own package.
INSTALL = """
import sys, psycopg
try:
    from aidb_memory.install.installer import Package, install
except ImportError:  # a tree from before aidb_memory.install (issue 28)
    from aidb_memory.installer import Package, install
with psycopg.connect(sys.argv[1]) as conn:
    install(conn, Package.load(), say=lambda _line: None)
    conn.commit()
"""


def prepare(dsn: str, tree: Path) -> psycopg.Connection[Any]:
    """Install ``tree`` into ``dsn``'s database and build the 1,000-turn session of (b)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, "-c", INSTALL, dsn], check=True, env=env, cwd=tree)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(INIT, (NS,))
    for sid in ("a", "small"):
        conn.execute("SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)", (NS, ACTOR, sid))
    for seq in range(1, 1000, 2):
        conn.execute(ADD, (NS, ACTOR, exchange(seq), "small"), prepare=True)
    conn.execute("ANALYZE")
    return conn


# The reads of (d) and (d2) on the same session: session_messages as (d) and AidbSession call it.
MESSAGES = "SELECT aidb_memory.session_messages(%s, %s, %s, limit_turns => %s)::text"
RESPONSES = (
    "SELECT aidb_memory.session_messages(%s, %s, %s, limit_items => %s, "
    "format => 'responses')::text"
)
OPS = {
    "add": "(a) add",
    "get": "(b) session_get 8,000 chars",
    "messages": "(d) session_messages 20 turns",
    "responses": "(d2) responses 20 items",
    "remember": "remember (a new memory)",
}
# remember's memories: every call a new one (an exact duplicate is not stored again), of a few
# words every memory shares and one of its own, an actor of their own.
REMEMBER = "SELECT aidb_memory.remember(%s, 'rita', %s)::text"
_remembered = itertools.count()


def backend_cpu_ns(pid: int) -> int | None:
    """The CPU time a backend has used so far (None: not readable, e.g. a remote server)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def burst(conn: psycopg.Connection[Any], op: str, n: int) -> float:
    """Mean µs of ``n`` calls of ``op``."""
    t0 = time.perf_counter()
    for _ in range(n):
        if op == "add":
            conn.execute(ADD, (NS, ACTOR, A_TURNS, "a"), prepare=True)
        elif op == "get":
            conn.execute(GET, (NS, ACTOR, "small", 8000), prepare=True).fetchall()
        elif op == "remember":
            k = next(_remembered)
            fact = f"Rita noted item {k} of her trip: tea in Lisbon, code {k * 7919 % 100003}"
            conn.execute(REMEMBER, (NS, fact), prepare=True).fetchall()
        else:
            sql = MESSAGES if op == "messages" else RESPONSES
            conn.execute(sql, (NS, ACTOR, "small", 20), prepare=True).fetchall()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", metavar="LABEL=PATH", help="source trees to compare")
    parser.add_argument("--rounds", type=int, default=80, help="alternating rounds (default 80)")
    parser.add_argument("--burst", type=int, default=30, help="calls per burst (default 30)")
    parser.add_argument(
        "--ops",
        default="add,get",
        help="what to time, comma-separated, of " + ", ".join(OPS) + " (default add,get)",
    )
    args = parser.parse_args()
    trees = []
    for spec in args.trees:
        label, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "src" / "aidb_memory").is_dir():
            parser.error(f"{spec!r}: expected LABEL=PATH of a source tree with src/aidb_memory")
        trees.append((label, Path(path).resolve()))
    ops = args.ops.split(",")
    if not ops or any(op not in OPS for op in ops):
        parser.error(f"--ops: expected some of {', '.join(OPS)}")
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    pids: dict[str, int] = {}
    with ThrowawayServer() as server:
        conns = {}
        for i, (label, tree) in enumerate(trees):
            with psycopg.connect(server.dsn(), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE compare_{i}")
            print(f"compare: installing {label} ({tree})", flush=True)
            conns[label] = prepare(server.dsn(f"compare_{i}"), tree)
            row = conns[label].execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pids[label] = int(row[0])
        for r in range(args.rounds):
            for label, _ in trees if r % 2 == 0 else trees[::-1]:
                for op in ops:
                    before = backend_cpu_ns(pids[label])
                    times.setdefault((label, op), []).append(burst(conns[label], op, args.burst))
                    after = backend_cpu_ns(pids[label])
                    if before is not None and after is not None:
                        used = (after - before) / args.burst / 1000
                        cpu.setdefault((label, op), []).append(used)
            if (r + 1) % 20 == 0:
                print(f"compare: {r + 1}/{args.rounds} rounds", flush=True)
        for conn in conns.values():
            conn.close()
    for op in ops:
        what = OPS[op]
        first = statistics.median(times[(trees[0][0], op)])
        for label, _ in trees:
            median = statistics.median(times[(label, op)])
            line = f"{what:30s} {label:12s} median {median:8.1f} µs  ratio {median / first:.3f}"
            if (label, op) in cpu and (trees[0][0], op) in cpu:
                own = statistics.median(cpu[(label, op)])
                base = statistics.median(cpu[(trees[0][0], op)])
                line += f"  backend cpu {own:7.1f} µs  ratio {own / base:.3f}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
