"""Bench row (h) (issue 14): concurrent clients, each doing chat turns on a session of its own,
aidb_memory against a plain-SQL reference doing the same work; total throughput.

A chat turn is (d)'s: the user's message and the assistant's answer appended in one call, then
the last 20 messages read back, parsed into Python. Ours: ``add`` then ``session_messages(...,
limit_turns => 20)`` (sessions.py's ``d_ours``). The reference: (a)'s plain-SQL insert
(sessions.py's ``ADD_REF``: the session counters and tail, one event, the turn rows), then one
plain query for the newest 20 turns as the same messages (READ_REF). Each client has its own
session and, per side, its own connection (async psycopg, autocommit, every statement prepared);
all clients run in one asyncio loop.

Ours and the reference never run at the same time: a round runs every client on one side for a
slice, then every client on the other, in alternating order from round to round, so that
whatever else the machine does falls on both alike. A side's throughput is the turns completed
inside its slices over the slices' time (a turn still running at the end of a slice is not
counted; each client starts the next slice afresh).

Besides the ratio, each side reports what its clients and backends did with the time: the CPU
of the bench process and of the clients' backends per turn (from /proc), and how the backends
were found in ``pg_stat_activity`` by a sampler every SAMPLE_S (running, waiting for the client,
waiting for a lock or an LWLock, ...). With more clients than cores, the CPU per turn bounds the
throughput; waits on locks are what concurrency adds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

# The references pass the actor's distribution key as the server code does: a parameter.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plpython"))
from aidb_memory_server.keys import actor_key

sys.path.pop(0)

CLIENTS = 8
TARGET = 0.7
TITLE = (
    f"(h) {CLIENTS} concurrent clients, each doing chat turns on its own session, vs a plain-SQL "
    "reference doing the same"
)
WHAT = (
    "total throughput ours (add + session_messages(limit_turns => 20)) / reference ((a)'s insert "
    "+ a plain read of the newest 20 turns), async psycopg, one connection per client"
)
LIMIT_TURNS = 20
SAMPLE_S = 0.02  # pg_stat_activity sampling period
VERIFY_TURNS = 12

ADD = "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)"
MESSAGES = "SELECT aidb_memory.session_messages(%s, %s, %s, limit_turns => %s)"
# The reference's read: the newest ``n`` turns of the session (found from its counter, on the
# (session_ref, seq) primary key) as chat messages, oldest first: what session_messages returns
# for plain chat turns (one turn per round, no name, no tool calls, no summaries).
READ_REF = """
SELECT coalesce(jsonb_agg(jsonb_build_object('role', t.role, 'content', t.content)
                          ORDER BY t.seq), '[]'::jsonb) AS messages
FROM aidb_memory.namespace AS n
JOIN aidb_memory.session AS s
  ON s.actor_key = %(key)s AND s.namespace_id = n.id AND s.actor_id = %(actor)s
 AND s.session_id = %(sid)s
JOIN aidb_memory.turn AS t
  ON t.actor_key = %(key)s AND t.session_ref = s.id AND t.seq >= s.next_seq - %(n)s
WHERE n.name = %(ns)s
"""
# How the clients' backends are found: one row per backend.
ACTIVITY = """
SELECT CASE WHEN state = 'active' AND wait_event IS NULL THEN 'running'
            WHEN state = 'active' THEN wait_event_type || ':' || wait_event
            ELSE coalesce(state, '?') || ' (' || coalesce(wait_event, '-') || ')' END
FROM pg_stat_activity WHERE pid = ANY (%s)
"""

USER = "My order 4711 has not arrived yet. Can you check where it is?"
ASSISTANT = (
    "I checked order 4711: it left the warehouse this morning and the carrier expects to deliver "
    "it tomorrow before noon. You will get a tracking link by email within the hour."
)
TICK = os.sysconf("SC_CLK_TCK")


def chat_turns() -> list[dict[str, str]]:
    return [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT}]


@dataclass
class Side:
    name: str
    label: str
    turn: Callable[[psycopg.AsyncConnection[Any], str], Awaitable[Any]]
    sids: list[str]
    conns: list[psycopg.AsyncConnection[Any]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    turns: int = 0
    wall_s: float = 0.0
    per_round: list[float] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    states: Counter[str] = field(default_factory=Counter)


def process_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (OSError once it has ended)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def backend_cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes (the server's backends), in seconds."""
    return sum(process_cpu_s(pid) for pid in pids)


