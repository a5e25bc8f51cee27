"""The queue per key range (issue 15, item 4): a worker given a range of actor keys claims only
the events of actors whose key is in it, workers with disjoint ranges together work everything,
and a range that is not one is refused (22023) before anything is claimed."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import psycopg
import pytest

from aidb_memory.ops.worker import KEY_MAX, KEY_MIN, key_ranges
from conftest import APP_USER, WORKER_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, serve

NS = "ranges"
CALL = (
    "CALL aidb_memory.process_events(max_events => 100, lease_s => 60, backoff_s => 0, "
    "key_min => %s::bigint, key_max => %s::bigint)"
)
BOTH = "key_min and key_max must both be given or both be NULL"
# key_ranges(2): the negative keys, then the others.
LOW, HIGH = key_ranges(2)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with serve() as server:
        server.default = lambda _r: Reply(
            content=json.dumps({"operations": [{"op": "add", "text": "A fact.", "target": None}]})
        )
        yield server


@pytest.fixture
def ns(db: Database, fake: FakeOpenAI) -> None:
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))


def _key(db: Database, actor: str) -> int:
    return int(db.value("SELECT aidb_memory.actor_key(%s, %s)", (NS, actor)))


def _actors(db: Database, per_range: int = 3) -> dict[str, int]:
    """Actors with their keys, ``per_range`` of them with a negative key and as many with a
    non-negative one."""
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    i = 0
    while len(low) < per_range or len(high) < per_range:
        actor = f"actor{i}"
        key = _key(db, actor)
        side = low if key < 0 else high
        if len(side) < per_range:
            side[actor] = key
        i += 1
    return {**low, **high}


def _add(db: Database, actors: dict[str, int]) -> None:
    for actor in actors:
        db.sql(
            "SELECT aidb_memory.add(%s, %s, %s::jsonb, 's')",
            (NS, actor, json.dumps([{"role": "user", "content": f"I am {actor}."}])),
            user=APP_USER,
        )


def _events(db: Database) -> dict[int, tuple[str, int]]:
    """actor_key -> (status, attempts) of every extraction event (one per actor here)."""
    rows = db.sql(
        "SELECT actor_key, status, attempts FROM aidb_memory.event WHERE kind = 'extraction'"
    )
    return {int(k): (str(s), int(a)) for k, s, a in rows}


def _work(db: Database, low: int | None, high: int | None) -> tuple[int, int, int]:
    with db.connect(WORKER_USER) as conn:
        row = conn.execute(CALL, (low, high)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_the_ranges_split_the_key_space() -> None:
    assert LOW == (KEY_MIN, -1) and HIGH == (0, KEY_MAX)
    for n in (1, 3, 7, 64):
        ranges = key_ranges(n)
        assert ranges[0][0] == KEY_MIN and ranges[-1][1] == KEY_MAX
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
        sizes = [hi - lo + 1 for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_two_workers_with_disjoint_ranges_each_claim_their_own_and_together_all(
    db: Database, fake: FakeOpenAI, ns: None
) -> None:
    actors = _actors(db)
    _add(db, actors)
    keys = set(actors.values())
    assert set(_events(db)) == keys
    assert _work(db, *LOW) == (3, 0, 0)
    after_low = _events(db)
    for key, (status, attempts) in after_low.items():
        if key < 0:
            assert (status, attempts) == ("processed", 1), key
        else:
            assert (status, attempts) == ("accepted", 0), f"{key} is not the first worker's"
    assert len(fake.calls()) == 3
    assert _work(db, *HIGH) == (3, 0, 0)
    assert all(v == ("processed", 1) for v in _events(db).values())
    assert len(fake.calls()) == 6, "each event was worked once"
    # Every memory is its actor's, under its actor's key.
    memories = db.sql("SELECT actor_id, actor_key FROM aidb_memory.memory ORDER BY actor_id")
    assert sorted(memories) == sorted(actors.items())
    assert _work(db, None, None) == (0, 0, 0), "nothing left for a worker without a range"


def test_workers_at_once_on_disjoint_ranges(db: Database, fake: FakeOpenAI, ns: None) -> None:
    """Two sessions each in a transaction of their own claim at the same time: each takes an
    event of its range, none of the other's."""
    actors = _actors(db, per_range=1)
    _add(db, actors)
    with (
        db.connect(WORKER_USER, autocommit=False) as a,
        db.connect(WORKER_USER, autocommit=False) as b,
    ):
        claim = "SELECT actor_key, kind FROM aidb_memory.event_claim(60, 5, %s, %s)"
        (got_a,) = a.execute(claim, LOW).fetchall()
        (got_b,) = b.execute(claim, HIGH).fetchall()
        assert got_a[0] < 0 <= got_b[0] and got_a[1] == got_b[1] == "extraction"
        assert a.execute(claim, LOW).fetchall() == [], "the first range has no other event"
        a.rollback()
        b.rollback()
    assert all(v == ("accepted", 0) for v in _events(db).values()), "rolled back: unclaimed"


