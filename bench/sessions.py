"""Bench rows (a) to (d2): the session functions against plain SQL on the same tables, and a
chat turn against the OpenAI Agents SDK's SQLAlchemySession.

(a) ``add`` of a 2-turn exchange against one prepared CTE writing the same rows; (b) and (c)
``session_get(limit_chars => 8000)`` on a 1,000-turn and a 100,000-turn session against one
plain-SQL read of the same items; (d) one chat turn (``add``, then ``session_messages(...,
limit_turns => 20)``) against the peer, and (d2) the same turn through our own Agents SDK
``Session``, ``AidbSession``. Every pair is verified to compute the same thing before it is
timed. bench/README.md says what each number means.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import psycopg
from common import ACTOR, DB, KEY, NS, check, connect, say, version
from measuring import Comparison, Measured

# --- the data -------------------------------------------------------------------------------
# Turn ``seq`` of every generated session has the same content, whether it was stored by `add` or
# generated in SQL; it repeats every 1,000 turns, so the newest 8,000 chars of the 1,000-turn and
# of the 100,000-turn session are the same turns (same count, same chars): (c)/(b) compares like
# with like. User turns are ~70-400 chars, assistant turns ~150-1,200.


def content(seq: int) -> str:
    k = (seq - 1) % 1000 + 1
    if seq % 2:
        return f"user {k}: " + "question words " * (k * 37 % 23 + 4)
    return f"assistant {k}: " + "answer text here " * (k * 53 % 61 + 8)


CONTENT_SQL = """
CASE WHEN mod(g, 2) = 1
     THEN 'user ' || (mod(g - 1, 1000) + 1) || ': '
          || repeat('question words ', mod((mod(g - 1, 1000) + 1) * 37, 23)::int + 4)
     ELSE 'assistant ' || (mod(g - 1, 1000) + 1) || ': '
          || repeat('answer text here ', mod((mod(g - 1, 1000) + 1) * 53, 61)::int + 8)
END
"""


def exchange(seq: int) -> str:
    """The 2-turn batch that stores turns seq and seq + 1 (seq odd)."""
    return json.dumps(
        [
            {"role": "user", "content": content(seq)},
            {"role": "assistant", "content": content(seq + 1)},
        ]
    )


# The exchange that (a) stores again and again: a 200-char question and a 600-char answer.
A_TURNS = json.dumps(
    [
        {"role": "user", "content": ("Where is my order 4711? It was due yesterday. " * 5)[:200]},
        {"role": "assistant", "content": ("Order 4711 left the warehouse today. " * 17)[:600]},
    ]
)
# The chat turn of (d).
D_USER = "My order 4711 has not arrived yet. Can you check where it is?"
D_ASSISTANT = (
    "I checked order 4711: it left the warehouse this morning and the carrier expects to deliver "
    "it tomorrow before noon. You will get a tracking link by email within the hour."
)

# --- the SQL of each path -----------------------------------------------------------------------

ADD = "SELECT aidb_memory.add(%s, %s, %s::jsonb, %s)"

# (a) reference: the rows `add` writes for a plain exchange, in one prepared statement: the session
# counters and tail, one event, the turn rows (positions and char offsets from the counters).
ADD_REF = """
WITH x AS (
    SELECT u.o, u.t->>'role' AS role, u.t->>'content' AS content, length(u.t->>'content') AS chars
    FROM jsonb_array_elements(%(turns)s::jsonb) WITH ORDINALITY AS u(t, o)
), agg AS (
    SELECT count(*) AS n, sum(chars) AS total, max(o) FILTER (WHERE role = 'user') AS last_user
    FROM x
), s AS (
    UPDATE aidb_memory.session AS s
    SET next_seq = s.next_seq + agg.n, total_chars = s.total_chars + agg.total,
        tail_sequence_id = NULL, tail_round_start = s.next_seq + agg.n - 1, open_calls = '{}',
        last_user_seq = coalesce(s.next_seq + agg.last_user - 1, s.last_user_seq),
        updated_at = now()
    FROM aidb_memory.namespace AS n, agg
    WHERE s.actor_key = %(key)s AND n.name = %(ns)s AND s.namespace_id = n.id
      AND s.actor_id = %(actor)s AND s.session_id = %(sid)s
    RETURNING s.actor_key, s.id, s.namespace_id, s.next_seq - agg.n AS first_seq,
              s.total_chars - agg.total AS first_offset
), e AS (
    INSERT INTO aidb_memory.event
        (actor_key, namespace_id, actor_id, session_id, turns_hash, turn_count, status)
    SELECT s.actor_key, s.namespace_id, %(actor)s, %(sid)s, NULL, agg.n, 'skipped' FROM s, agg
    RETURNING id, public_id
), t AS (
    INSERT INTO aidb_memory.turn
        (actor_key, session_ref, seq, round_start, char_offset, chars, role, content, kind,
         event_ref)
    SELECT s.actor_key, s.id, s.first_seq + x.o - 1, s.first_seq + x.o - 1,
           s.first_offset + sum(x.chars) OVER (ORDER BY x.o) - x.chars, x.chars, x.role, x.content,
           CASE x.role WHEN 'user' THEN 'user_prompt' WHEN 'assistant' THEN 'model_response'
                       WHEN 'tool' THEN 'tool_result' ELSE 'system' END,
           e.id
    FROM s, e, x
)
SELECT public_id FROM e
"""

GET = "SELECT * FROM aidb_memory.session_get(%s, %s, %s, limit_chars => %s)"

# (b)/(c) reference: the newest turns whose chars fit the budget, found on the same
# (session_ref, char_offset, seq) index, with the same keys, as one jsonb array.
GET_REF = """
SELECT coalesce(jsonb_agg(
           jsonb_build_object('seq', t.seq, 'role', t.role, 'content', t.content, 'kind', t.kind,
                              'meta', t.meta, 'created_at', t.created_at)
           || jsonb_strip_nulls(jsonb_build_object('tool_calls', t.tool_calls,
                                                   'tool_call_id', t.tool_call_id,
                                                   'name', t.name))
           ORDER BY t.seq), '[]'::jsonb) AS items