class Row:
    """Row (h) on one database: namespace ``ns`` must exist; ``add_ref`` is sessions.py's
    ADD_REF."""

    def __init__(self, dsn: str, ns: str, actor: str, add_ref: str, clients: int) -> None:
        self.dsn, self.ns, self.actor, self.add_ref = dsn, ns, actor, add_ref
        self.clients = clients
        self.ours = Side(
            "h_ours", "aidb_memory chat turn", self._ours, [f"h-ours-{i}" for i in range(clients)]
        )
        self.ref = Side(
            "h_ref", "plain-SQL chat turn", self._ref, [f"h-ref-{i}" for i in range(clients)]
        )
        self.monitor: psycopg.AsyncConnection[Any] | None = None

    async def _ours(self, conn: psycopg.AsyncConnection[Any], sid: str) -> Any:
        await conn.execute(ADD, (self.ns, self.actor, json.dumps(chat_turns()), sid), prepare=True)
        cur = await conn.execute(MESSAGES, (self.ns, self.actor, sid, LIMIT_TURNS), prepare=True)
        row = await cur.fetchone()
        assert row is not None
        return row[0]

    async def _ref(self, conn: psycopg.AsyncConnection[Any], sid: str) -> Any:
        key = actor_key(self.ns, self.actor)
        add = {
            "ns": self.ns,
            "actor": self.actor,
            "key": key,
            "sid": sid,
            "turns": json.dumps(chat_turns()),
        }
        await conn.execute(self.add_ref, add, prepare=True)
        read = {"ns": self.ns, "actor": self.actor, "key": key, "sid": sid, "n": LIMIT_TURNS}
        cur = await conn.execute(READ_REF, read, prepare=True)
        row = await cur.fetchone()
        assert row is not None
        return row[0]

    async def open(self) -> None:
        async def connect() -> psycopg.AsyncConnection[Any]:
            return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

        self.monitor = await connect()
        for side in (self.ours, self.ref):
            for sid in side.sids:
                await self.monitor.execute(
                    "SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)",
                    (self.ns, self.actor, sid),
                )
                conn = await connect()
                cur = await conn.execute("SELECT pg_backend_pid()")
                row = await cur.fetchone()
                assert row is not None
                side.conns.append(conn)
                side.pids.append(row[0])

    async def close(self) -> None:
        for conn in [*self.ours.conns, *self.ref.conns, self.monitor]:
            if conn is not None:
                await conn.close()

    async def verify(self, check: Callable[[bool, str], None], turn_cols: str) -> None:
        """Before timing: on two sessions of their own, VERIFY_TURNS turns through each side
        return the same messages after every turn and write the same turn rows, session
        counters and event rows."""
        assert self.monitor is not None
        mon = self.monitor
        sids = ("h-verify-ours", "h-verify-ref")
        for sid in sids:
            await mon.execute(
                "SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)",
                (self.ns, self.actor, sid),
            )
        same = True
        got: list[Any] = []
        for _ in range(VERIFY_TURNS):
            got = await self._ours(self.ours.conns[0], sids[0])
            want = await self._ref(self.ref.conns[0], sids[1])
            same = same and got == want
        check(
            same and len(got) == LIMIT_TURNS,
            f"(h) after each of {VERIFY_TURNS} chat turns, session_messages(limit_turns => "
            f"{LIMIT_TURNS}) and the reference's read return the same messages",
        )

        async def rows(sql: str, sid: str) -> list[tuple[Any, ...]]:
            cur = await mon.execute(sql, (self.ns, sid))
            return await cur.fetchall()

        session = (
            "(SELECT s.id FROM aidb_memory.session s JOIN aidb_memory.namespace n "
            "ON n.id = s.namespace_id WHERE n.name = %s AND s.session_id = %s)"
        )
        for what, sql in (
            (
                "turn rows",
                f"SELECT {turn_cols} FROM aidb_memory.turn WHERE session_ref = {session} "
                "ORDER BY seq",
            ),
            (
                "session counters and tail",
                "SELECT next_seq, total_chars, tail_sequence_id, tail_round_start, open_calls, "
                f"last_user_seq, closed_at FROM aidb_memory.session WHERE id = {session}",
            ),
            (
                "event rows",
                "SELECT e.namespace_id, e.actor_id, e.agent_id, e.idempotency_key, "
                "e.turns IS NULL, e.turn_count, e.status, e.turns_hash "
                "FROM aidb_memory.event e JOIN aidb_memory.namespace n ON n.id = e.namespace_id "
                "WHERE n.name = %s AND e.session_id = %s ORDER BY e.id",
            ),
        ):
            check(
                await rows(sql, sids[0]) == await rows(sql, sids[1]),
                f"(h) ... and the reference writes the same {what} as add",
            )

    async def check_after(self, check: Callable[[bool, str], None], consistent: str) -> None:
        """After timing: every session's counters, tail and offsets match its turns (positions
        gap-free) on both sides."""
        assert self.monitor is not None
        ok = True
        for sid in [*self.ours.sids, *self.ref.sids]:
            cur = await self.monitor.execute(consistent, (sid,))
            ok = ok and await cur.fetchone() == (True,)
        check(ok, f"(h) all {2 * self.clients} sessions are consistent after the run")

    async def _sample(self, side: Side, stop: asyncio.Event) -> None:
        assert self.monitor is not None
        while not stop.is_set():
            cur = await self.monitor.execute(ACTIVITY, (side.pids,), prepare=True)
            side.states.update(r[0] for r in await cur.fetchall())
            await asyncio.sleep(SAMPLE_S)

    async def slice(self, side: Side, seconds: float, record: bool) -> None:
        """Every client on ``side`` for ``seconds``: turns completed inside the slice count."""
        clock = time.perf_counter_ns
        stop = asyncio.Event()
        sampler = asyncio.create_task(self._sample(side, stop)) if record else None
        cpu0, srv0 = time.process_time(), backend_cpu_s(side.pids)
        start = clock()
        end = start + int(seconds * 1e9)

        async def client(i: int) -> list[int]:
            conn, sid, lat = side.conns[i], side.sids[i], []
            while clock() < end:
                t0 = clock()
                await side.turn(conn, sid)
                t1 = clock()
                if t1 <= end:
                    lat.append(t1 - t0)
            return lat

        done = await asyncio.gather(*(client(i) for i in range(self.clients)))
        cpu1, srv1 = time.process_time(), backend_cpu_s(side.pids)
        stop.set()
        if sampler is not None:
            await sampler
        if record:
            n = sum(len(x) for x in done)
            side.turns += n
            side.wall_s += seconds
            side.per_round.append(n / seconds)
            for x in done:
                side.latencies_ns.extend(x)
            side.client_cpu_s += cpu1 - cpu0
            side.server_cpu_s += srv1 - srv0

    async def measure(
        self, rounds: int, seconds: float, warmup: float, say: Callable[[str], None]
    ) -> None:
        for side in (self.ours, self.ref):
            await self.slice(side, warmup, record=False)
        for r in range(rounds):
            order = (self.ours, self.ref) if r % 2 == 0 else (self.ref, self.ours)
            for side in order:
                await self.slice(side, seconds, record=True)
        say(f"  (h) {rounds} rounds of {seconds} s per side done")

    def result(self) -> dict[str, Any]:
        ours, ref = self.ours, self.ref
        measured = (ours.turns / ours.wall_s) / (ref.turns / ref.wall_s)
        by_round = [a / b for a, b in zip(ours.per_round, ref.per_round, strict=True)]
        return {
            "clients": self.clients,
            "limit_turns": LIMIT_TURNS,
            "measured": round(measured, 3),
            "median_of_rounds": round(_median(by_round), 3),
            "by_round": [round(x, 3) for x in by_round],
            "target": f">= {TARGET}",
            "result": "PASS" if measured >= TARGET else "MISS",
            "sides": {s.name: _side(s) for s in (ours, ref)},
        }


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