def test_a_range_without_events_claims_nothing(db: Database, fake: FakeOpenAI, ns: None) -> None:
    actors = _actors(db, per_range=2)
    _add(db, actors)
    keys = sorted(actors.values())
    empty = (keys[0] + 1, keys[1] - 1)  # between the two smallest keys
    assert empty[0] <= empty[1]
    with db.connect(WORKER_USER) as conn:
        claimed = conn.execute(
            "SELECT * FROM aidb_memory.event_claim(60, 5, %s, %s)", empty
        ).fetchall()
    assert claimed == []
    assert _work(db, *empty) == (0, 0, 0)
    one = (keys[0], keys[0])  # a range of one key: that actor's event alone
    assert _work(db, *one) == (1, 0, 0)
    states = _events(db)
    assert states.pop(keys[0]) == ("processed", 1)
    assert all(v == ("accepted", 0) for v in states.values())
    assert len(fake.calls()) == 1


@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        (5, 1, "aidb_memory.process_events: key_min must not be greater than key_max"),
        (1, None, f"aidb_memory.process_events: {BOTH}"),
        (None, 1, f"aidb_memory.process_events: {BOTH}"),
    ],
)
def test_a_bad_range_is_refused_before_anything_is_claimed(
    db: Database, fake: FakeOpenAI, ns: None, low: int | None, high: int | None, message: str
) -> None:
    _add(db, _actors(db, per_range=1))
    before = _events(db)
    for statement in (CALL, "SELECT * FROM aidb_memory.event_claim(60, 5, %s::bigint, %s::bigint)"):
        with db.connect(WORKER_USER) as conn, pytest.raises(psycopg.Error) as caught:
            conn.execute(statement, (low, high))
        assert caught.value.sqlstate == "22023"
        assert caught.value.diag.message_primary == message
    assert _events(db) == before
    assert all(v == ("accepted", 0) for v in before.values())
    assert fake.calls() == []


def test_the_worker_command_takes_a_key_range(db: Database, fake: FakeOpenAI, ns: None) -> None:
    actors = _actors(db, per_range=2)
    _add(db, actors)
    split = run_cli("worker", "--split-key-space", "2")
    assert split.returncode == 0, split.stderr
    lines = split.stdout.splitlines()
    assert lines == [f"--key-range={lo}:{hi}" for lo, hi in (LOW, HIGH)]
    result = run_cli("worker", "--once", lines[1], dsn=db.dsn(WORKER_USER))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith(f"; only actor keys {HIGH[0]} to {HIGH[1]}")
    assert "worker: stopped; processed 2, failed 0, retried 0" in result.stdout
    states = _events(db)
    assert {k: v for k, v in states.items() if k >= 0} == dict.fromkeys(
        (k for k in states if k >= 0), ("processed", 1)
    )
    assert all(v == ("accepted", 0) for k, v in states.items() if k < 0)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("--key-range=5:1", "argument --key-range: MIN 5 is greater than MAX 1"),
        ("--key-range=1", "argument --key-range: '1' is not MIN:MAX, two integers"),
        ("--key-range=a:b", "argument --key-range: 'a:b' is not MIN:MAX, two integers"),
        ("--key-range=0:9223372036854775808", "9223372036854775808 is outside the keys"),
    ],
)
def test_the_worker_command_refuses_a_bad_key_range(
    db: Database, fake: FakeOpenAI, ns: None, value: str, error: str
) -> None:
    _add(db, _actors(db, per_range=1))
    result = run_cli("worker", "--once", value, dsn=db.dsn(WORKER_USER))
    assert result.returncode == 2
    assert error in result.stderr
    assert result.stdout == "", "refused before it connected"
    assert all(v == ("accepted", 0) for v in _events(db).values())
