"""`make bench`: aidb_memory vs plain SQL, and vs the OpenAI Agents SDK's SQLAlchemySession.

One throwaway PostgreSQL server, one database, aidb_memory installed by our own installer, and one
Python process that drives every path through prepared statements (psycopg ``prepare=True``;
SQLAlchemy's asyncpg dialect prepares and caches its statements itself). The paths of each
comparison run side by side, a few operations of one, then of the other, in alternating order, so
that drift from other work on the machine hits them alike: compare the ratios, not the absolute
numbers. bench/README.md says what each number means.

This file is the runner: the CLI, the servers, the order of the rows and the JSON they make. Each
row family is a module of its own: sessions.py (a) to (d2), first_calls.py (f), chat_ahead.py
(g), concurrency.py (h), search.py (e) on memories.py's data, worst_search.py (e2),
search_quality.py (i), memory_items.py (l), (m), (n), vectors.py (j) and (k), observability.py
(o) and (p), citus_latency.py (q), (r) and (s) on servers of their own; measuring.py times paths
side by side, report.py prints the full run's table and makes its JSON, common.py holds what
they all share.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import chat_ahead  # row (g), bench/chat_ahead.py
import citus_latency  # rows (q), (r), (s), bench/citus_latency.py
import concurrency  # row (h), bench/concurrency.py
import first_calls  # row (f), bench/first_calls.py
import memory_items  # rows (l), (m), (n), bench/memory_items.py
import observability  # rows (o), (p), bench/observability.py
import psycopg
import search  # row (e), bench/search.py
import search_quality  # row (i), bench/search_quality.py
import sessions  # rows (a) to (d2), bench/sessions.py
import vectors  # rows (j) and (k), bench/vectors.py
import worst_search  # row (e2), bench/worst_search.py
from common import ACTOR, DB, HERE, INIT, NS, check, connect, say
from measuring import measure
from memories import MEMORY_MAX_PER_ACTOR, MEMORY_MULT
from report import git_describe, report

from aidb_memory.install.installer import Package, install
from aidb_memory.throwaway import ThrowawayServer


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    ap.add_argument("--slice", type=float, default=1.5, help="seconds per path per round")
    ap.add_argument("--burst", type=int, default=10, help="operations per turn of a path")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per path")
    ap.add_argument("--big-turns", type=int, default=100_000, help="turns of session (c)")
    ap.add_argument(
        "--memories",
        type=int,
        default=None,
        help="memories of (e), a tenth of them the searched actor's (default 1,000,000; "
        "200,000 with --quick)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 0.3 s")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="where the JSON goes")
    ap.add_argument("--no-save", action="store_true", help="print only, write no JSON")
    ap.add_argument(
        "--only",
        choices=(
            "all",
            "e",
            "i",
            "items",
            "worst-search",
            "first-call",
            "g",
            "h",
            "j",
            "monitoring",
            "citus",
        ),
        default="all",
        help="e: only (e), search against plain full text, then (i) on its memories; i: only "
        "(i), search quality on misspelled queries, on (e)'s memories; worst-search: only "
        "(e2), the worst single search of a 100,000-char query, on (e)'s memories (no peer "
        "needed); first-call: only (f), the first call on new connections; g: only (g), "
        "compaction ahead of reads; h: only (h), concurrent chat turns; j: only (j) and (k), "
        "vector search with pgvector over 100,000 of 1,000,000 memories; items: only (l), "
        "(m), (n), filters, get_memory and keyed remember, on (e)'s memories; monitoring: only "
        "(o) and (p), metrics() at 1,000,000 events and the worker's throughput when scraped; "
        "citus: only (q), (r) and (s), the hot calls and the worker through a Citus coordinator "
        "against one server",
    )
    ap.add_argument(
        "--g-exchanges", type=int, default=chat_ahead.EXCHANGES, help="exchanges of (g)"
    )
    ap.add_argument(
        "--g-pace",
        type=float,
        default=chat_ahead.PACE_S,
        help=f"seconds between the exchanges of (g) (default {chat_ahead.PACE_S:g})",
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.slice, args.warmup = 2, 0.3, 0.2
    if args.big_turns < 2000 or args.big_turns % 1000:
        ap.error("--big-turns must be a multiple of 1,000, at least 2,000")
    if args.memories is None:
        args.memories = 200_000 if args.quick else 1_000_000
    per_actor = args.memories // 10
    if (
        args.memories < 10_000
        or args.memories % 10_000
        or per_actor > MEMORY_MAX_PER_ACTOR
        or math.gcd(per_actor, MEMORY_MULT) != 1
    ):
        ap.error(
            f"--memories must be a multiple of 10,000, from 10,000 to {10 * MEMORY_MAX_PER_ACTOR:,}"
        )

    if args.only == "worst-search":
        return main_worst_search(args)
    if args.only == "first-call":
        return main_first_call(args)
    if args.only == "g":
        return main_g(args)
    if args.only == "h":
        return main_h(args)
    if args.only == "j":
        return main_j(args)
    if args.only == "e":
        return main_e(args)
    if args.only == "i":
        return main_i(args)
    if args.only == "items":
        return main_items(args)
    if args.only == "monitoring":
        return main_monitoring(args)
    if args.only == "citus":
        return main_citus(args)
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    """Every row, in one process on one throwaway server; prints the table, writes latest.json."""
    try:
        classes = sessions.PeerClasses.load()
    except ImportError as e:
        print(
            f"bench: the peer is not installed ({e}); run `make bench`, which installs "
            "pyproject's [bench] extra",
            file=sys.stderr,
        )
        return 2

    # A SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the server is stopped and removed.
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    load_before = os.getloadavg()
    say("bench: starting a throwaway PostgreSQL server")
    with ExitStack() as later:
        with ThrowawayServer() as server, asyncio.Runner() as runner:
            with psycopg.connect(server.dsn(), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {DB}")
                pg_version = admin.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            dsn = server.dsn(DB)
            with psycopg.connect(dsn) as conn:
                install(conn, Package.load(), say=lambda _line: None)
                conn.commit()
                installed: dict[str, str] = dict(
                    conn.execute(
                        "SELECT key, value FROM aidb_memory.runtime_settings "
                        "WHERE key IN ('version', 'code_checksum')"
                    ).fetchall()
                )
            say(
                f"bench: installed aidb_memory {installed.get('version')} "
                f"(code {str(installed.get('code_checksum'))[:12]}) into database {DB}, "
                f"PostgreSQL {pg_version}"
            )

            with connect(dsn) as setup:
                setup.execute(INIT, (NS,))
                sessions.build_sessions(setup, args.big_turns)
                say("bench: verifying that each pair computes the same thing")
                shape = sessions.verify(setup, args.big_turns)

            with ExitStack() as closing:
                paths = sessions.open_paths(runner, dsn, server.port, args, classes, closing)
                measure(runner, paths, sessions.GROUPS, args)
                concurrent = runner.run(run_h(dsn, args))
                say("bench: (f) the first call on new connections")
                first = first_calls.first_calls(
                    dsn, 10 if args.quick else first_calls.FIRST_CONNECTIONS
                )

                # (e) comes after the others: its 1,000,000 rows and their scans would otherwise
                # push the sessions' pages out of the buffer cache between their rounds.
                found, e_conns = search.measure_e(runner, dsn, args, paths)
                for c in e_conns:
                    closing.callback(c.close)
                say("bench: (e2) the worst single search of a 100,000-char query")
                worst = worst_search.worst_search(dsn)
                say("bench: (i) search quality, 30 misspelled queries")
                quality = search_quality.run(dsn, NS, ACTOR, say)
                say("bench: (l), (m), (n) filters, get_memory and keyed remember on (e)'s memories")
                items = memory_items.run(runner, dsn, args)
                # (j) and (k) on a server of their own, as `--only j` runs them: shared_buffers that
                # hold their table and HNSW index (~4 GB), as pgvector is deployed; at the first
                # server's 128 MB a search reads half its ~10,000 buffers from the OS's cache
                # (bench/README.md). Their database is built while (g) runs: (g) waits on its fake
                # model and its pace ~99% of its ~4 minutes, and compares its reads with reads made
                # side by side, while the build (~15 minutes, most of the run) needs no quiet
                # machine; (j) itself is measured last, alone.
                say(f"bench: (j) starting a server with shared_buffers = {vectors.SHARED_BUFFERS}")
                vector_server = later.enter_context(
                    ThrowawayServer(postgres_args=f"-c shared_buffers={vectors.SHARED_BUFFERS}")
                )
                with ThreadPoolExecutor(1) as pool:
                    building = pool.submit(vectors.build, vector_server.dsn, say)
                    chat = chat_ahead.run(dsn, say, args.g_exchanges, args.g_pace)
                    # (o) and (p) also fit in the build's time: (p) compares two sides in
                    # alternating rounds, and (o) is a p95 far from its target's order.
                    watched = observability.run(server.dsn, say, args.quick)
                    say("bench: (g), (o), (p) done; waiting for (j)'s database")
                    built = building.result()
        say("bench: server stopped and removed")
        vector_rows = built if "skipped" in built else vectors.measure(built, say)
    say("bench: server stopped and removed")
    # (q), (r) and (s) last, alone on the machine: a cluster's three servers share its cores.
    on_citus = citus_latency.run(say, args.quick)

    load_after = os.getloadavg()
    result = report(
        args, paths, shape, found, concurrent, pg_version, started, load_before, load_after
    )
    print()
    concurrency.report(concurrent)
    print()
    worst_search.report_worst(worst)
    print()
    search_quality.report(quality)
    print()
    memory_items.report(items)
    print()
    first_calls.report_first_calls(first)
    print()
    chat_ahead.report(chat)
    print()
    observability.report(watched)
    print()
    vectors.report(vector_rows)
    print()
    citus_latency.report(on_citus)
    result["aidb_memory"] = installed
    result["worst_search"] = worst
    result["search_quality"] = quality
    result["memory_items"] = items
    result["first_calls"] = first
    result["concurrent"] = concurrent
    result["chat_ahead"] = chat
    result["monitoring"] = watched
    result["vectors"] = vector_rows
    result["citus"] = on_citus
    elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
    result["elapsed_s"] = round(elapsed)
    say(f"bench: the whole run took {elapsed / 60:.1f} min")
    if not args.no_save:
        args.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps(result, indent=2, sort_keys=False) + "\n"
        stamp = started.strftime("%Y%m%dT%H%M%SZ")
        (args.out / f"{stamp}.json").write_text(text)
        (args.out / "latest.json").write_text(text)
        say(f"bench: wrote {args.out / 'latest.json'} and {args.out / (stamp + '.json')}")
    return 0


def run_alone(
    args: argparse.Namespace,
    name: str,
    work: Callable[[str], dict[str, Any]],
    show: Callable[[dict[str, Any]], None],
) -> int:
    """One row alone (``--only``) on a server of its own: ``work(dsn)`` after install returns
    the row's JSON entries, ``show`` prints them; they are written to
    ``<UTC start time>-<name>.json``."""
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    say("bench: starting a throwaway PostgreSQL server")
    with ThrowawayServer() as server:
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DB}")
        dsn = server.dsn(DB)
        with psycopg.connect(dsn) as conn:
            install(conn, Package.load(), say=lambda _line: None)
            conn.commit()
        found = work(dsn)
    say("bench: server stopped and removed")
    print()
    show(found)
    if not args.no_save:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = started.strftime("%Y%m%dT%H%M%SZ")
        path = args.out / f"{stamp}-{name}.json"
        result = {"started_at": started.isoformat(timespec="seconds"), "git": git_describe()}
        path.write_text(json.dumps({**result, **found}, indent=2) + "\n")
        say(f"bench: wrote {path}")
    return 0


def main_e(args: argparse.Namespace) -> int:
    """``--only e``: (e) alone, then (i) on the same memories."""
    return run_alone(args, "e", lambda dsn: search.only_e(dsn, args), search.show_only_e)


def main_i(args: argparse.Namespace) -> int:
    """``--only i``: (i) alone, on (e)'s memories."""
    return run_alone(
        args,
        "i",
        lambda dsn: search.only_i(dsn, args),
        lambda r: search_quality.report(r["search_quality"]),
    )


