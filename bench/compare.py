"""`make bench-compare BASE=<rev>`: our hot paths at two versions of the code, side by side, and
the regression gate every change passes (bench/README.md, "Two versions side by side").

`make bench` compares us with plain SQL and with the peer within one version; its ratios move by
±0.05 from run to run because the machine drifts between and within runs. A question such as
"did this change make `add` 5% slower?" needs both versions measured in the same run, in the same
server, alternating: this script installs each source tree into its own database of one
throwaway server, builds (b)'s 1,000-turn session and (c)'s generated 100,000-turn one (the
statistics the reads' generic plans are made from, as in make bench), and times (a) `add` of the
2-turn exchange, (b) `session_get` with `limit_chars => 8000` and (d)'s `session_messages` (by
default; `--ops`), a burst of each version in turn, in alternating order, for `--seconds`
(default 180: a slow spell of a minute shows in some rounds and not in others).

Per version and call it prints the median and p95 µs of all calls, the spread of the rounds
(p10..p90 of their mean µs), the median backend CPU µs per call (from /proc/<pid>/schedstat,
when the server runs here: a busy machine disturbs it much less than a round trip's wall time),
and the ratios to the first version. The gate (bench/gate.py) flags a call more than 5% slower
than the first version's, by median wall time or CPU, or whose rounds split into two modes; the
exit status is 1 when anything was flagged.

    .venv/bin/python bench/compare.py before=/path/to/old/checkout after=.

Each tree is installed by its own installer (``PYTHONPATH=<tree>/src``), so any two commits
that have the installer can be compared; `make bench-compare` makes the worktree of BASE.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gate
import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import INIT, KEY, NS  # noqa: E402  (bench/ is not a package)
from sessions import A_TURNS, ADD, ADD_REF, GET, GET_REF, build_big, exchange  # noqa: E402

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


def prepare(
    dsn: str, tree: Path, big_turns: int, as_app: bool, granted: bool, ops: list[str]
) -> psycopg.Connection[Any]:
    """Install ``tree`` into ``dsn``'s database and build the 1,000-turn session of (b), and
    (``big_turns``) the generated session of (c). ``as_app``: the calls are made as an
    application's role (``SET ROLE``), not the superuser; ``granted``: the namespace has a grant
    to that role."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, "-c", INSTALL, dsn], check=True, env=env, cwd=tree)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(INIT, (NS,))
    for sid in ("a", "a-ref", "small", "big", "summarized"):
        conn.execute("SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)", (NS, ACTOR, sid))
    for seq in range(1, 1000, 2):
        conn.execute(ADD, (NS, ACTOR, exchange(seq), "small"), prepare=True)
        conn.execute(ADD, (NS, ACTOR, exchange(seq), "summarized"), prepare=True)
    # Only for the calls that use them: an older version's tables may not have their columns.
    if "summarized" in ops:
        conn.execute(_SUMMARIES)
    if {"search", "search_vec"} & set(ops):
        for statement in _VEC_SETUP:
            conn.execute(statement)
    if big_turns:
        build_big(conn, big_turns)  # ends with VACUUM ANALYZE, as make bench's does
    else:
        conn.execute("ANALYZE")
    if as_app:
        # What issue 35's check costs a granted role, against the same role's calls in an open
        # namespace (a superuser's calls skip the privilege checks of every function they call).
        conn.execute(
            "DO $$ BEGIN CREATE ROLE compare_app IN ROLE aidb_users; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        if granted:
            conn.execute("SELECT aidb_memory.namespace_grant(%s, 'compare_app')", (NS,))
            wait_for_vacuum(conn)
    conn.close()
    return connect(dsn, as_app)


# A grant leaves a dead version of the namespace row, which every call visits until autovacuum
# removes it (migration 0030: within a minute or two of any change); the calls are timed after.
_VACUUMED_AFTER_CHANGES = (
    "SELECT 'autovacuum_vacuum_threshold=0' = ANY (c.reloptions) FROM pg_catalog.pg_class AS c "
    "WHERE c.oid = 'aidb_memory.namespace'::pg_catalog.regclass"
)
# (Not n_dead_tup = 0: the grant's dead rows reach the statistics up to a second later.)
_VACUUMED_SINCE = (
    "SELECT coalesce(last_autovacuum > %s, false) FROM pg_catalog.pg_stat_user_tables "
    "WHERE relid = 'aidb_memory.namespace'::pg_catalog.regclass"
)
VACUUM_WAIT_S = 600


def wait_for_vacuum(conn: psycopg.Connection[Any]) -> None:
    """Wait until autovacuum has vacuumed the namespace table since the grant: what a namespace
    with grants costs its calls from then on, not in the minute after the grant. A version
    before migration 0030 is not vacuumed for long, and is timed as it is."""
    if conn.execute(_VACUUMED_AFTER_CHANGES).fetchone() != (True,):
        return
    print("compare: waiting for autovacuum of the namespace table after the grant", flush=True)
    granted = conn.execute("SELECT pg_catalog.clock_timestamp()").fetchone()
    deadline = time.monotonic() + VACUUM_WAIT_S
    while conn.execute(_VACUUMED_SINCE, granted).fetchone() != (True,):
        if time.monotonic() > deadline:
            raise SystemExit(
                f"compare: no autovacuum of aidb_memory.namespace in {VACUUM_WAIT_S} s"
            )
        time.sleep(2)


def connect(dsn: str, as_app: bool) -> psycopg.Connection[Any]:
    """A new backend for a version's calls (as the application's role with ``as_app``)."""
    conn = psycopg.connect(dsn, autocommit=True)
    if as_app:
        conn.execute("SET ROLE compare_app")
    return conn


# The reads of (d) and (d2) on the same session: session_messages as (d) and AidbSession call it.
MESSAGES = "SELECT aidb_memory.session_messages(%s, %s, %s, limit_turns => %s)::text"
RESPONSES = (
    "SELECT aidb_memory.session_messages(%s, %s, %s, limit_items => %s, "
    "format => 'responses')::text"
)
OPS = {
    "add": "(a) add",
    "add_ref": "(a) the plain-SQL reference of add, on this version's tables",
    "get": "(b) session_get 8,000 chars",
    "get_ref": "(b) the plain-SQL reference of session_get, generic plans (as make bench's)",
    "get_ref_auto": "(b) the same reference under plan_cache_mode auto (PostgreSQL's default)",
    "big": "(c) session_get 8,000 chars of --big-turns",
    "summarized": "session_get 8,000 chars, its older turns summarized (as (g)'s reads)",
    "messages": "(d) session_messages 20 turns",
    "responses": "(d2) responses 20 items",
    "remember": "remember (a new memory)",
    "search": "search, words, an actor's 600 memories",
    "search_vec": "search, words and query_embedding (384 dimensions), the same memories",
}
# remember's memories: every call a new one (an exact duplicate is not stored again), of a few
# words every memory shares and one of its own, an actor of their own.
# add_ref: make bench's reference of (a), which writes our tables: what a change of the tables
# (an index, a trigger, a constraint) costs any writer, whatever add itself does.
_REF_PARAMS = {"ns": NS, "actor": ACTOR, "key": KEY, "turns": A_TURNS}
# get_ref: make bench's reference of (b), planned as it plans it (force_generic_plan, as
# session_get's read is) and, get_ref_auto, as a prepared statement is by default: the planner
# then chooses between generic and custom plans by the tables' statistics (in make bench it
# switched to custom plans, each call planned, once autovacuum analyzed turn; in this set-up it
# kept generic ones: bench/README.md).
_REF_PLANS = {"get_ref": "force_generic_plan", "get_ref_auto": "auto"}
REMEMBER = "SELECT aidb_memory.remember(%s, 'rita', %s)::text"
_remembered = itertools.count()


# The session "summarized": (b)'s turns, the first 990 covered by 11 summaries of 300 chars, as
# compaction would leave them (whole rounds, the bounds of the turns they cover): a read of
# 8,000 chars returns the last 10 turns and the newest summaries that fit beside them, the state
# of (g)'s sessions, whose compaction the worker does ahead of the reads.
_SUMMARIES = f"""
INSERT INTO aidb_memory.summary
    (actor_key, session_ref, from_seq, to_seq, turn_count, content, chars, model, from_offset,
     to_offset)
SELECT s.actor_key, s.id, a.seq, b.seq, b.seq - a.seq + 1, repeat('s', 300), 300, 'compare',
       a.char_offset, b.char_offset + b.chars
FROM aidb_memory.session s, generate_series(0, 10) AS g,
     aidb_memory.turn a, aidb_memory.turn b
WHERE s.session_id = 'summarized' AND s.actor_key = {KEY}
  AND a.actor_key = s.actor_key AND a.session_ref = s.id AND a.seq = g * 90 + 1
  AND b.actor_key = s.actor_key AND b.session_ref = s.id AND b.seq = g * 90 + 90
"""


# search's memories: an actor of a namespace with an embedding model (never called: the vector
# is given), 600 memories with vectors, as bench-quality's actors have; queries in turn.
VEC_NS, VEC_ACTOR, VEC_DIMS = "compare_vectors", "vera", 384
_VEC_SETUP = [
    "SELECT aidb_memory.create_model('compare_emb', 'openai', "
    '\'{"model": "unused", "base_url": "http://127.0.0.1:9/v1"}\')',
    f"SELECT aidb_memory.init('{VEC_NS}', '{{\"embedding\": \"compare_emb\"}}', "
    "'{\"extraction\": false}')",
    "SELECT setseed(0.34)",
    f"""
    INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content, content_hash,
                                    embedding, embedding_model, lexemes)
    SELECT aidb_memory.actor_key('{VEC_NS}', '{VEC_ACTOR}'), n.id, '{VEC_ACTOR}', t.c, md5(t.c),
           ARRAY(SELECT random() - 0.5 + 0 * g FROM generate_series(1, {VEC_DIMS}))::real[],
           'compare_emb', to_tsvector('english', t.c)
    FROM aidb_memory.namespace n, generate_series(1, 600) AS g,
         LATERAL (SELECT 'Vera noted ' || (ARRAY['tea', 'trains', 'Lisbon', 'cats', 'jazz'])
                         [1 + g % 5] || ' on day ' || g AS c) AS t
    WHERE n.name = '{VEC_NS}'
    """,
]
SEARCH_WORDS = "SELECT id FROM aidb_memory.search(%s, %s, %s)"
SEARCH_VEC = "SELECT id FROM aidb_memory.search(%s, %s, %s, query_embedding => %s)"
_QUESTIONS = ["tea on day", "trains to Lisbon", "cats and jazz", "day 42", "Lisbon tea"]
_vectors = [[((i * 7 + k * 13) % 17 - 8) / 8.0 for k in range(VEC_DIMS)] for i in range(5)]
_asked = itertools.count()


def backend_cpu_ns(pid: int) -> int | None:
    """The CPU time a backend has used so far (None: not readable, e.g. a remote server)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def warm_up(conn: psycopg.Connection[Any], ops: list[str], n: int) -> int:
    """A new backend's pid, after an untimed burst of each call: its first calls load caches
    and plans that every later call finds."""
    for op in ops:
        burst(conn, op, n)
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def burst(conn: psycopg.Connection[Any], op: str, n: int) -> list[float]:
    """µs of each of ``n`` calls of ``op``."""
    clock = time.perf_counter_ns
    out = []
    if op in _REF_PLANS:
        conn.execute(f"SET plan_cache_mode = {_REF_PLANS[op]}")
    for _ in range(n):
        t0 = clock()
        if op == "add":
            conn.execute(ADD, (NS, ACTOR, A_TURNS, "a"), prepare=True)
        elif op == "add_ref":
            conn.execute(ADD_REF, {**_REF_PARAMS, "sid": "a-ref"}, prepare=True).fetchall()
        elif op == "get":
            conn.execute(GET, (NS, ACTOR, "small", 8000), prepare=True).fetchall()
        elif op in _REF_PLANS:
            params = {**_REF_PARAMS, "sid": "small", "budget": 8000}
            conn.execute(GET_REF, params, prepare=True).fetchall()
        elif op == "big":
            conn.execute(GET, (NS, ACTOR, "big", 8000), prepare=True).fetchall()
        elif op == "summarized":
            conn.execute(GET, (NS, ACTOR, "summarized", 8000), prepare=True).fetchall()
        elif op in ("search", "search_vec"):
            i = next(_asked) % len(_QUESTIONS)
            if op == "search":
                conn.execute(SEARCH_WORDS, (VEC_NS, VEC_ACTOR, _QUESTIONS[i]), prepare=True)
            else:
                args = (VEC_NS, VEC_ACTOR, _QUESTIONS[i], _vectors[i])
                conn.execute(SEARCH_VEC, args, prepare=True).fetchall()
        elif op == "remember":
            k = next(_remembered)
            fact = f"Rita noted item {k} of her trip: tea in Lisbon, code {k * 7919 % 100003}"
            conn.execute(REMEMBER, (NS, fact), prepare=True).fetchall()
        else:
            sql = MESSAGES if op == "messages" else RESPONSES
            conn.execute(sql, (NS, ACTOR, "small", 20), prepare=True).fetchall()
        out.append((clock() - t0) / 1000)
    if op in _REF_PLANS:
        conn.execute("RESET plan_cache_mode")
    return out


@dataclass
class Timed:
    """One call of one version: every call's µs, and per round its mean µs and backend CPU µs."""

    calls: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def report(trees: list[str], ops: list[str], timed: dict[tuple[str, str], Timed]) -> int:
    """Print each call's figures per version and the gate's flags; the number of flags."""
    flagged = 0
    for op in ops:
        print(f"\n{OPS[op]}")
        print(
            f"  {'version':12s} {'median':>8s} {'p95':>8s} {'rounds p10..p90':>17s} "
            f"{'cpu':>8s} {'ratio':>6s} {'cpu':>6s}  (µs per call; ratios to {trees[0]})"
        )
        base = timed[(trees[0], op)]
        for label in trees:
            t = timed[(label, op)]
            verdict = gate.judge(t.rounds, base.rounds, t.cpu, base.cpu)
            cpu = f"{gate.median(t.cpu):8.1f}" if t.cpu else f"{'-':>8s}"
            cpu_ratio = "-" if verdict.cpu_ratio is None else f"{verdict.cpu_ratio:.3f}"
            spread = f"{gate.percentile(t.rounds, 0.1):.0f}..{gate.percentile(t.rounds, 0.9):.0f}"
            print(
                f"  {label:12s} {gate.median(t.calls):8.1f} {gate.percentile(t.calls, 0.95):8.1f} "
                f"{spread:>17s} {cpu} {verdict.wall_ratio:6.3f} {cpu_ratio:>6s}"
            )
            for flag in verdict.flags:
                flagged += 1
                print(f"  FLAG {label}: {OPS[op]}: {flag}")
    return flagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", metavar="LABEL=PATH", help="source trees to compare")
    parser.add_argument(
        "--seconds",
        type=float,
        default=180,
        help="how long the rounds run, at least (default 180: a mode that comes and goes "
        "within a minute shows in some rounds and not in others)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="alternating rounds (default: as --seconds lasts)"
    )
    parser.add_argument(
        "--granted",
        action="append",
        default=[],
        metavar="LABEL",
        help="a version whose namespace has a grant (namespace_grant) to the role its calls are "
        "made as: `open=. granted=. --granted granted` times what the check of a namespace with "
        "grants costs, once autovacuum has vacuumed the namespace table after the grant "
        "(repeatable; with it, every version's calls are made as an application's role, a member "
        "of aidb_users, not as the superuser)",
    )
    parser.add_argument("--burst", type=int, default=30, help="calls per burst (default 30)")
    parser.add_argument(
        "--reconnect",
        type=int,
        default=40,
        metavar="ROUNDS",
        help="a new backend for each version every ROUNDS rounds (default 40; 0: one backend "
        "for the whole run): two backends running the same calls differ by up to 5%% in CPU "
        "per call, which one backend per version would read as a difference of the versions",
    )
    parser.add_argument(
        "--big-turns",
        type=int,
        default=100_000,
        help="turns of a generated session beside (b)'s, as make bench has (default 100,000; "
        "0: none): the statistics that the generic plans of the reads are made from",
    )
    parser.add_argument(
        "--ops",
        default="add,get,messages",
        help="what to time, comma-separated, of " + ", ".join(OPS) + " (default add,get,messages)",
    )
    args = parser.parse_args()
    trees = []
    for spec in args.trees:
        label, sep, path = spec.partition("=")
        if not sep or not (Path(path) / "src" / "aidb_memory").is_dir():
            parser.error(f"{spec!r}: expected LABEL=PATH of a source tree with src/aidb_memory")
        trees.append((label, Path(path).resolve()))
    if set(args.granted) - {label for label, _ in trees}:
        parser.error("--granted: expected the LABEL of a version")
    ops = args.ops.split(",")
    for ref in {"add_ref", *_REF_PLANS} & set(ops) if args.granted else ():
        parser.error(f"--granted: {ref} uses the tables, which an application's role cannot")
    if not ops or any(op not in OPS for op in ops):
        parser.error(f"--ops: expected some of {', '.join(OPS)}")
    if "big" in ops and not args.big_turns:
        parser.error("--ops big needs --big-turns")
    timed = {(label, op): Timed() for label, _ in trees for op in ops}
    # Every version's tables in shared buffers (the generated session is ~100 MB a version): with
    # PostgreSQL's default 128 MB the versions would evict each other's pages, and the one whose
    # pages come back from the OS's cache would pay for it in backend CPU.
    buffers = max(1024, 256 * len(trees) * max(1, args.big_turns // 100_000))
    with ThrowawayServer(postgres_args=f"-c shared_buffers={buffers}MB") as server:
        conns, pids, dsns = {}, {}, {}
        for i, (label, tree) in enumerate(trees):
            with psycopg.connect(server.dsn(), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE compare_{i}")
            print(f"compare: installing {label} ({tree})", flush=True)
            granted = label in args.granted
            dsns[label] = server.dsn(f"compare_{i}")
            conns[label] = prepare(
                dsns[label], tree, args.big_turns, bool(args.granted), granted, ops
            )
        print(
            f"compare: rounds of {args.burst} calls of each of {', '.join(ops)} per version, "
            + (f"{args.rounds} rounds" if args.rounds else f"for {args.seconds:.0f} s"),
            flush=True,
        )
        started = time.monotonic()
        next_progress = started + 30
        r = 0
        while (
            r < args.rounds if args.rounds else time.monotonic() - started < args.seconds
        ) or r < 2:
            if r == 0 or (args.reconnect and r % args.reconnect == 0):
                for label, _ in trees:
                    if r:
                        conns[label].close()
                        conns[label] = connect(dsns[label], bool(args.granted))
                    pids[label] = warm_up(conns[label], ops, args.burst)
            for label, _ in trees if r % 2 == 0 else trees[::-1]:
                for op in ops:
                    before = backend_cpu_ns(pids[label])
                    calls = burst(conns[label], op, args.burst)
                    after = backend_cpu_ns(pids[label])
                    t = timed[(label, op)]
                    t.calls.extend(calls)
                    t.rounds.append(sum(calls) / len(calls))
                    if before is not None and after is not None:
                        t.cpu.append((after - before) / args.burst / 1000)
            r += 1
            if time.monotonic() > next_progress:
                print(f"compare: {r} rounds, {time.monotonic() - started:.0f} s", flush=True)
                next_progress += 30
        for conn in conns.values():
            conn.close()
    flagged = report([label for label, _ in trees], ops, timed)
    print(f"\ncompare: {r} rounds in {time.monotonic() - started:.0f} s; ", end="")
    print(f"{flagged} flags" if flagged else "no flags")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
