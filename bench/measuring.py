"""How bench/run.py times its paths: the paths of one comparison side by side, a few operations
of one, then of the next, in alternating order; their statistics and the ratio of two paths."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from common import say


@dataclass
class Measured:
    name: str
    label: str
    client: str
    op: Callable[[], Any] | None = None  # sync
    aop: Callable[[], Awaitable[Any]] | None = None  # async
    latencies_ns: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    per_round: list[float] = field(default_factory=list)  # ops/s of each measured slice


async def run_group(group: list[Measured], seconds: float, burst: int, record: bool) -> None:
    """Run the paths of one comparison side by side for ``seconds`` each: ``burst`` operations of
    one, then of the next, ..., in alternating order, so that whatever else the machine does
    meanwhile falls on all of them alike."""
    clock = time.perf_counter_ns
    lat: dict[str, list[int]] = {p.name: [] for p in group}
    end = clock() + int(seconds * len(group) * 1e9)
    order = list(group)
    while clock() < end:
        for path in order:
            out = lat[path.name]
            for _ in range(burst):
                t0 = clock()
                if path.op is not None:
                    path.op()
                else:
                    assert path.aop is not None
                    await path.aop()
                out.append(clock() - t0)
        order.reverse()
    if record:
        for path in group:
            spent = sum(lat[path.name]) / 1e9
            path.latencies_ns.extend(lat[path.name])
            path.wall_s += spent
            path.per_round.append(len(lat[path.name]) / spent)


def measure(
    runner: asyncio.Runner,
    paths: dict[str, Measured],
    groups: list[list[str]],
    args: argparse.Namespace,
    start_recording: tuple[QueryCycle, ...] = (),
) -> None:
    """Warm each group's paths up, then run ``args.rounds`` rounds of every group."""
    say(f"bench: warming up each path ({args.warmup} s)")
    for names in groups:
        group = [paths[n] for n in names]
        runner.run(run_group(group, args.warmup, args.burst, record=False))
    for cycle in start_recording:
        cycle.recording = True
    per_round = sum(len(g) for g in groups) * args.slice
    say(
        f"bench: {args.rounds} rounds of {args.slice} s per path, the paths of each "
        f"comparison interleaved {args.burst} operations at a time "
        f"(at least ~{per_round * args.rounds:.0f} s: each path runs {args.burst} operations "
        "per round however long they take)"
    )
    for r in range(args.rounds):
        for names in groups:
            group = [paths[n] for n in (names if r % 2 == 0 else reversed(names))]
            runner.run(run_group(group, args.slice, args.burst, record=True))
        say(f"  round {r + 1}/{args.rounds} done")


def stats(path: Measured) -> dict[str, Any]:
    lat = sorted(path.latencies_ns)
    n = len(lat)

    def pct(p: float) -> float:
        return lat[min(n - 1, int(p * n))] / 1000

    return {
        "label": path.label,
        "client": path.client,
        "ops": n,
        "seconds": round(path.wall_s, 3),
        "ops_per_s": round(n / path.wall_s, 1),
        "mean_us": round(sum(lat) / n / 1000, 1),
        "p50_us": round(pct(0.50), 1),
        "p95_us": round(pct(0.95), 1),
        "ops_per_s_by_round": [round(x, 1) for x in path.per_round],
    }


class QueryCycle:
    """A path of (e): one query per operation, the queries in turn; once ``recording``, the
    latency of each operation is also kept per query."""

    def __init__(self, conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> None:
        self.conn, self.sql, self.params = conn, sql, params
        self.i = 0
        self.recording = False
        self.by_query: list[list[int]] = [[] for _ in params]

    def __call__(self) -> Any:
        k = self.i % len(self.params)
        self.i += 1
        t0 = time.perf_counter_ns()
        rows = self.conn.execute(self.sql, self.params[k], prepare=True).fetchall()
        if self.recording:
            self.by_query[k].append(time.perf_counter_ns() - t0)
        return rows


@dataclass(frozen=True)
class Comparison:
    id: str
    title: str
    what: str
    num: str  # path names: the ratio is num / den
    den: str
    metric: str  # "throughput" (ops/s ratio) or "latency" (mean latency ratio)
    op: str  # ">=" or "<="
    target: float

    def passes(self, measured: float) -> bool:
        return measured >= self.target if self.op == ">=" else measured <= self.target


def ratio(paths: dict[str, Measured], num: str, den: str, metric: str) -> tuple[float, list[float]]:
    a, b = paths[num], paths[den]
    if metric == "throughput":
        overall = (len(a.latencies_ns) / a.wall_s) / (len(b.latencies_ns) / b.wall_s)
        rounds = [x / y for x, y in zip(a.per_round, b.per_round, strict=True)]
    else:  # mean latency = 1 / throughput of a serial loop
        overall = (a.wall_s / len(a.latencies_ns)) / (b.wall_s / len(b.latencies_ns))
        rounds = [y / x for x, y in zip(a.per_round, b.per_round, strict=True)]
    return overall, rounds


def median(xs: list[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def row(tag: str, name: str, overall: float, target: str, rounds: list[float]) -> str:
    spread = f"{min(rounds):.2f}..{max(rounds):.2f}"
    return f"{tag:<4} {name:<36} {overall:>8.2f} {target:>7} {median(rounds):>7.2f} {spread:>16}"
