"""Concurrent writers on one session (SPEC §3): gap-free positions, whole batches, one row."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from conftest import APP_USER, Database

NS = "conc"
WRITERS = 8
BATCHES = 200
TIMEOUT_S = 120
CONTENT = re.compile(r"w(\d+)-b(\d+)-t([01])")


def _run_concurrently(db: Database, work: Callable[[int, psycopg.Connection[Any]], None]) -> None:
    """Run ``work(writer, conn)`` in WRITERS threads, each with its own connection, released
    together by a barrier; re-raise the first failure."""
    conns = [db.connect(APP_USER) for _ in range(WRITERS)]
    barrier = threading.Barrier(WRITERS, timeout=TIMEOUT_S)
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            barrier.wait()
            work(w, conns[w])
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(WRITERS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), "a writer hung"
    finally:
        for c in conns:
            c.close()
    if errors:
        raise errors[0]


def _batch(w: int, b: int) -> list[dict[str, Any]]:
    """Writer ``w``'s batch ``b``: two turns whose content says whose they are and where.

    Even batches are a user and an assistant turn sharing the writer's sequence_id (so that
    consecutive batches of one writer join into one round); odd ones an answered tool call.
    Sizes vary, with multibyte characters, so that offsets are not a multiple of anything.
    """
    pad = "é" * ((w * 7 + b) % 13)
    if b % 2 == 0:
        meta = {"sequence_id": f"w{w}"}
        return [
            {"role": "user", "content": f"w{w}-b{b}-t0{pad}", "meta": meta},
            {"role": "assistant", "content": f"w{w}-b{b}-t1", "meta": meta},
        ]
    call = f"w{w}b{b}"
    return [
        {
            "role": "assistant",
            "content": f"w{w}-b{b}-t0",
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": "f", "arguments": pad}}
            ],
        },
        {"role": "tool", "content": f"w{w}-b{b}-t1{pad}", "tool_call_id": call},
    ]


def _chars(turn: dict[str, Any]) -> int:
    return len(turn["content"] or "") + sum(
        len(c["function"]["arguments"]) for c in turn.get("tool_calls", ())
    )


def test_eight_writers_on_one_session_get_gap_free_positions_and_whole_batches(
    db: Database,
) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    sid = "shared"

    def write(w: int, conn: psycopg.Connection[Any]) -> None:
        for b in range(BATCHES):
            conn.execute(
                "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, %s)",
                (NS, json.dumps(_batch(w, b)), sid),
            )

    _run_concurrently(db, write)

    rows = db.sql(
        "SELECT t.seq, t.content, t.chars, t.char_offset, t.round_start, "
        "       t.meta->>'sequence_id', t.role "
        "FROM aidb_memory.turn t JOIN aidb_memory.session s ON s.id = t.session_ref "
        "WHERE s.session_id = %s ORDER BY t.seq",
        (sid,),
    )
    n = WRITERS * BATCHES * 2
    assert [r[0] for r in rows] == list(range(1, n + 1)), "positions are 1..N without gaps"

    expected = {
        (t["content"], _chars(t))
        for w in range(WRITERS)
        for b in range(BATCHES)
        for t in _batch(w, b)
    }
    assert len(expected) == n
    assert sorted((r[1], r[2]) for r in rows) == sorted(expected), "every turn exactly once"

    # Each batch is whole and contiguous; each writer's batches are in its own order.
    position: dict[tuple[int, int, int], int] = {}
    writers_in_order = []
    for seq, content, *_ in rows:
        match = CONTENT.match(content)
        assert match is not None, content
        position[(int(match[1]), int(match[2]), int(match[3]))] = seq
        writers_in_order.append(int(match[1]))
    for w in range(WRITERS):
        seqs = [position[(w, b, t)] for b in range(BATCHES) for t in (0, 1)]
        assert seqs == sorted(seqs), f"writer {w}'s turns are out of order"
        for b in range(BATCHES):
            assert position[(w, b, 1)] == position[(w, b, 0)] + 1, "a batch was split"

    # The writers did race: batches of different writers are interleaved, not queued whole.
    switches = sum(a != b for a, b in itertools.pairwise(writers_in_order))
    assert switches > 2 * WRITERS, "the writers ran one after another, not concurrently"

    # Offsets: each turn's char_offset is the sum of the chars of every earlier turn.
    running = 0
    for _seq, content, chars, offset, *_ in rows:
        assert offset == running, f"char_offset of {content}"
        running += chars
    assert db.sql(
        "SELECT next_seq, total_chars FROM aidb_memory.session WHERE session_id = %s", (sid,)
    ) == [(n + 1, running)]
    # chars as PostgreSQL counts them (content plus arguments) agree with the stored ones.
    assert (
        db.value(
            "SELECT count(*) FROM aidb_memory.turn t"
            " WHERE t.chars <> coalesce(length(t.content), 0)"
            "  + coalesce((SELECT sum(length(c->'function'->>'arguments'))"
            "              FROM jsonb_array_elements(t.tool_calls) c), 0)"
        )
        == 0
    )

    # Rounds follow the order the writers' batches actually landed in: a turn joins the round
    # before it when it is a tool result or shares that turn's sequence_id.
    prev_sequence, prev_start = None, None
    for seq, content, _, _, round_start, sequence, role in rows:
        joins = prev_start is not None and (
            role == "tool" or (sequence is not None and sequence == prev_sequence)
        )
        expected_start = prev_start if joins else seq
        assert round_start == expected_start, f"round_start of {content}"
        prev_sequence, prev_start = sequence, round_start

    assert (
        db.value("SELECT count(*) FROM aidb_memory.event WHERE session_id = %s", (sid,))
        == WRITERS * BATCHES
    )

    # The whole history reads back in position order, every call with its result.
    items = db.value("SELECT items FROM aidb_memory.session_get(%s, 'actor', %s)", (NS, sid))
    assert [i["content"] for i in items] == [r[1] for r in rows]


def test_concurrent_first_adds_create_one_session(db: Database) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    sessions = [f"new{k}" for k in range(6)]

    def write(w: int, conn: psycopg.Connection[Any]) -> None:
        for sid in sessions:
            if w % 2 and sid.endswith(("1", "3")):
                # Half the writers open the session explicitly, racing the others' adds.
                conn.execute(
                    "SELECT * FROM aidb_memory.session_start(%s, 'actor', 'agent', %s)", (NS, sid)
                )
            conn.execute(
                "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, %s)",
                (NS, json.dumps([{"role": "user", "content": f"{sid}-w{w}"}]), sid),
            )

    _run_concurrently(db, write)

    for sid in sessions:
        assert db.sql(
            "SELECT count(*), min(next_seq), min(total_chars) FROM aidb_memory.session "
            "WHERE session_id = %s",
            (sid,),
        ) == [(1, WRITERS + 1, sum(len(f"{sid}-w{w}") for w in range(WRITERS)))]
        rows = db.sql(
            "SELECT t.seq, t.content FROM aidb_memory.turn t "
            "JOIN aidb_memory.session s ON s.id = t.session_ref WHERE s.session_id = %s "
            "ORDER BY t.seq",
            (sid,),
        )
        assert [r[0] for r in rows] == list(range(1, WRITERS + 1))
        assert sorted(r[1] for r in rows) == sorted(f"{sid}-w{w}" for w in range(WRITERS))


def test_racing_retries_with_one_idempotency_key_store_the_batch_once(db: Database) -> None:
    """Eight clients retry one batch at once: one event, one copy, the same id for all; the
    positions the losers had allocated are given back (the next add continues gap-free)."""
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    db.sql(
        "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, 'keyed')",
        (NS, json.dumps([{"role": "user", "content": "before"}])),
    )
    batch = json.dumps(_batch(0, 0))
    ids: list[Any] = [None] * WRITERS

    def retry(w: int, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, 'keyed', NULL, 'k1')", (NS, batch)
        ).fetchone()
        assert row is not None
        ids[w] = row[0]

    _run_concurrently(db, retry)
    assert len(set(ids)) == 1 and ids[0] is not None
    assert db.value("SELECT count(*) FROM aidb_memory.event WHERE idempotency_key = 'k1'") == 1
    db.sql(
        "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, 'keyed')",
        (NS, json.dumps([{"role": "user", "content": "after"}])),
    )
    rows = db.sql(
        "SELECT t.seq, t.content, t.char_offset FROM aidb_memory.turn t "
        "JOIN aidb_memory.session s ON s.id = t.session_ref WHERE s.session_id = 'keyed' "
        "ORDER BY t.seq"
    )
    contents = ["before", *(t["content"] for t in _batch(0, 0)), "after"]
    assert [(r[0], r[1]) for r in rows] == list(enumerate(contents, start=1))
    offsets = [0]
    for c in contents[:-1]:
        offsets.append(offsets[-1] + len(c))
    assert [r[2] for r in rows] == offsets
    assert db.sql(
        "SELECT next_seq, total_chars FROM aidb_memory.session WHERE session_id = 'keyed'"
    ) == [(len(contents) + 1, sum(len(c) for c in contents))]


def test_one_key_racing_with_different_batches_keeps_one_and_refuses_the_rest(
    db: Database,
) -> None:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    outcomes: list[Any] = [None] * WRITERS

    def write(w: int, conn: psycopg.Connection[Any]) -> None:
        try:
            row = conn.execute(
                "SELECT aidb_memory.add(%s, 'actor', %s::jsonb, %s, NULL, 'k2')",
                (NS, json.dumps(_batch(w, 0)), f"sess{w % 2}"),
            ).fetchone()
            outcomes[w] = ("ok", row[0] if row else None)
        except psycopg.Error as e:
            outcomes[w] = ("error", e.sqlstate)

    _run_concurrently(db, write)
    won = [w for w, o in enumerate(outcomes) if o[0] == "ok"]
    assert len(won) == 1, outcomes
    assert sorted(o for o in outcomes if o[0] == "error") == [("error", "23505")] * (WRITERS - 1)
    rows = db.sql(
        "SELECT s.session_id, t.seq, t.content FROM aidb_memory.turn t "
        "JOIN aidb_memory.session s ON s.id = t.session_ref ORDER BY s.session_id, t.seq"
    )
    winner = won[0]
    assert rows == [
        (f"sess{winner % 2}", i + 1, t["content"]) for i, t in enumerate(_batch(winner, 0))
    ]
    assert db.value("SELECT count(*) FROM aidb_memory.event") == 1
    # A refused add creates nothing, not even the session it named.
    assert db.sql("SELECT session_id, next_seq, total_chars FROM aidb_memory.session") == [
        (f"sess{winner % 2}", 3, sum(_chars(t) for t in _batch(winner, 0)))
    ]