def main_items(args: argparse.Namespace) -> int:
    """``--only items``: (l), (m), (n) alone, on (e)'s memories."""
    return run_alone(
        args,
        "items",
        lambda dsn: memory_items.only(dsn, args),
        lambda r: memory_items.report(r["memory_items"]),
    )


def main_monitoring(args: argparse.Namespace) -> int:
    """``--only monitoring``: (o) and (p) alone, on a server of their own."""
    return run_on_server(
        args,
        "monitoring",
        "",
        lambda server: {"monitoring": observability.run(server.dsn, say, args.quick)},
        lambda r: observability.report(r["monitoring"]),
    )


def main_citus(args: argparse.Namespace) -> int:
    """``--only citus``: (q), (r) and (s) alone, on servers of their own."""
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    found = {"citus": citus_latency.run(say, args.quick)}
    print()
    citus_latency.report(found["citus"])
    _write_alone(args, "citus", started, found)
    return 0


def main_worst_search(args: argparse.Namespace) -> int:
    """``--only worst-search``: (e2) alone, on (e)'s memories."""
    return run_alone(
        args,
        "worst-search",
        lambda dsn: worst_search.only(dsn, args),
        lambda r: worst_search.report_worst(r["worst_search"]),
    )


def main_first_call(args: argparse.Namespace) -> int:
    """``--only first-call``: (f) alone, on a 1,000-turn session 'small' made as (b)'s is."""
    return run_alone(
        args,
        "first-call",
        lambda dsn: first_calls.only(dsn, args),
        lambda r: first_calls.report_first_calls(r["first_calls"]),
    )


