"""LangGraph's TTL in AidbStore (issue 34 item 7): ``put(ttl=minutes)`` is remember's ``ttl_s``
(``ceil(minutes * 60)``), ``default_ttl`` applies to a put without one, a put in place sets the
expiry it gives; an expired item is gone from get, search and list_namespaces before any sweep;
in a store made with ``ttl``, a read renews what it returns (get: ``get_memory(refresh_ttl)``, one
call; search: one ``get_memory`` per expiring item), as ``refresh_on_read`` or the read's
``refresh_ttl`` says; a store made without it renews nothing; sweeping is the worker's.

Time passes as tests/db/test_memory_expiry.py makes it pass: the superuser moves a memory's
``expires_at`` (into the past: expired; to a minute from now: nearly expired, so that a renewal
shows), and reads how far away it is."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest
from langgraph.store.base import PutOp
from test_integration_langgraph import CountingMemory

from aidb_memory.client import Memory
from aidb_memory.integrations.langgraph import AidbStore
from conftest import APP_USER, Database

NS = "lgttl"
ERIN = (NS, "erin")
NOTES = (*ERIN, "notes")


@pytest.fixture
def dsn(db: Database) -> str:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    return db.dsn(APP_USER)


@pytest.fixture
def plain(dsn: str) -> Any:
    """A store made without ``ttl``."""
    store = AidbStore(dsn=dsn)
    yield store
    store.close()


@pytest.fixture
def expiring(dsn: str) -> Any:
    """A store made with LangGraph's TTL configuration: items live 10 minutes from their last
    write or read."""
    store = AidbStore(dsn=dsn, ttl={"default_ttl": 10, "sweep_interval_minutes": 5})
    yield store
    store.close()


def _expiry(db: Database, key: str) -> tuple[float | None, int | None]:
    """(seconds until the memory of the aidb key expires, its ttl_s), as the server holds them."""
    rows = db.sql(
        "SELECT extract(epoch FROM expires_at - now())::float8, ttl_s FROM aidb_memory.memory "
        "WHERE actor_id = 'erin' AND key = %s",
        (key,),
    )
    assert len(rows) == 1, f"one memory of key {key!r}, not {rows}"
    return rows[0][0], rows[0][1]


def _left(db: Database, key: str) -> float:
    seconds, _ = _expiry(db, key)
    assert seconds is not None, f"{key!r} expires"
    return seconds


def _move(db: Database, key: str, interval: str) -> None:
    """Move the memory's expiry to now + interval, as time passing would (a negative interval:
    it has expired)."""
    db.sql(
        "UPDATE aidb_memory.memory SET expires_at = now() + %s::interval "
        "WHERE actor_id = 'erin' AND key = %s",
        (interval, key),
    )


def test_the_store_supports_ttl_and_keeps_its_configuration(
    plain: AidbStore, expiring: AidbStore
) -> None:
    assert plain.supports_ttl is True and expiring.supports_ttl is True
    assert plain.ttl_config is None
    assert expiring.ttl_config == {"default_ttl": 10, "sweep_interval_minutes": 5}
    # Sweeping is the worker's: nothing starts, and code written for PostgresStore runs.
    future = expiring.start_ttl_sweeper()
    assert isinstance(future, concurrent.futures.Future)
    assert future.done() and future.result() is None
    assert expiring.stop_ttl_sweeper(timeout=1) is True


def test_put_with_a_ttl_in_minutes_is_a_time_to_live_in_seconds(
    db: Database, plain: AidbStore
) -> None:
    plain.put(ERIN, "call", {"text": "Erin is on a call"}, ttl=5)
    left, ttl_s = _expiry(db, "call")
    assert ttl_s == 300
    assert left is not None and 290 < left <= 300
    item = plain.get(ERIN, "call")
    assert item is not None and item.value == {"text": "Erin is on a call"}
    assert [i.key for i in plain.search(ERIN, query="call")] == ["call"]
    # Fractions of a minute round up to a whole second, at least one.
    plain.put(NOTES, "tenth", {"text": "a tenth of a minute"}, ttl=0.1)
    assert _expiry(db, "notes..tenth")[1] == 6
    plain.put(NOTES, "instant", {"text": "a moment"}, ttl=0.001)
    assert _expiry(db, "notes..instant")[1] == 1
    plain.put(NOTES, "third", {"text": "a third of a minute"}, ttl=1 / 3)
    assert _expiry(db, "notes..third")[1] == 20


def test_a_put_without_ttl_in_a_store_without_default_never_expires(
    db: Database, plain: AidbStore
) -> None:
    plain.put(ERIN, "home", {"text": "Erin lives in Lisbon"})
    assert _expiry(db, "home") == (None, None)
    # A put in place sets the expiry it gives: a ttl, another, then none again.
    plain.put(ERIN, "home", {"text": "Erin lives in Lisbon"}, ttl=5)
    assert _expiry(db, "home")[1] == 300
    plain.put(ERIN, "home", {"text": "Erin lives in Lisbon"}, ttl=60)
    assert _expiry(db, "home")[1] == 3600
    assert 3590 < _left(db, "home") <= 3600
    plain.put(ERIN, "home", {"text": "Erin lives in Porto"})
    assert _expiry(db, "home") == (None, None)
    item = plain.get(ERIN, "home")
    assert item is not None and item.value == {"text": "Erin lives in Porto"}


def test_default_ttl_applies_to_a_put_without_one(db: Database, expiring: AidbStore) -> None:
    expiring.put(ERIN, "seat", {"text": "Erin prefers window seats"})
    assert _expiry(db, "seat")[1] == 600
    assert 590 < _left(db, "seat") <= 600
    expiring.put(ERIN, "bike", {"text": "Erin travels with a folding bike"}, ttl=1)
    assert _expiry(db, "bike")[1] == 60
    # ttl=None says no expiry, whatever the default.
    expiring.put(ERIN, "home", {"text": "Erin lives in Lisbon"}, ttl=None)
    assert _expiry(db, "home") == (None, None)
    # A batch's PutOp is taken as it is (LangGraph applies the default in put, not in batch).
    expiring.batch([PutOp(ERIN, "raw", {"text": "as it is"})])
    assert _expiry(db, "raw") == (None, None)


def test_an_expired_item_is_gone_from_get_search_and_list_namespaces(
    db: Database, plain: AidbStore
) -> None:
    plain.put(ERIN, "home", {"text": "Erin lives in Lisbon"})
    plain.put(NOTES, "call", {"text": "Erin is on a call in Lisbon"}, ttl=5)
    assert plain.get(NOTES, "call") is not None
    assert {i.key for i in plain.search(ERIN, query="Lisbon")} == {"home", "call"}
    assert plain.list_namespaces(prefix=ERIN) == [ERIN, NOTES]
    _move(db, "notes..call", "-1 second")
    assert plain.get(NOTES, "call") is None
    assert [i.key for i in plain.search(ERIN)] == ["home"]
    assert [i.key for i in plain.search(NOTES)] == []
    assert [i.key for i in plain.search(ERIN, query="Lisbon")] == ["home"]
    assert plain.search(ERIN, query="call") == []
    assert plain.list_namespaces(prefix=ERIN) == [ERIN]
    # Nothing was swept: the reads left it out themselves.
    assert db.value("SELECT count(*) FROM aidb_memory.memory WHERE key = 'notes..call'") == 1
    # A put on its key makes the item anew.
    plain.put(NOTES, "call", {"text": "Erin is on another call"})
    item = plain.get(NOTES, "call")
    assert item is not None and item.value == {"text": "Erin is on another call"}


def test_a_get_renews_the_items_time_to_live(db: Database, expiring: AidbStore) -> None:
    expiring.put(NOTES, "call", {"text": "Erin is on a call"})
    _move(db, "notes..call", "1 minute")
    assert expiring.get(NOTES, "call", refresh_ttl=False) is not None
    assert _left(db, "notes..call") <= 60, "refresh_ttl=False leaves it"
    assert expiring.get(NOTES, "call") is not None
    assert 590 < _left(db, "notes..call") <= 600, "refresh_on_read (True by default) renews it"
    _move(db, "notes..call", "1 minute")
    assert expiring.get(NOTES, "call", refresh_ttl=True) is not None
    assert 590 < _left(db, "notes..call") <= 600
    # A memory without a time to live gets none from a read.
    expiring.put(ERIN, "home", {"text": "Erin lives in Lisbon"}, ttl=None)
    assert expiring.get(ERIN, "home") is not None
    assert _expiry(db, "home") == (None, None)


def test_a_keyless_memory_got_by_its_id_is_renewed(
    db: Database, dsn: str, expiring: AidbStore
) -> None:
    with Memory(dsn) as memory:
        keyless = memory.remember(NS, "erin", "Erin is in Oslo this week", ttl_s=600)
    expiring.put(ERIN, "call", {"text": "Erin is on a call"})
    keyed = _memory_id_of_key(dsn, "call")

    def left(memory_id: Any) -> float:
        return float(
            db.value(
                "SELECT extract(epoch FROM expires_at - now()) FROM aidb_memory.memory "
                "WHERE public_id = %s",
                (memory_id,),
            )
        )

    for memory_id in (keyless, keyed):
        db.sql(
            "UPDATE aidb_memory.memory SET expires_at = now() + interval '1 minute' "
            "WHERE public_id = %s",
            (memory_id,),
        )
    item = expiring.get(ERIN, str(keyless))
    assert item is not None and item.value["content"] == "Erin is in Oslo this week"
    assert 590 < left(keyless) <= 600
    # A keyed memory's id is no key of an item: nothing is got, nothing renewed.
    assert expiring.get(ERIN, str(keyed)) is None
    assert left(keyed) <= 60


def test_a_search_renews_the_items_it_returns(db: Database, expiring: AidbStore) -> None:
    expiring.put(NOTES, "call", {"text": "Erin is on a call"})
    expiring.put(NOTES, "trip", {"text": "Erin flies to Oslo"})
    expiring.put(ERIN, "home", {"text": "Erin lives in Lisbon"}, ttl=None)
    for key in ("notes..call", "notes..trip"):
        _move(db, key, "1 minute")
    # Without a query: every item returned that expires.
    assert {i.key for i in expiring.search(NOTES, refresh_ttl=False)} == {"call", "trip"}
    assert _left(db, "notes..call") <= 60 and _left(db, "notes..trip") <= 60
    assert [i.key for i in expiring.search(NOTES, limit=1)] == ["trip"]
    assert 590 < _left(db, "notes..trip") <= 600
    assert _left(db, "notes..call") <= 60, "an item the search did not return is left"
    _move(db, "notes..trip", "1 minute")
    assert [i.key for i in expiring.search(NOTES, offset=1, limit=1)] == ["call"]
    assert 590 < _left(db, "notes..call") <= 600
    assert _left(db, "notes..trip") <= 60, "nor one it read to skip past (offset)"
    assert {i.key for i in expiring.search(ERIN)} == {"call", "trip", "home"}
    assert 590 < _left(db, "notes..call") <= 600
    assert _expiry(db, "home") == (None, None)
    # With a query: the hits.
    _move(db, "notes..call", "1 minute")
    _move(db, "notes..trip", "1 minute")
    assert [i.key for i in expiring.search(ERIN, query="Oslo", refresh_ttl=False)] == ["trip"]
    assert _left(db, "notes..trip") <= 60
    assert [i.key for i in expiring.search(ERIN, query="Oslo")] == ["trip"]
    assert 590 < _left(db, "notes..trip") <= 600
    assert _left(db, "notes..call") <= 60


def test_refresh_on_read_false_renews_only_when_a_read_asks(db: Database, dsn: str) -> None:
    store = AidbStore(memory=CountingMemory(dsn), ttl={"refresh_on_read": False})
    store.put(ERIN, "call", {"text": "Erin is on a call"}, ttl=10)
    _move(db, "call", "1 minute")
    assert store.get(ERIN, "call") is not None
    assert store.search(ERIN, query="call") != []
    assert _left(db, "call") <= 60
    assert store.get(ERIN, "call", refresh_ttl=True) is not None
    assert 590 < _left(db, "call") <= 600
    _move(db, "call", "1 minute")
    assert store.search(ERIN, query="call", refresh_ttl=True) != []
    assert 590 < _left(db, "call") <= 600


def test_a_store_made_without_ttl_renews_nothing(db: Database, dsn: str) -> None:
    client = CountingMemory(dsn)
    store = AidbStore(memory=client)
    store.put(ERIN, "call", {"text": "Erin is on a call"}, ttl=10)
    _move(db, "call", "1 minute")
    client.calls.clear()
    assert store.get(ERIN, "call", refresh_ttl=True) is not None
    assert store.search(ERIN, query="call", refresh_ttl=True) != []
    assert store.search(ERIN) != []
    assert [name for name, _ in client.calls] == ["get_memory", "search", "list_memories"]
    assert client.calls[0][1] == {"key": "call"}, "a plain read: no refresh_ttl"
    assert _left(db, "call") <= 60
    client.close()


def test_each_renewal_is_the_calls_it_names(dsn: str) -> None:
    client = CountingMemory(dsn)
    store = AidbStore(memory=client, ttl={})

    def calls(run: Any) -> list[tuple[str, dict[str, Any]]]:
        client.calls.clear()
        run()
        return list(client.calls)

    store.put(ERIN, "call", {"text": "Erin is on a call"}, ttl=10)
    store.put(ERIN, "home", {"text": "Erin lives in Lisbon on a call"})
    call_id = _memory_id(client, "call")
    # get: the one call, renewing.
    assert calls(lambda: store.get(ERIN, "call")) == [
        ("get_memory", {"key": "call", "refresh_ttl": True})
    ]
    # search without a query: list_memories says which expire; only those are renewed.
    assert calls(lambda: store.search(ERIN)) == [
        ("list_memories", {"limit": 10, "filter": None, "after": None}),
        ("get_memory", {"memory_id": call_id, "refresh_ttl": True}),
    ]
    # search with a query: both items are hits; only the one that expires is renewed.
    renewed = calls(lambda: store.search(ERIN, query="call"))
    assert renewed[0][0] == "search"
    assert {str(hit.key) for hit in store.search(ERIN, query="call", refresh_ttl=False)} == {
        "call",
        "home",
    }
    assert renewed[1:] == [("get_memory", {"memory_id": call_id, "refresh_ttl": True})]
    # refresh_ttl=False: the plain calls.
    assert calls(lambda: store.get(ERIN, "call", refresh_ttl=False)) == [
        ("get_memory", {"key": "call"})
    ]
    assert [name for name, _ in calls(lambda: store.search(ERIN, refresh_ttl=False))] == [
        "list_memories"
    ]
    client.close()


def _memory_id(client: Memory, key: str) -> Any:
    record = client.get_memory(NS, "erin", key=key)
    assert record is not None
    return record.id


def _memory_id_of_key(dsn: str, key: str) -> Any:
    with Memory(dsn) as memory:
        return _memory_id(memory, key)


def test_what_the_server_cannot_store_is_refused_before_any_call(dsn: str) -> None:
    client = CountingMemory(dsn)
    store = AidbStore(memory=client)
    for ttl, refusal in (
        (-1, "at least 0"),
        (float("nan"), "finite"),
        (5_256_001, "at most 5256000 minutes"),
        (True, "a number"),
    ):
        with pytest.raises(ValueError, match=refusal):
            store.put(ERIN, "k", {"text": "x"}, ttl=ttl)
    assert client.calls == []
    assert store.get(ERIN, "k") is None
    store.put(ERIN, "k", {"text": "x"}, ttl=5_256_000)  # ten years: the longest
    for config, refusal in (
        ({"default_ttl": -5}, "at least 0"),
        ({"default_ttl": 10**9}, "at most"),
        ({"refresh_on_read": "yes"}, "a bool"),
        ({"sweep_interval_minutes": 0}, "above 0"),
        ({"strategy": "delete"}, "not \\['strategy'\\]"),
    ):
        with pytest.raises(ValueError, match=refusal):
            AidbStore(dsn=dsn, ttl=config)
    with pytest.raises(TypeError, match="TTLConfig"):
        AidbStore(dsn=dsn, ttl=10)  # type: ignore[arg-type]
    # omit_expired is accepted: expired items are left out either way.
    assert AidbStore(dsn=dsn, ttl={"omit_expired": False}).ttl_config == {"omit_expired": False}
    client.close()


def test_async_puts_expire_and_reads_renew(db: Database, dsn: str) -> None:
    async def main() -> None:
        store = AidbStore(dsn=dsn, ttl={"default_ttl": 10})
        try:
            await store.aput(NOTES, "call", {"text": "Erin is on a call"})
            await store.aput(NOTES, "trip", {"text": "Erin flies to Oslo"}, ttl=1)
            assert _expiry(db, "notes..call")[1] == 600
            assert _expiry(db, "notes..trip")[1] == 60
            _move(db, "notes..call", "1 minute")
            assert await store.aget(NOTES, "call", refresh_ttl=False) is not None
            assert _left(db, "notes..call") <= 60
            assert await store.aget(NOTES, "call") is not None
            assert 590 < _left(db, "notes..call") <= 600
            _move(db, "notes..call", "1 minute")
            assert [i.key for i in await store.asearch(ERIN, query="call")] == ["call"]
            assert 590 < _left(db, "notes..call") <= 600
            _move(db, "notes..call", "1 minute")
            assert {i.key for i in await store.asearch(NOTES)} == {"call", "trip"}
            assert 590 < _left(db, "notes..call") <= 600
            _move(db, "notes..trip", "-1 second")
            assert await store.aget(NOTES, "trip") is None
            assert [i.key for i in await store.asearch(NOTES)] == ["call"]
            assert await store.asearch(ERIN, query="Oslo") == []
            await store.adelete(NOTES, "call")
            assert await store.alist_namespaces(prefix=ERIN) == []
        finally:
            await store.aclose()

    asyncio.run(main())
