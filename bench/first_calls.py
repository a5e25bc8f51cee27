"""Bench row (f): the first call of our functions on new connections against the first call of a
trivial PL/Python function."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import psycopg
from common import ACTOR, INIT, NS, connect, say
from measuring import median
from sessions import A_TURNS, ADD, GET, exchange

# Every new connection's first call of one of our functions loads the server code into its
# backend (boot.py: stored bytecode, then the modules the call imports). (f) compares that first
# call with the first call of a trivial PL/Python function on a new connection, which pays only
# for starting PL/Python's interpreter: issue 13 asks for ≤ 2×.
FIRST_TRIVIAL_FN = "public.bench_first_call_trivial"
FIRST_TARGET = 2.0
FIRST_CONNECTIONS = 40  # per path; 10 with --quick


def first_calls(dsn: str, connections: int) -> dict[str, Any]:
    """(f): the first call on ``connections`` new connections of each path, side by side (one
    new connection per path in turn, in alternating order), as the superuser like every path.

    Each connection runs ``SELECT 1`` before the timed call, so that connecting and the backend's
    own start (authentication, catalog caches for a first query) are not counted; what is timed
    is one statement, from before it is sent to after its rows are read. Paths: the trivial
    function (``RETURNS int ... AS 'return 1'``), `session_get` of (b) (the 1,000-turn session,
    8,000-char budget) and `add` of (a)'s exchange."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute(
            f"CREATE OR REPLACE FUNCTION {FIRST_TRIVIAL_FN}() RETURNS int "
            "LANGUAGE plpython3u AS 'return 1'"
        )
    statements = {
        "trivial": (f"SELECT {FIRST_TRIVIAL_FN}()", ()),
        "session_get": (GET, (NS, ACTOR, "small", 8000)),
        "add": (ADD, (NS, ACTOR, A_TURNS, "f-first-add")),
    }
    ms: dict[str, list[float]] = {name: [] for name in statements}
    pairs: dict[str, list[float]] = {"session_get": [], "add": []}
    for i in range(connections):
        order = list(statements) if i % 2 == 0 else list(reversed(statements))
        this: dict[str, float] = {}
        for name in order:
            sql, params = statements[name]
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT 1")
                t0 = time.perf_counter_ns()
                conn.execute(sql, params).fetchall()
                this[name] = (time.perf_counter_ns() - t0) / 1e6
            ms[name].append(this[name])
        for name in pairs:
            pairs[name].append(this[name] / this["trivial"])
    trivial = median(ms["trivial"])
    out: dict[str, Any] = {"connections": connections, "target": f"<= {FIRST_TARGET}"}
    for name, values in ms.items():
        out[f"{name}_median_ms"] = round(median(values), 2)
        out[f"{name}_ms"] = [round(v, 2) for v in values]
    for name, ratios in pairs.items():
        out[f"{name}_ratio"] = round(median(ms[name]) / trivial, 3)
        out[f"{name}_median_of_pairs"] = round(median(ratios), 3)
    out["result"] = "PASS" if out["session_get_ratio"] <= FIRST_TARGET else "MISS"
    return out


def report_first_calls(first: dict[str, Any]) -> None:
    print(
        f"(f) the first call on a new connection, {first['connections']} connections per path "
        "side by side (median ms)"
    )
    print(
        f"  trivial PL/Python function {first['trivial_median_ms']:.1f}, "
        f"session_get {first['session_get_median_ms']:.1f}, add {first['add_median_ms']:.1f}"
    )
    print(
        f"  session_get / trivial {first['session_get_ratio']:.2f} (median of pairs "
        f"{first['session_get_median_of_pairs']:.2f}), target {first['target']}  "
        f"{first['result']}"
    )
    print(
        f"  info: add / trivial {first['add_ratio']:.2f} (median of pairs "
        f"{first['add_median_of_pairs']:.2f})"
    )


def only(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--only first-call``: (f) alone, on a 1,000-turn session 'small' made as (b)'s is; the
    run's JSON entries."""
    with connect(dsn) as setup:
        setup.execute(INIT, (NS,))
        for seq in range(1, 1000, 2):
            setup.execute(ADD, (NS, ACTOR, exchange(seq), "small"), prepare=True)
    say("bench: (f) the first call on new connections")
    first = first_calls(dsn, 10 if args.quick else FIRST_CONNECTIONS)
    machine = {"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())}
    return {"machine": machine, "first_calls": first}