def _side(s: Side) -> dict[str, Any]:
    lat = sorted(s.latencies_ns)
    n = len(lat)
    samples = sum(s.states.values()) or 1
    return {
        "label": s.label,
        "turns": s.turns,
        "seconds": round(s.wall_s, 3),
        "turns_per_s": round(s.turns / s.wall_s, 1),
        "mean_us": round(sum(lat) / n / 1000, 1),
        "p50_us": round(lat[n // 2] / 1000, 1),
        "p95_us": round(lat[min(n - 1, int(0.95 * n))] / 1000, 1),
        "client_cpu_us_per_turn": round(s.client_cpu_s / s.turns * 1e6, 1),
        "server_cpu_us_per_turn": round(s.server_cpu_s / s.turns * 1e6, 1),
        "cpus_busy": round((s.client_cpu_s + s.server_cpu_s) / s.wall_s, 2),
        "backend_states": {
            k: round(v / samples, 4) for k, v in sorted(s.states.items(), key=lambda kv: -kv[1])
        },
        "turns_per_s_by_round": [round(x, 1) for x in s.per_round],
    }


async def run(
    dsn: str,
    ns: str,
    actor: str,
    *,
    add_ref: str,
    turn_cols: str,
    consistent: str,
    check: Callable[[bool, str], None],
    say: Callable[[str], None],
    rounds: int,
    seconds: float,
    warmup: float,
    clients: int = CLIENTS,
) -> dict[str, Any]:
    """Row (h): verify, measure ``rounds`` rounds of ``seconds`` per side, check the sessions;
    returns the row's JSON (``measured`` is ours / the reference, total turns per second).
    ``add_ref``, ``turn_cols`` and ``consistent`` are sessions.py's ADD_REF, TURN_COLS and
    SESSION_CONSISTENT."""
    row = Row(dsn, ns, actor, add_ref, clients)
    try:
        await row.open()
        await row.verify(check, turn_cols)
        say(
            f"bench: (h) {clients} concurrent clients, chat turns, ours and the reference in "
            f"alternating slices of {seconds} s"
        )
        await row.measure(rounds, seconds, warmup, say)
        await row.check_after(check, consistent)
        return row.result()
    finally:
        await row.close()


def report(h: dict[str, Any]) -> None:
    print(
        f"(h) {h['clients']} concurrent clients, each doing chat turns on its own session "
        f"(add of 2 messages, then the last {h['limit_turns']}), total throughput"
    )
    cols = ("path", "what", "turns", "turns/s", "mean µs", "p95 µs", "cpu µs/turn", "cpus")
    header = "{:<8} {:<24} {:>7} {:>8} {:>8} {:>8} {:>16} {:>5}".format(*cols)
    print(header)
    print("-" * len(header))
    for name, s in h["sides"].items():
        cpu = f"{s['server_cpu_us_per_turn']:.0f}+{s['client_cpu_us_per_turn']:.0f}"
        print(
            f"{name:<8} {s['label']:<24} {s['turns']:>7} {s['turns_per_s']:>8.0f} "
            f"{s['mean_us']:>8.0f} {s['p95_us']:>8.0f} {cpu:>16} {s['cpus_busy']:>5.2f}"
        )
    print("cpu µs/turn: the clients' backends + the bench process; cpus: both, per second")
    for name, s in h["sides"].items():
        top = ", ".join(f"{k} {v:.0%}" for k, v in list(s["backend_states"].items())[:5])
        print(f"  {name} backends (sampled): {top}")
    print(
        f"  ours / reference {h['measured']:.2f} (median of rounds {h['median_of_rounds']:.2f}, "
        f"{min(h['by_round']):.2f}..{max(h['by_round']):.2f}), target {h['target']}  "
        f"{h['result']}"
    )
