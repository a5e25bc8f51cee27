"""add, session_list and session_get latency through a Citus coordinator against one server
(issue 25).

    .venv/bin/python bench/citus_latency.py "host=... dbname=... user=postgres"

The DSN is a database of a running Citus cluster where ``aidb-memory install --citus`` ran (the
cluster of tests/db/test_citus_cluster.py, or your own); the single server is a throwaway one
started here. session_get reads the newest 2,000 chars of the session the adds wrote.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import psycopg

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer

ROUNDS = 300
WARMUP = 50


def measure(dsn: str, label: str) -> None:
    """Median and p90 of ``ROUNDS`` adds, session_lists and session_gets of one actor, prepared,
    autocommit."""
    turns = json.dumps([{"role": "user", "content": "hello there"}])
    add = "SELECT aidb_memory.add('latency', 'a', %s::jsonb, 's')"
    listed = "SELECT * FROM aidb_memory.session_list('latency', 'a')"
    read = "SELECT * FROM aidb_memory.session_get('latency', 'a', 's', 2000)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT aidb_memory.init('latency')")
        for _ in range(WARMUP):
            conn.execute(add, (turns,), prepare=True)
        adds, lists, reads = [], [], []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            conn.execute(add, (turns,), prepare=True)
            adds.append(time.perf_counter() - start)
            start = time.perf_counter()
            conn.execute(listed, prepare=True).fetchall()
            lists.append(time.perf_counter() - start)
            start = time.perf_counter()
            conn.execute(read, prepare=True).fetchall()
            reads.append(time.perf_counter() - start)
    for name, xs in (("add", adds), ("session_list", lists), ("session_get", reads)):
        xs.sort()
        print(
            f"{label}: {name} median {statistics.median(xs) * 1e3:.2f} ms, "
            f"p90 {xs[int(len(xs) * 0.9)] * 1e3:.2f} ms"
        )


def main() -> None:
    measure(sys.argv[1], "citus coordinator")
    server = ThrowawayServer()
    try:
        with psycopg.connect(server.dsn()) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.commit()
        measure(server.dsn(), "one server")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
