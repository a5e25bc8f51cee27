"""The full run's table, printed, and its JSON (bench/results/latest.json): every comparison, the
info ratios, (e)'s queries and where it was measured."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
from collections.abc import Sequence
from typing import Any

import concurrency  # row (h), bench/concurrency.py
import gate
import sessions
from common import REPO, version
from measuring import Measured, median, ratio, row, stats
from search import COMPARISON as SEARCH_COMPARISON
from search import INFO as SEARCH_INFO
from search import report_search

COMPARISONS = [*sessions.COMPARISONS, SEARCH_COMPARISON]
INFO = [*sessions.INFO, *SEARCH_INFO]


def git_describe() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "") if head else "unknown"
    except OSError:
        return "unknown"


def machine(load_before: Sequence[float], load_after: Sequence[float]) -> dict[str, Any]:
    """The machine a result was measured on, with its load average before and after."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


SPELL = 0.25  # a round this far from its path's median throughput is a spell (issue 33)


def spells(paths: dict[str, Measured]) -> str:
    """Which paths had rounds far from their median (a slow or a fast spell: a plan that changed
    with the statistics, a background job), in a line per path, or one line saying none had."""
    lines = []
    for name, p in paths.items():
        if len(p.per_round) < 2:
            continue
        med = median(p.per_round)
        off = [x for x in p.per_round if abs(x / med - 1) > SPELL]
        modes = gate.two_modes([1e6 / x for x in p.per_round])  # µs per operation
        if off or modes:
            lines.append(
                f"  {name}: rounds {min(p.per_round):.0f}..{max(p.per_round):.0f} ops/s, "
                f"median {med:.0f}; {len(off)} more than {SPELL:.0%} from it"
                + (f"; {modes}" if modes else "")
            )
    if not lines:
        return f"Every path's rounds within {SPELL:.0%} of its median throughput (no spell)."
    return "Paths with spells (rounds far from their median throughput):\n" + "\n".join(lines)


def report(
    args: argparse.Namespace,
    paths: dict[str, Measured],
    shape: dict[str, Any],
    search: dict[str, Any],
    concurrent: dict[str, Any],
    pg_version: str,
    started: dt.datetime,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    st = {name: stats(p) for name, p in paths.items()}
    print()
    print("What each comparison does")
    for c in COMPARISONS:
        print(f"  {c.title}")
        print(f"      {c.what}")
    print(f"  {concurrency.TITLE}")
    print(f"      {concurrency.WHAT}")
    print()
    cols = ("path", "what", "ops", "ops/s", "mean µs", "p50 µs", "p95 µs", "client")
    header = "{:<12} {:<32} {:>7} {:>8} {:>8} {:>8} {:>8}  {}".format(*cols)
    print(header)
    print("-" * len(header))
    for name, s in st.items():
        print(
            f"{name:<12} {s['label']:<32} {s['ops']:>7} {s['ops_per_s']:>8.0f} "
            f"{s['mean_us']:>8.0f} {s['p50_us']:>8.0f} {s['p95_us']:>8.0f}  {s['client']}"
        )
    print()
    print(spells(paths))
    print()
    header = "{:<4} {:<36} {:>8} {:>7} {:>7} {:>16}  {}".format(
        "", "ratio", "measured", "target", "median", "rounds min..max", "result"
    )
    print(header)
    print("-" * len(header))
    comps = []
    for c in COMPARISONS:
        overall, rounds = ratio(paths, c.num, c.den, c.metric)
        verdict = "PASS" if c.passes(overall) else "MISS"
        name = f"{c.num}/{c.den} ({c.metric})"
        print(row(c.id, name, overall, f"{c.op}{c.target}", rounds) + f"  {verdict}")
        comps.append(
            {
                "id": c.id,
                "title": c.title,
                "what": c.what,
                "ratio": f"{c.num}/{c.den}",
                "metric": c.metric,
                "measured": round(overall, 3),
                "median_of_rounds": round(median(rounds), 3),
                "target": f"{c.op} {c.target}",
                "by_round": [round(x, 3) for x in rounds],
                "result": verdict,
            }
        )
    h = concurrent
    name = f"h_ours/h_ref ({h['clients']} clients, throughput)"
    print(
        row("h", name, h["measured"], f">={concurrency.TARGET}", h["by_round"]) + f"  {h['result']}"
    )
    comps.append(
        {
            "id": "h",
            "title": concurrency.TITLE,
            "what": concurrency.WHAT,
            "ratio": "h_ours/h_ref",
            "metric": "throughput",
            "measured": h["measured"],
            "median_of_rounds": h["median_of_rounds"],
            "target": h["target"],
            "by_round": h["by_round"],
            "result": h["result"],
        }
    )
    info = []
    for num, den, metric, what in INFO:
        overall, rounds = ratio(paths, num, den, metric)
        print(row("info", f"{num}/{den} ({metric})", overall, "", rounds) + f"  {what}")
        info.append(
            {
                "ratio": f"{num}/{den}",
                "metric": metric,
                "what": what,
                "measured": round(overall, 3),
                "median_of_rounds": round(median(rounds), 3),
                "by_round": [round(x, 3) for x in rounds],
            }
        )
    print()
    report_search(search)
    print()
    print(
        f"load average 1 min: {load_before[0]:.2f} before, {load_after[0]:.2f} after "
        f"({os.cpu_count()} cores; other work on the machine makes absolute numbers noisy, "
        "ratios measured side by side much less so)"
    )
    return {
        "started_at": started.isoformat(timespec="seconds"),
        "git": git_describe(),
        "machine": machine(load_before, load_after),
        "versions": {
            "postgresql": pg_version,
            "psycopg": version("psycopg"),
            "openai-agents": version("openai-agents"),
            "sqlalchemy": version("sqlalchemy"),
            "asyncpg": version("asyncpg"),
        },
        "settings": {
            "rounds": args.rounds,
            "slice_s": args.slice,
            "burst": args.burst,
            "warmup_s": args.warmup,
            "big_turns": args.big_turns,
            "budget_chars": 8000,
            "memories": args.memories,
            "server": "ThrowawayServer: fsync=off, synchronous_commit=off, full_page_writes=off",
        },
        "reads": shape,
        "search": search,
        "paths": st,
        "comparisons": comps,
        "info": info,
    }