FROM aidb_memory.namespace AS n
JOIN aidb_memory.session AS s
  ON s.actor_key = %(key)s AND s.namespace_id = n.id AND s.actor_id = %(actor)s
 AND s.session_id = %(sid)s
JOIN aidb_memory.turn AS t
  ON t.actor_key = %(key)s AND t.session_ref = s.id
 AND t.char_offset >= s.total_chars - %(budget)s
WHERE n.name = %(ns)s
"""

MESSAGES = "SELECT aidb_memory.session_messages(%s, %s, %s, limit_turns => %s)"


def build_sessions(conn: psycopg.Connection[Any], big_turns: int) -> None:
    for sid in ("a-ours", "a-ref", "verify-add", "verify-ref", "small", "big"):
        conn.execute("SELECT * FROM aidb_memory.session_start(%s, %s, NULL, %s)", (NS, ACTOR, sid))
    # The 1,000-turn session: 500 real adds.
    t0 = time.perf_counter()
    for seq in range(1, 1000, 2):
        conn.execute(ADD, (NS, ACTOR, exchange(seq), "small"), prepare=True)
    say(f"  1,000-turn session 'small': 500 adds in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    build_big(conn, big_turns)
    say(
        f"  {big_turns:,}-turn session 'big': generated in SQL + 1 add, "
        f"{time.perf_counter() - t0:.1f} s"
    )


def build_big(conn: psycopg.Connection[Any], big_turns: int) -> None:
    """The session 'big' (started already) of ``big_turns`` turns, then VACUUM ANALYZE."""
    # The 100,000-turn session: all but the last exchange generated in SQL (an event per
    # exchange, turns with the positions, rounds and char offsets `add` would give them, the
    # session's counters and tail to match), then the last exchange through `add`.
    n = big_turns - 2
    found = conn.execute("SELECT id FROM aidb_memory.session WHERE session_id = 'big'").fetchone()
    assert found is not None
    ref = found[0]
    conn.execute(
        f"""
        WITH e AS (
            INSERT INTO aidb_memory.event
                (actor_key, namespace_id, actor_id, session_id, turns_hash, turn_count, status)
            SELECT s.actor_key, s.namespace_id, s.actor_id, s.session_id, 'generated:' || p, 2,
                   'skipped'
            FROM aidb_memory.session AS s, generate_series(1, %(n)s / 2) AS p
            WHERE s.actor_key = %(key)s AND s.id = %(ref)s
            RETURNING id, turns_hash
        ), c AS (
            SELECT g AS seq, CASE WHEN mod(g, 2) = 1 THEN 'user' ELSE 'assistant' END AS role,
                   {CONTENT_SQL} AS content
            FROM generate_series(1, %(n)s) AS g
        )
        INSERT INTO aidb_memory.turn
            (actor_key, session_ref, seq, round_start, char_offset, chars, role, content, kind,
             event_ref)
        SELECT %(key)s, %(ref)s, c.seq, c.seq,
               coalesce(sum(length(c.content)) OVER (ORDER BY c.seq ROWS BETWEEN UNBOUNDED
                                                     PRECEDING AND 1 PRECEDING), 0),
               length(c.content), c.role, c.content,
               CASE c.role WHEN 'user' THEN 'user_prompt' ELSE 'model_response' END, e.id
        FROM c JOIN e ON e.turns_hash = 'generated:' || ((c.seq + 1) / 2)
        """,
        {"n": n, "ref": ref, "key": KEY},
    )
    conn.execute(
        """
        UPDATE aidb_memory.session AS s
        SET next_seq = x.n + 1, total_chars = x.chars, tail_sequence_id = NULL,
            tail_round_start = x.n, open_calls = '{}', last_user_seq = x.last_user,
            updated_at = now()
        FROM (SELECT max(seq) AS n, sum(chars) AS chars,
                     max(seq) FILTER (WHERE role = 'user') AS last_user
              FROM aidb_memory.turn WHERE session_ref = %(ref)s) AS x
        WHERE s.id = %(ref)s
        """,
        {"ref": ref},
    )
    conn.execute(ADD, (NS, ACTOR, exchange(n + 1), "big"), prepare=True)
    conn.execute("VACUUM ANALYZE aidb_memory.turn")
    conn.execute("VACUUM ANALYZE aidb_memory.session")
    conn.execute("VACUUM ANALYZE aidb_memory.event")


TURN_COLS = (
    "seq, round_start, char_offset, chars, role, content, kind, name, tool_calls, tool_call_id, "
    "meta, event_ref IS NOT NULL"
)
SESSION_CONSISTENT = """
SELECT s.next_seq = max(t.seq) + 1 AND s.total_chars = sum(t.chars)
       AND s.tail_round_start = max(t.seq) AND s.tail_sequence_id IS NULL AND s.open_calls = '{}'
       AND s.last_user_seq = max(t.seq) FILTER (WHERE t.role = 'user')
       AND bool_and(t.round_start = t.seq) AND bool_and(t.char_offset = t.before)
       AND count(*) = max(t.seq)
