"""Where the time of (a) and (b) goes, from the server's own statistics (bench/README.md).

One throwaway server with pg_stat_statements (track = all: the statements our functions run are
counted too) and track_functions = all; (b)'s 1,000-turn session built by 500 adds; then N calls
of `add`, of the budgeted `session_get` and of (d)'s `session_messages(limit_turns => 20)`, each
followed by the per-function means (pg_stat_user_functions: total and self µs per call) and the
busiest statements
(pg_stat_statements: µs per call), and the client round trip of `SELECT 1` and of (a)'s plain-SQL
reference for scale.

    .venv/bin/python bench/hot_path_profile.py [N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ACTOR, INIT, KEY, NS
from sessions import A_TURNS, ADD, ADD_REF, GET, MESSAGES, exchange

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer

ARGS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c track_functions=all"
)
FUNCTIONS = """
SELECT funcname, calls, round((total_time / calls * 1000)::numeric, 1) AS total_us,
       round((self_time / calls * 1000)::numeric, 1) AS self_us
FROM pg_stat_user_functions WHERE calls > 0 AND funcname NOT LIKE 'pg_stat%'
ORDER BY total_time DESC
"""
STATEMENTS = """
SELECT calls, round((total_exec_time / calls * 1000)::numeric, 1) AS exec_us,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query
FROM pg_stat_statements WHERE calls >= %s ORDER BY total_exec_time DESC LIMIT 8
"""


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    with ThrowawayServer(postgres_args=ARGS) as server:
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE profile")
        dsn = server.dsn("profile")
        with psycopg.connect(dsn) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.commit()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute(INIT, (NS,))
            for sid in ("a", "r", "small"):
                conn.execute(
                    "SELECT * FROM aidb_memory.session_start(%s, 'alice', NULL, %s)", (NS, sid)
                )
            for seq in range(1, 1000, 2):
                conn.execute(ADD, (NS, "alice", exchange(seq), "small"), prepare=True)
            conn.execute("ANALYZE")
            for op in ("add", "session_get", "session_messages"):
                conn.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")
                t0 = time.perf_counter()
                for _ in range(n):
                    if op == "add":
                        conn.execute(ADD, (NS, "alice", A_TURNS, "a"), prepare=True)
                    elif op == "session_get":
                        conn.execute(GET, (NS, "alice", "small", 8000), prepare=True).fetchall()
                    else:
                        conn.execute(MESSAGES, (NS, "alice", "small", 20), prepare=True).fetchall()
                mean = (time.perf_counter() - t0) / n * 1e6
                time.sleep(1)  # function statistics reach the view when the backend reports them
                print(f"== {op}: {n} calls, client mean {mean:.0f} µs")
                for row in conn.execute(FUNCTIONS):
                    print("  function  {}: calls {}, total {} µs, self {} µs".format(*row))
                for row in conn.execute(STATEMENTS, (n,)):
                    print("  statement calls {}, {} µs: {}".format(*row))
            refs = [
                ("SELECT 1", "SELECT 1", None),
                (
                    "(a)'s plain-SQL reference",
                    ADD_REF,
                    {"ns": NS, "actor": ACTOR, "key": KEY, "sid": "r", "turns": A_TURNS},
                ),
            ]
            for name, sql, params in refs:
                conn.execute("SELECT pg_stat_statements_reset()")
                t0 = time.perf_counter()
                for _ in range(n):
                    conn.execute(sql, params, prepare=True).fetchall()
                print(f"== {name}: client mean {(time.perf_counter() - t0) / n * 1e6:.0f} µs")
                for row in conn.execute(STATEMENTS, (n,)):
                    print("  statement calls {}, {} µs: {}".format(*row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