async def run_h(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """(h): concurrent chat turns, ours and the reference in alternating slices."""
    return await concurrency.run(
        dsn,
        NS,
        ACTOR,
        add_ref=sessions.ADD_REF,
        turn_cols=sessions.TURN_COLS,
        consistent=sessions.SESSION_CONSISTENT,
        check=check,
        say=say,
        rounds=args.rounds,
        seconds=args.slice,
        warmup=args.warmup,
    )


def main_h(args: argparse.Namespace) -> int:
    """``--only h``: (h) alone, concurrent chat turns (no peer needed)."""

    def work(dsn: str) -> dict[str, Any]:
        with connect(dsn) as setup:
            setup.execute(INIT, (NS,))
        machine = {"cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())}
        found = asyncio.run(run_h(dsn, args))
        machine["loadavg_after"] = list(os.getloadavg())
        return {"machine": machine, "concurrent": found}

    return run_alone(args, "h", work, lambda r: concurrency.report(r["concurrent"]))


def main_j(args: argparse.Namespace) -> int:
    """``--only j``: (j) and (k) alone, on a server of their own, whose shared_buffers hold the
    table and the index (vectors.SHARED_BUFFERS: PostgreSQL's default 128 MB would measure reads
    from the OS's cache, not the search)."""
    return run_on_server(
        args,
        "j",
        f"-c shared_buffers={vectors.SHARED_BUFFERS}",
        lambda server: vectors.run(server.dsn, say),
        vectors.report,
    )


def run_on_server(
    args: argparse.Namespace,
    name: str,
    postgres_args: str,
    work: Callable[[ThrowawayServer], dict[str, Any]],
    show: Callable[[dict[str, Any]], None],
) -> int:
    """Rows alone on a throwaway server of their own that they use as they need (``work``
    makes its databases); written to ``<UTC start time>-<name>.json``."""
    signal.signal(signal.SIGTERM, _terminate)
    started = dt.datetime.now(dt.UTC)
    say("bench: starting a throwaway PostgreSQL server")
    with ThrowawayServer(postgres_args=postgres_args) as server:
        found = work(server)
    say("bench: server stopped and removed")
    print()
    show(found)
    _write_alone(args, name, started, found)
    return 0


def _write_alone(
    args: argparse.Namespace, name: str, started: dt.datetime, found: dict[str, Any]
) -> None:
    """Rows run alone, written to ``<UTC start time>-<name>.json`` (unless ``--no-save``)."""
    if not args.no_save:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{started.strftime('%Y%m%dT%H%M%SZ')}-{name}.json"
        result = {"started_at": started.isoformat(timespec="seconds"), "git": git_describe()}
        path.write_text(json.dumps({**result, **found}, indent=2) + "\n")
        say(f"bench: wrote {path}")


def main_g(args: argparse.Namespace) -> int:
    """``--only g``: (g) alone, compaction ahead of reads (no peer needed)."""

    def work(dsn: str) -> dict[str, Any]:
        return {"chat_ahead": chat_ahead.run(dsn, say, args.g_exchanges, args.g_pace)}

    return run_alone(args, "g", work, lambda r: chat_ahead.report(r["chat_ahead"]))


if __name__ == "__main__":
    sys.exit(main())