FROM aidb_memory.session AS s,
     LATERAL (SELECT seq, round_start, role, chars, char_offset,
                     sum(chars) OVER (ORDER BY seq) - chars AS before
              FROM aidb_memory.turn WHERE session_ref = s.id) AS t
WHERE s.session_id = %s
GROUP BY s.actor_key, s.id
"""


def verify(conn: psycopg.Connection[Any], big_turns: int) -> dict[str, Any]:
    """Before timing anything: each reference does what the function does."""
    # (a) the reference writes the rows `add` writes.
    for _ in range(2):
        conn.execute(ADD, (NS, ACTOR, A_TURNS, "verify-add"), prepare=True)
        conn.execute(
            ADD_REF,
            {"ns": NS, "actor": ACTOR, "key": KEY, "sid": "verify-ref", "turns": A_TURNS},
            prepare=True,
        )

    def rows(sql: str, sid: str) -> list[tuple[Any, ...]]:
        return conn.execute(sql, (sid,)).fetchall()

    turn_sql = (
        f"SELECT {TURN_COLS} FROM aidb_memory.turn t JOIN aidb_memory.session s "
        "ON s.id = t.session_ref WHERE s.session_id = %s ORDER BY seq"
    )
    check(
        rows(turn_sql, "verify-add") == rows(turn_sql, "verify-ref"),
        "(a) the reference writes the same turn rows as add (2 exchanges)",
    )
    session_sql = (
        "SELECT next_seq, total_chars, tail_sequence_id, tail_round_start, open_calls, "
        "last_user_seq, closed_at FROM aidb_memory.session WHERE session_id = %s"
    )
    check(
        rows(session_sql, "verify-add") == rows(session_sql, "verify-ref"),
        "(a) ... the same session counters and tail",
    )
    event_sql = (
        "SELECT namespace_id, actor_id, agent_id, idempotency_key, turns IS NULL, turn_count, "
        "status, turns_hash FROM aidb_memory.event WHERE session_id = %s ORDER BY id"
    )
    check(
        rows(event_sql, "verify-add") == rows(event_sql, "verify-ref"),
        "(a) ... and the same event rows (status, counts; no hash without an idempotency key)",
    )
    # The generated session is what adds would have made.
    cmp = conn.execute(
        f"""
        SELECT count(*) FILTER (WHERE a IS DISTINCT FROM b), count(*)
        FROM (SELECT seq, ({TURN_COLS}) AS a FROM aidb_memory.turn
              WHERE session_ref = (SELECT id FROM aidb_memory.session WHERE session_id = 'small'))
             AS x
        FULL JOIN (SELECT seq, ({TURN_COLS}) AS b FROM aidb_memory.turn
                   WHERE session_ref = (SELECT id FROM aidb_memory.session
                                        WHERE session_id = 'big') AND seq <= 1000) AS y
        USING (seq)
        """
    ).fetchone()
    check(
        cmp == (0, 1000),
        "(c) generated turns 1..1,000 of 'big' equal the 1,000 turns 'small' got through add",
    )
    for sid in ("small", "big"):
        check(
            conn.execute(SESSION_CONSISTENT, (sid,)).fetchone() == (True,),
            f"(b/c) session '{sid}': counters, tail, rounds and char offsets are consistent",
        )
    counts = conn.execute(
        "SELECT session_id, next_seq - 1 FROM aidb_memory.session "
        "WHERE session_id IN ('small', 'big') ORDER BY 2"
    ).fetchall()
    check(counts == [("small", 1000), ("big", big_turns)], f"turn counts {counts}")

    # (b)/(c) the reference returns the same items as session_get.
    shape: dict[str, Any] = {}
    for sid in ("small", "big"):
        got = conn.execute(GET, (NS, ACTOR, sid, 8000), prepare=True).fetchone()
        ref = conn.execute(
            GET_REF,
            {"ns": NS, "actor": ACTOR, "key": KEY, "sid": sid, "budget": 8000},
            prepare=True,
        ).fetchone()
        assert got is not None and ref is not None
        items = got[0]
        check(
            items == ref[0] and len(items) > 0,
            f"(b/c) '{sid}': session_get(limit_chars => 8000) returns the reference's "
            f"{len(items)} items",
        )
        chars = sum(len(i["content"]) for i in items)
        shape[sid] = {
            "items": len(items),
            "chars": chars,
            "seqs": [items[0]["seq"], items[-1]["seq"]],
            "overflow_chars": got[1],
            "warnings": got[3],
        }
        say(
            f"      {len(items)} items, {chars} chars, seq {items[0]['seq']}..{items[-1]['seq']}, "
            f"overflow_chars {got[1]}, warnings {got[3]}"
        )
    check(
        (shape["small"]["items"], shape["small"]["chars"])
        == (shape["big"]["items"], shape["big"]["chars"]),
        "(c) the two reads return the same number of items and chars",
    )
    return shape


# --- the peer -----------------------------------------------------------------------------------


def d_turns() -> list[Any]:
    return [{"role": "user", "content": D_USER}, {"role": "assistant", "content": D_ASSISTANT}]


async def verify_d(peer: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    """(d): after 12 chat turns both sides give back the same 20 messages."""
    for _ in range(12):
        await peer.add_items(d_turns())
        await aconn.execute(ADD, (NS, ACTOR, json.dumps(d_turns()), "d-verify"), prepare=True)
    theirs = await peer.get_items(limit=20)
    cur = await aconn.execute(MESSAGES, (NS, ACTOR, "d-verify", 20), prepare=True)
    row = await cur.fetchone()
    assert row is not None
    check(
        theirs == row[0] and len(theirs) == 20,
        "(d) SQLAlchemySession.get_items(limit=20) and session_messages(limit_turns => 20) "
        "return the same 20 messages",
    )
    await peer.clear_session()


async def verify_d_session(peer: Any, dsn: str) -> None:
    """(d) through AidbSession: after 12 chat turns, both Sessions give back the same 20 items."""
    from aidb_memory.integrations.openai_agents import AidbSession

    ours = AidbSession("d-verify-session", namespace=NS, actor_id=ACTOR, dsn=dsn)
    try:
        for _ in range(12):
            await peer.add_items(d_turns())
            await ours.add_items(d_turns())
        theirs = await peer.get_items(limit=20)
        mine = await ours.get_items(limit=20)
        check(
            theirs == mine and len(theirs) == 20,
            "(d) SQLAlchemySession.get_items(limit=20) and AidbSession.get_items(limit=20) "
            "return the same 20 items",
        )
        await peer.clear_session()
        await ours.clear_session()
    finally:
        await ours.close()


D_SESSION_TARGET = 1.0

# The full run's comparisons (a) to (d2), in the order its table shows them (report.py).
COMPARISONS = [
    Comparison(
        "a",
        "(a) add of a 2-turn exchange vs a plain-SQL reference writing the same rows",
        "throughput aidb_memory.add / reference (one CTE: session counters + event + 2 turn rows)",
        "a_add",
        "a_ref",
        "throughput",
        ">=",
        0.85,
    ),
    Comparison(
        "b",
        "(b) session_get(limit_chars => 8000) on a 1,000-turn session vs a plain-SQL reference",
        "throughput session_get / reference (newest turns fitting 8,000 chars, jsonb_agg of the "
        "same keys)",
        "b_get",
        "b_ref",
        "throughput",
        ">=",
        0.75,
    ),
    Comparison(
        "c",
        "(c) the same session_get on a 100,000-turn session",
        "mean latency (c) / mean latency (b): the cost must not grow with the history",
        "c_get",
        "b_get",
        "latency",
        "<=",
        1.1,
    ),
    Comparison(
        "d",
        "(d) one chat turn (append 2 messages, read the last 20) vs the OpenAI Agents SDK's "
        "SQLAlchemySession",
        "throughput ours (async psycopg: add + session_messages(limit_turns => 20)) / "
        "SQLAlchemySession (add_items + get_items(limit=20), asyncpg)",
        "d_ours",
        "d_peer",
        "throughput",
        ">=",
        4.0,
    ),
    Comparison(
        "d2",
        "(d) the same chat turn, both sides an Agents SDK Session: aidb_memory's AidbSession vs "
        "SQLAlchemySession",
        "throughput AidbSession (add_items + get_items(limit=20): add + session_messages(format "
        "=> 'responses', limit_items => 20), async psycopg) / SQLAlchemySession (the same calls, "
        "asyncpg)",
        "d_session",
        "d_peer",
        "throughput",
        ">=",
        D_SESSION_TARGET,
    ),
]
# Ratios the table shows for information, with no target: (num, den, metric, what).
INFO = [
    ("c_ref", "b_ref", "latency", "reference on 100,000 turns / on 1,000 turns (mean latency)"),
    ("d_ours_sync", "d_peer", "throughput", "ours in a sync psycopg loop / SQLAlchemySession"),
]


# The paths of (a) to (d2) in the groups they are measured in: a group's paths run side by side.
GROUPS = [
    ["a_add", "a_ref"],
    ["b_get", "b_ref", "c_get", "c_ref"],
    ["d_peer", "d_ours", "d_session", "d_ours_sync"],
]


@dataclass(frozen=True)
class PeerClasses:
    """The peer, SQLAlchemySession on an asyncpg engine, and our own Agents SDK Session: pyproject's
    [bench] extra, which only the full run needs."""

    session: Any  # agents.extensions.memory.sqlalchemy_session.SQLAlchemySession
    create_engine: Any  # sqlalchemy.ext.asyncio.create_async_engine
    aidb_session: Any  # aidb_memory.integrations.openai_agents.AidbSession

    @classmethod
    def load(cls) -> PeerClasses:
        """Raises ImportError when the [bench] extra is not installed."""
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
        from sqlalchemy.ext.asyncio import create_async_engine

        from aidb_memory.integrations.openai_agents import AidbSession

        return cls(SQLAlchemySession, create_async_engine, AidbSession)


def open_paths(
    runner: asyncio.Runner,
    dsn: str,
    port: int,
    args: argparse.Namespace,
    classes: PeerClasses,
    closing: ExitStack,
) -> dict[str, Measured]:
    """The paths of (a) to (d2), each on a connection of its own (``closing`` closes them), once
    (d) and (d2) are verified against the peer."""
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/{DB}"
    engine = classes.create_engine(url)
    closing.callback(lambda: runner.run(engine.dispose()))
    a_ours, a_ref = connect(dsn), connect(dsn)
    b_ours, b_ref = connect(dsn, raw_jsonb=True), connect(dsn, raw_jsonb=True)
    c_ours, c_ref = connect(dsn, raw_jsonb=True), connect(dsn, raw_jsonb=True)
    d_sync = connect(dsn)
    for conn in (a_ours, a_ref, b_ours, b_ref, c_ours, c_ref, d_sync):
        closing.callback(conn.close)
    # The read references plan as session_get's read statement does (its plan_cache_mode): under
    # `auto` their prepared statement ran generic plans (~4,300/s) until autovacuum analyzed
    # `turn`, grown by (a)'s inserts, mid-run, then custom plans (~2,050/s, each call planned):
    # two modes of the reference's own in one run (pg_prepared_statements' generic_plans and
    # custom_plans; bench/README.md).
    for conn in (b_ref, c_ref):
        conn.execute("SET plan_cache_mode = force_generic_plan")
    aconn = runner.run(psycopg.AsyncConnection.connect(dsn, autocommit=True))
    closing.callback(lambda: runner.run(aconn.close()))
    peer = classes.session("d-peer", engine=engine, create_tables=True)
    runner.run(verify_d(peer, aconn))
    session = classes.aidb_session("d-session", namespace=NS, actor_id=ACTOR, dsn=dsn)
    closing.callback(lambda: runner.run(session.close()))
    runner.run(verify_d_session(peer, dsn))

    def ref_params(sid: str) -> dict[str, Any]:
        return {"ns": NS, "actor": ACTOR, "key": KEY, "sid": sid, "budget": 8000}

    a_add_p = (NS, ACTOR, A_TURNS, "a-ours")
    a_ref_p = {"ns": NS, "actor": ACTOR, "key": KEY, "sid": "a-ref", "turns": A_TURNS}
    b_p, c_p = (NS, ACTOR, "small", 8000), (NS, ACTOR, "big", 8000)
    b_ref_p, c_ref_p = ref_params("small"), ref_params("big")

    def one(conn: psycopg.Connection[Any], sql: str, params: Any) -> Callable[[], Any]:
        def op() -> Any:
            return conn.execute(sql, params, prepare=True).fetchone()

        return op

    def d_sync_op() -> Any:
        d_sync.execute(ADD, (NS, ACTOR, json.dumps(d_turns()), "d-ours-sync"), prepare=True)
        return d_sync.execute(MESSAGES, (NS, ACTOR, "d-ours-sync", 20), prepare=True).fetchone()

    async def d_ours_op() -> Any:
        await aconn.execute(ADD, (NS, ACTOR, json.dumps(d_turns()), "d-ours"), prepare=True)
        cur = await aconn.execute(MESSAGES, (NS, ACTOR, "d-ours", 20), prepare=True)
        return await cur.fetchone()

    async def d_session_op() -> Any:
        await session.add_items(d_turns())
        return await session.get_items(limit=20)

    async def d_peer_op() -> Any:
        await peer.add_items(d_turns())
        return await peer.get_items(limit=20)

    psy = f"psycopg {version('psycopg')} sync"
    paths = {
        p.name: p
        for p in [
            Measured("a_add", "add (2 turns)", psy, op=one(a_ours, ADD, a_add_p)),
            Measured("a_ref", "plain-SQL insert (1 CTE)", psy, op=one(a_ref, ADD_REF, a_ref_p)),
            Measured("b_get", "session_get 8000ch, 1k turns", psy, op=one(b_ours, GET, b_p)),
            Measured("b_ref", "plain-SQL read, 1k turns", psy, op=one(b_ref, GET_REF, b_ref_p)),
            Measured(
                "c_get",
                f"session_get 8000ch, {args.big_turns // 1000}k turns",
                psy,
                op=one(c_ours, GET, c_p),
            ),
            Measured(
                "c_ref",
                f"plain-SQL read, {args.big_turns // 1000}k turns",
                psy,
                op=one(c_ref, GET_REF, c_ref_p),
            ),
            Measured(
                "d_peer",
                "SQLAlchemySession chat turn",
                f"SQLAlchemy {version('sqlalchemy')} asyncio + asyncpg {version('asyncpg')}",
                aop=d_peer_op,
            ),
            Measured(
                "d_ours",
                "aidb_memory chat turn",
                f"psycopg {version('psycopg')} async",
                aop=d_ours_op,
            ),
            Measured(
                "d_session",
                "AidbSession chat turn",
                f"psycopg {version('psycopg')} async",
                aop=d_session_op,
            ),
            Measured("d_ours_sync", "aidb_memory chat turn", psy, op=d_sync_op),
        ]
    }
    return paths
