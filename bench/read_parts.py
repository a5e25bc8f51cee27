"""Where (b)'s gap to its plain-SQL reference is: the read's parts timed side by side
(bench/README.md, "Where the time of (a) and (b) goes").

One throwaway server, (b)'s 1,000-turn session and (c)'s generated 100,000-turn one beside it
(the statistics of make bench), and five paths, each on a connection of its own, run in
interleaved rounds of 200 calls, backend CPU per call from /proc/<pid>/schedstat:

- ``ref``: (b)'s reference, plain SQL with a generic plan, as make bench runs it;
- ``ref_fn``: the same query in a SECURITY DEFINER PL/pgSQL function with session_get's header
  (its SET options, RETURN QUERY, an EXCEPTION block): what any API function written this way
  costs at least;
- ``plan_only``: session_get with its read statement replaced by an empty result: the function
  and the plan of the read;
- ``read_only``: session_get with the plan replaced by its result as constants: the function and
  the read statement;
- ``get``: session_get itself.

    .venv/bin/python bench/read_parts.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ACTOR, INIT, KEY, NS
from sessions import ADD, GET, GET_REF, build_big, exchange

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer

SIGNATURE = "aidb_memory.session_get(text,text,text,integer,text,integer,integer)"
# The plan's columns, in session_read_plan's order and types.
PLAN_TYPES = {
    "actor_key": "bigint",
    "session_ref": "bigint",
    "session_version": "text",
    "summary_seq": "bigint",
    "lo_offset": "bigint",
    "lo_seq": "bigint",
    "hi_offset": "bigint",
    "hi_seq": "bigint",
    "readable_chars": "bigint",
    "summary_room": "bigint",
    "warnings": "text[]",
    "compact": "boolean",
    "pin_seq": "bigint",
    "pinned": "jsonb",
    "summary_slots": "bigint",
    "by_items": "boolean",
    "empty_warning": "text",
}
HEADER = """LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET debug_print_parse = off
SET debug_print_rewritten = off
SET debug_print_plan = off
SET plan_cache_mode = force_generic_plan"""


def _literal(name: str, value: Any) -> str:
    kind = PLAN_TYPES[name]
    if value is None:
        return f"NULL::{kind}"
    if kind == "text[]":
        return "'{" + ",".join(value) + "}'::text[]"
    text = json.dumps(value) if kind == "jsonb" else str(value)
    return "'" + text.replace("'", "''") + f"'::{kind}"


def _cut(src: str, start: str, end: str) -> tuple[str, str]:
    """``src`` before ``start`` and from after ``end``."""
    a = src.index(start)
    b = src.index(end, a) + len(end)
    return src[:a], src[b:]


def variants(src: str, plan: dict[str, Any]) -> dict[str, str]:
    """session_get's installed definition with its read statement, or its plan, cut out."""
    start = "        IF plan.summary_room >= 0 AND plan.by_items THEN\n        RETURN QUERY\n"
    before, after = _cut(src, start, "        ;\n        END IF;")
    empty = "        RETURN QUERY SELECT '[]'::jsonb, 0::bigint, 0, '{}'::text[];"
    plan_only = before + empty + after
    constants = ", ".join(f"{_literal(k, plan[k])} AS {k}" for k in PLAN_TYPES)
    before, after = _cut(src, "    planned := false;\n    DECLARE", "    END;\n")
    read_only = before + f"    SELECT {constants} INTO plan;\n    planned := true;\n" + after
    return {"plan_only": plan_only, "read_only": read_only}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="rounds of 200 calls per path")
    ap.add_argument("--big-turns", type=int, default=100_000, help="turns of the session beside")
    args = ap.parse_args()
    with ThrowawayServer(postgres_args="-c shared_buffers=512MB") as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE parts")
        dsn = server.dsn("parts")
        with psycopg.connect(dsn) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.commit()
        setup = psycopg.connect(dsn, autocommit=True)
        setup.execute(INIT, (NS,))
        for sid in ("small", "big"):
            setup.execute(
                "SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)", (NS, ACTOR, sid)
            )
        for seq in range(1, 1000, 2):
            setup.execute(ADD, (NS, ACTOR, exchange(seq), "small"), prepare=True)
        build_big(setup, args.big_turns)
        [[src]] = setup.execute(f"SELECT pg_get_functiondef('{SIGNATURE}'::regprocedure)")
        [[plan]] = setup.execute(
            "SELECT aidb_memory.session_read_plan_sql(%s, %s, 'small', 8000, NULL, NULL, NULL)",
            (NS, ACTOR),
        )
        for name, text in variants(src, plan).items():
            setup.execute(text.replace("aidb_memory.session_get(", f"public.{name}(", 1))
        ref_fn = GET_REF
        for param, arg in (("ns", 1), ("actor", 2), ("sid", 3), ("budget", 4), ("key", 5)):
            ref_fn = ref_fn.replace(f"%({param})s", f"${arg}")
        setup.execute(
            "CREATE FUNCTION public.ref_fn(text, text, text, integer, bigint) "
            f"RETURNS TABLE (items jsonb) {HEADER} AS $$ BEGIN RETURN QUERY {ref_fn}; "
            "EXCEPTION WHEN OTHERS THEN RAISE; END $$"
        )
        setup.close()
        args_get = (NS, ACTOR, "small", 8000)
        ref_args = {"ns": NS, "actor": ACTOR, "key": KEY, "sid": "small", "budget": 8000}
        calls = {
            "ref": (GET_REF, ref_args),
            "ref_fn": ("SELECT * FROM public.ref_fn(%s, %s, %s, %s, %s)", (*args_get, KEY)),
            "plan_only": (GET.replace("aidb_memory.session_get", "public.plan_only"), args_get),
            "read_only": (GET.replace("aidb_memory.session_get", "public.read_only"), args_get),
            "get": (GET, args_get),
        }
        conns: dict[str, psycopg.Connection[Any]] = {}
        for name in calls:
            conn = psycopg.connect(dsn, autocommit=True)
            conn.adapters.register_loader("jsonb", TextLoader)
            if name == "ref":
                conn.execute("SET plan_cache_mode = force_generic_plan")  # as make bench's
            conns[name] = conn
        got = {n: conns[n].execute(q, p, prepare=True).fetchone() for n, (q, p) in calls.items()}
        assert got["read_only"] == got["get"] and got["ref_fn"] == got["ref"], "not the same read"
        pids = {n: c.execute("SELECT pg_backend_pid()").fetchone()[0] for n, c in conns.items()}
        wall: dict[str, list[float]] = {n: [] for n in calls}
        cpu: dict[str, list[float]] = {n: [] for n in calls}
        for n, (q, p) in calls.items():
            for _ in range(500):
                conns[n].execute(q, p, prepare=True).fetchone()
        order = list(calls)
        for _ in range(args.rounds):
            for n in order:
                q, p = calls[n]
                c0, t0 = _cpu_ns(pids[n]), time.perf_counter()
                for _ in range(200):
                    conns[n].execute(q, p, prepare=True).fetchone()
                wall[n].append((time.perf_counter() - t0) / 200 * 1e6)
                cpu[n].append((_cpu_ns(pids[n]) - c0) / 200 / 1000)
            order.reverse()
        ref_wall, ref_cpu = statistics.median(wall["ref"]), statistics.median(cpu["ref"])
        print(f"{'path':10s} {'wall µs':>8s} {'cpu µs':>8s}  ref/path (throughput): wall, cpu")
        for n in calls:
            w, c = statistics.median(wall[n]), statistics.median(cpu[n])
            print(f"{n:10s} {w:8.1f} {c:8.1f}  {ref_wall / w:.3f} {ref_cpu / c:.3f}")
        for conn in conns.values():
            conn.close()


def _cpu_ns(pid: int) -> int:
    """Nanoseconds of CPU the backend ``pid`` has used (the server runs on this machine)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


if __name__ == "__main__":
    main()
