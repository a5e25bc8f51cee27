"""LangGraph store (issue 12 item 3, issue 34 item 7): AidbStore against a real server with the
real langgraph. Items are memories: put stores any JSON object as a memory's metadata under the
application's key (remember with a key: found at once, no model; a repeated key is a put in
place), get reads it by its key (one probe), the namespace's tuple names the aidb namespace, the
actor and a sub-namespace (kept apart by the key), search filters by the server, pages without a
ceiling (no query) or within search's bounds, list_namespaces lists an actor's sub-namespaces,
memories made outside the store are items too, what cannot be honoured is refused, async too, and
a compiled graph uses it as its store.

The installed langgraph (1.2) and langgraph-checkpoint (4.3) ship no store conformance tests
(their wheels hold no tests; langgraph-checkpoint-conformance covers checkpointers, and is not
installed): this file and tests/db/test_langgraph_differential.py (the same operations against
LangGraph's InMemoryStore) are the store's tests."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from psycopg_pool import AsyncConnectionPool

from aidb_memory.client import AidbMemoryError, InvalidArgument, Memory
from aidb_memory.integrations.langgraph import DEFAULT_DELETE_REASON, AidbStore
from conftest import APP_USER, Database
from fake_openai import FakeOpenAI

NS = "lg"
ERIN = (NS, "erin")
FACTS = [
    ("Erin prefers window seats", "trip-1", "travel"),
    ("Erin is allergic to peanuts", "trip-1", "travel"),
    ("Erin lives in Lisbon", "trip-2", "travel"),
    ("Erin travels with a folding bike", "trip-2", "bikes"),
]


@pytest.fixture
def dsn(db: Database, fake: FakeOpenAI) -> str:
    """Erin's four memories without a key (as the extraction worker makes them), oldest first,
    and one of Fred's."""
    opts = {"model": "fake-chat", "base_url": fake.base_url, "max_retries": 0}
    db.sql("SELECT aidb_memory.create_model('chat', 'openai', %s::jsonb)", (json.dumps(opts),))
    db.sql('SELECT aidb_memory.init(%s, \'{"llm": "chat"}\')', (NS,))
    for i, (content, session, agent) in enumerate(FACTS):
        db.sql(
            """INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, agent_id,
                                               session_id, content, content_hash, created_at,
                                               lexemes)
               SELECT aidb_memory.actor_key(name, %s), id, %s, %s, %s, %s, md5(%s),
                      now() - make_interval(mins => %s), to_tsvector('english', %s)
               FROM aidb_memory.namespace WHERE name = %s""",
            ("erin", "erin", agent, session, content, content, 10 - i, content, NS),
        )
    db.sql(
        """INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content,
                                           content_hash, lexemes)
           SELECT aidb_memory.actor_key(name, 'fred'), id, 'fred', 'Fred prefers aisle seats',
                  'f', to_tsvector('english', 'Fred prefers aisle seats')
           FROM aidb_memory.namespace
           WHERE name = %s""",
        (NS,),
    )
    return db.dsn(APP_USER)


@pytest.fixture
def store(dsn: str) -> Any:
    store = AidbStore(dsn=dsn, agent_id="graph")
    yield store
    store.close()


@pytest.fixture
def memory(dsn: str) -> Any:
    with Memory(dsn) as client:
        yield client


class CountingMemory(Memory):
    """The sync client, recording each call of the SQL API it makes (method and arguments)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in ("get_memory", "list_memories", "search", "remember", "delete"):

            def recorded(*args: Any, **kwargs: Any) -> Any:
                self.calls.append((name, kwargs))
                return attribute(*args, **kwargs)

            return recorded
        return attribute


def test_is_a_base_store_with_ttl(store: AidbStore) -> None:
    # TTL's behaviour is tests/db/test_langgraph_ttl.py's.
    assert isinstance(store, BaseStore)
    assert store.supports_ttl is True
    assert store.ttl_config is None
    store.batch([PutOp(ERIN, "k", {"text": "x"}, ttl=5.0)])
    item = store.get(ERIN, "k")
    assert item is not None and item.value == {"text": "x"}


def test_memories_without_a_key_are_root_items_keyed_by_id(
    store: AidbStore, memory: Memory
) -> None:
    found = store.search(ERIN)
    assert [i.value["content"] for i in found] == [f[0] for f in reversed(FACTS)]
    assert all(isinstance(i, SearchItem) and i.score is None for i in found)
    assert all(i.namespace == ERIN for i in found)
    records = memory.list_memories(NS, "erin")
    assert [i.key for i in found] == [str(r.id) for r in records]
    assert found[0].value == {
        "content": "Erin travels with a folding bike",
        "agent_id": "bikes",
        "session_id": "trip-2",
    }
    assert [i.value["content"] for i in store.search(ERIN, limit=2, offset=1)] == [
        FACTS[2][0],
        FACTS[1][0],
    ]
    assert [i.value["content"] for i in store.search((NS, "fred"))] == ["Fred prefers aisle seats"]
    assert store.search((NS, "nobody")) == []
    # get by the id: the key probe misses, the id finds it; not another actor's; not a
    # sub-namespace's (ids are root keys only); a key that is no id is no item.
    lisbon = found[1]
    got = store.get(ERIN, lisbon.key)
    assert isinstance(got, Item)
    assert (got.key, got.value, got.namespace) == (lisbon.key, lisbon.value, ERIN)
    assert store.get((NS, "fred"), lisbon.key) is None
    assert store.get((*ERIN, "notes"), lisbon.key) is None
    assert store.get(ERIN, lisbon.key.upper()) is None
    assert store.get(ERIN, "not-a-uuid") is None
    store.delete((NS, "fred"), lisbon.key)  # not fred's: nothing happens
    assert store.get(ERIN, lisbon.key) is not None
    store.delete(ERIN, lisbon.key)
    assert store.get(ERIN, lisbon.key) is None
    assert len(memory.list_memories(NS, "erin")) == 3
    store.delete(ERIN, "not-a-uuid")  # deletes nothing, fails nothing
    assert len(store.search(ERIN)) == 3


def test_search_with_a_query_ranks(store: AidbStore) -> None:
    found = store.search(ERIN, query="allergic to peanuts", limit=2)
    assert found[0].value["content"] == "Erin is allergic to peanuts"
    assert found[0].score == 1.0
    assert len(found) <= 2
    window = store.search(ERIN, query="window seat")
    assert window[0].value["content"] == "Erin prefers window seats"
    assert "Fred prefers aisle seats" not in [i.value["content"] for i in window]
    assert store.search(ERIN, query="window seat", offset=1) == window[1:]
    assert store.search(ERIN, query="window seat", limit=0) == []


def test_put_stores_any_json_value_under_its_key(
    store: AidbStore, memory: Memory, db: Database, fake: FakeOpenAI
) -> None:
    value = {
        "theme": "dark",
        "font": {"size": 14, "family": "Inter"},
        "tags": ["ui", "night"],
        "ratio": 0.5,
        "beta": True,
        "none": None,
    }
    store.put(ERIN, "prefs", value)
    got = store.get(ERIN, "prefs")
    assert got is not None
    assert (got.namespace, got.key, got.value) == (ERIN, "prefs", value)
    # The value is the memory's metadata verbatim; its text (the strings) is the content that
    # search finds at once; the store's agent_id is recorded; no event, no model call.
    record = memory.get_memory(NS, "erin", key="prefs")
    assert record is not None
    assert record.metadata == value
    assert record.content == "dark\nInter\nui\nnight"
    assert record.agent_id == "graph"
    (hit,) = store.search(ERIN, query="dark night")
    assert (hit.key, hit.value, hit.namespace) == ("prefs", value, ERIN)
    assert db.value("SELECT count(*) FROM aidb_memory.event") == 0
    assert fake.requests == []
    # A put on the key is a put in place: the same memory, an update in its history; a repeated
    # put changes nothing.
    changed = {**value, "theme": "light"}
    store.put(ERIN, "prefs", changed)
    store.put(ERIN, "prefs", changed)
    again = memory.get_memory(NS, "erin", key="prefs")
    assert again is not None and again.id == record.id
    assert [v.operation for v in memory.memory_history(NS, "erin", record.id)] == [
        "add",
        "update",
    ]
    got = store.get(ERIN, "prefs")
    assert got is not None and got.value == changed
    assert got.updated_at > got.created_at
    # Listed newest first by creation: the put in place keeps its place.
    store.put(ERIN, "later", {"text": "Erin is later"})
    assert [i.key for i in store.search(ERIN, limit=2)] == ["later", "prefs"]
    # A value without text: its JSON is the content.
    store.put(ERIN, "count", {"n": 3})
    counted = memory.get_memory(NS, "erin", key="count")
    assert counted is not None and counted.content == '{"n": 3}'
    # Keys the store shows: blank and dotted ones too, each its own item.
    for key in ("", " ", "a.b", ".x", "x..y"):
        store.put(ERIN, key, {"k": key})
    for key in ("", " ", "a.b", ".x", "x..y"):
        got = store.get(ERIN, key)
        assert got is not None and got.value == {"k": key}, key


def test_index_names_the_fields_that_are_the_content(dsn: str, memory: Memory) -> None:
    store = AidbStore(dsn=dsn, index={"fields": ["text", "extra.notes[*]"]})
    value = {"text": "Erin likes jazz", "extra": {"notes": ["vinyl", 33]}, "other": "ignored"}
    store.put(ERIN, "music", value)
    store.put(ERIN, "title", value, index=["other"])
    store.put(ERIN, "hidden", value, index=False)
    store.put(ERIN, "nothing", {"other": "x"})  # none of the fields: the JSON
    contents = {
        key: record.content
        for key in ("music", "title", "hidden", "nothing")
        if (record := memory.get_memory(NS, "erin", key=key)) is not None
    }
    assert contents == {
        "music": "Erin likes jazz\nvinyl\n33",
        "title": "ignored",
        "hidden": "hidden",
        "nothing": '{"other": "x"}',
    }
    assert [i.key for i in store.search(ERIN, query="jazz")] == ["music"]
    assert [i.key for i in store.search(ERIN, query="ignored")] == ["title"]
    # Not indexed: a query does not find it by its value, but it is an item as any other.
    assert "hidden" not in [i.key for i in store.search(ERIN, query="jazz vinyl")]
    hidden = store.get(ERIN, "hidden")
    assert hidden is not None and hidden.value == value
    with pytest.raises(ValueError, match="embedding model"):
        AidbStore(dsn=dsn, index={"dims": 3, "embed": "openai:x", "fields": ["text"]})
    store.close()


def test_sub_namespaces_of_an_actor_stay_apart(store: AidbStore, memory: Memory) -> None:
    places = [ERIN, (*ERIN, "a"), (*ERIN, "b"), (*ERIN, "a", "x"), (*ERIN, "ab")]
    for place in places:
        store.put(place, "k", {"at": list(place)})
    store.put((*ERIN, "a"), "x..k", {"at": "a, key x..k"})  # not the ("a", "x") item "k"
    for place in places:
        got = store.get(place, "k")
        assert got is not None and got.value == {"at": list(place)}, place
        assert got.namespace == place
    # One memory each, keyed by its sub-namespace's labels, each with a '.', then '.' and the key.
    keys = sorted(r.key for r in memory.list_memories(NS, "erin") if r.key is not None)
    assert keys == ["a..k", "a..x..k", "a.x..k", "ab..k", "b..k", "k"]
    # A prefix selects its sub-namespaces (never "ab" for "a"), newest first.
    found = store.search((*ERIN, "a"))
    assert [(i.namespace, i.key) for i in found] == [
        ((*ERIN, "a"), "x..k"),
        ((*ERIN, "a", "x"), "k"),
        ((*ERIN, "a"), "k"),
    ]
    assert [i.key for i in store.search((*ERIN, "a", "x"))] == ["k"]
    assert store.search((*ERIN, "c")) == []
    everything = store.search(ERIN, limit=100)
    assert len(everything) == len(FACTS) + 6
    assert [i.value["content"] for i in everything[6:]] == [f[0] for f in reversed(FACTS)]
    # With a query and a filter too.
    (hit,) = store.search((*ERIN, "b"), query="erin", filter={"at": ["lg", "erin", "b"]})
    assert hit.namespace == (*ERIN, "b")
    store.delete((*ERIN, "a"), "k")
    assert store.get((*ERIN, "a"), "k") is None
    assert store.get((*ERIN, "a", "x"), "k") is not None
    assert store.get(ERIN, "k") is not None


def test_a_memory_keyed_through_the_sql_api_is_the_root_item_of_its_key(
    store: AidbStore, memory: Memory
) -> None:
    memory.remember(
        NS, "erin", "Erin's home airport is LIS", key="home_airport", metadata={"code": "LIS"}
    )
    got = store.get(ERIN, "home_airport")
    assert got is not None and got.value == {"code": "LIS"}
    store.put(ERIN, "home_airport", {"code": "OPO"})
    record = memory.get_memory(NS, "erin", key="home_airport")
    assert record is not None and record.metadata == {"code": "OPO"}
    # A key the store would not write ('.' but no '..') reads as a sub-namespace and a key.
    memory.remember(NS, "erin", "Erin's seat", key="seats.window", metadata={"row": 3})
    (seat,) = store.search((*ERIN, "seats"))
    assert (seat.namespace, seat.key, seat.value) == ((*ERIN, "seats"), "window", {"row": 3})


def test_a_put_on_a_keyless_memorys_id_replaces_it(
    store: AidbStore, db: Database, memory: Memory
) -> None:
    (old,) = store.search(ERIN, query="Lisbon", limit=1)
    store.put(ERIN, old.key, {"content": "Erin lives in Porto"})
    got = store.get(ERIN, old.key)
    assert got is not None and got.value == {"content": "Erin lives in Porto"}
    assert memory.get_memory(NS, "erin", memory_id=old.key) is None
    assert [i.key for i in store.search(ERIN, query="Porto")] == [old.key]
    assert store.search(ERIN, query="Lisbon") == []
    assert len(store.search(ERIN)) == len(FACTS)
    assert db.sql("SELECT action, reason FROM aidb_memory.audit_log") == [
        ("delete", DEFAULT_DELETE_REASON)
    ]
    # Again: the keyed item changes in place, nothing else is deleted.
    store.put(ERIN, old.key, {"content": "Erin lives in Faro"})
    assert len(store.search(ERIN)) == len(FACTS)
    assert len(db.sql("SELECT 1 FROM aidb_memory.audit_log")) == 1
    # Fred's memory is not Erin's to replace.
    (fred,) = store.search((NS, "fred"))
    store.put(ERIN, fred.key, {"content": "Erin likes trains"})
    assert store.get((NS, "fred"), fred.key) is not None


def test_each_operation_is_the_calls_it_names(dsn: str) -> None:
    client = CountingMemory(dsn)
    store = AidbStore(memory=client)

    def calls(run: Any) -> list[str]:
        client.calls.clear()
        run()
        return [name for name, _ in client.calls]

    assert calls(lambda: store.put(ERIN, "k", {"v": 1})) == ["remember"]
    assert calls(lambda: store.get(ERIN, "k")) == ["get_memory"]
    assert client.calls[0][1] == {"key": "k"}
    assert calls(lambda: store.get((*ERIN, "s"), "k")) == ["get_memory"]
    assert client.calls[0][1] == {"key": "s..k"}
    assert calls(lambda: store.search(ERIN)) == ["list_memories"]
    assert calls(lambda: store.search(ERIN, query="x", filter={"v": 1})) == ["search"]
    assert client.calls[0][1]["filter"] == {"metadata.v": {"$eq": 1}}
    assert calls(lambda: store.delete(ERIN, "k")) == ["get_memory", "delete"]
    assert calls(lambda: store.delete(ERIN, "k")) == ["get_memory"]
    # A root key that is an id: the id is tried after the key.
    some_id = str(uuid.uuid4())
    assert calls(lambda: store.get(ERIN, some_id)) == ["get_memory", "get_memory"]
    assert calls(lambda: store.put(ERIN, some_id, {"v": 2})) == ["remember", "get_memory"]
    assert calls(lambda: store.get(ERIN, some_id)) == ["get_memory"]
    client.close()


def test_search_without_a_query_pages_past_a_thousand(db: Database, dsn: str) -> None:
    # 1,205 keyed memories of the sub-namespace ("bulk",), created a second apart.
    db.sql(
        """INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content,
                                           content_hash, created_at, lexemes, metadata, key)
           SELECT aidb_memory.actor_key(name, 'erin'), id, 'erin', 'item ' || i, md5('i' || i),
                  now() - make_interval(secs => 2000 - i), to_tsvector('english', 'item'),
                  jsonb_build_object('i', i, 'even', i %% 2 = 0), 'bulk..' || i
           FROM aidb_memory.namespace, generate_series(1, 1205) AS i WHERE name = %s""",
        (NS,),
    )
    client = CountingMemory(dsn)
    store = AidbStore(memory=client)
    bulk = (*ERIN, "bulk")
    page = store.search(bulk, offset=1100, limit=50)
    assert [i.value["i"] for i in page] == list(range(105, 55, -1))
    assert [name for name, _ in client.calls] == ["list_memories", "list_memories"]
    assert store.search(bulk, offset=1200, limit=50) == store.search(bulk, limit=2000)[1200:]
    assert len(store.search(bulk, offset=1200, limit=50)) == 5
    evens = store.search(bulk, filter={"even": True}, offset=600, limit=10)
    assert [i.value["i"] for i in evens] == [4, 2]  # 602 even ones
    assert len(store.search(ERIN, limit=5000)) == 1205 + len(FACTS)
    assert store.list_namespaces(prefix=ERIN) == [ERIN, bulk]
    client.close()


def test_langgraph_filters_select_on_the_server_or_are_refused(store: AidbStore) -> None:
    people = {
        "ana": {"age": 31, "city": "Lisbon", "pet": {"kind": "cat", "age": 3}, "tags": ["a"]},
        "bo": {"age": 25, "city": "Porto", "pet": {"kind": "dog", "age": 9}, "tags": ["a", "b"]},
        "cy": {"age": 40.5, "city": "Lisbon", "pet": None, "tags": []},
        "di": {"age": 25, "city": "Faro"},
    }
    where = (*ERIN, "people")
    for key, value in people.items():
        store.put(where, key, value)

    def keys(filter: dict[str, Any], query: str | None = None) -> set[str]:
        return {i.key for i in store.search(where, filter=filter, query=query)}

    assert keys({"city": "Lisbon"}) == {"ana", "cy"}
    assert keys({"city": "Lisbon"}, query="Lisbon") == {"ana", "cy"}
    assert keys({"age": 25, "city": {"$ne": "Porto"}}) == {"di"}
    assert keys({"age": {"$gt": 25, "$lte": 40.5}}) == {"ana", "cy"}
    assert keys({"age": {"$gte": 31.0}}) == {"ana", "cy"}
    assert keys({"city": {"$lt": "Lz"}}) == {"ana", "cy", "di"}
    assert keys({"pet": {"kind": "dog"}}) == {"bo"}
    assert keys({"pet": {"age": {"$lt": 5}}}) == {"ana"}
    assert keys({"pet": {"kind": "cat", "age": 3}}) == {"ana"}
    assert keys({"pet": {"$eq": {"kind": "cat", "age": 3}}}) == {"ana"}
    assert keys({"pet": {"$eq": {"kind": "cat"}}}) == set()  # $eq is the whole value
    assert keys({"pet": None}) == {"cy", "di"}  # null, or absent
    assert keys({"pet": {"$ne": None}}) == {"ana", "bo"}
    assert keys({"tags": ["a", "b"]}) == {"bo"}
    assert keys({"tags": []}) == {"cy"}
    assert keys({"tags": {"$ne": ["a"]}}) == {"bo", "cy", "di"}
    assert keys({"age": True}) == set()  # JSON: true is no number
    for refused, named in (
        ({"pet.kind": "cat"}, "pet.kind"),
        ({"pet": {}}, "pet"),
        ({"pet": {"kind": None}}, "pet.kind"),
        ({"pet": {"kind": {"$ne": "cat"}}}, "pet.kind"),
        ({"tags": {"$in": ["a"]}}, r"tags\.\$in"),
        ({"$or": [{"age": 25}]}, r"\$or"),
        ({"tags": [{"a": 1}]}, "tags"),
        ({"pet": {"0": "x"}}, "pet.0"),
        ({"age": {"$gt": None}}, r"age\.\$gt"),
        ({"age": {"$gt": 1, "city": "x"}}, r"age\.city"),
        ({"age": float("nan")}, "JSON"),
    ):
        with pytest.raises(ValueError, match=named):
            store.search(where, filter=refused)


def test_namespace_layouts(dsn: str, memory: Memory) -> None:
    # LangGraph's (user_id, "memories"), the aidb namespace a setting: the same memories as the
    # default layout's (namespace, actor_id, "memories").
    users = AidbStore(dsn=dsn, namespace=NS)
    default = AidbStore(dsn=dsn)
    users.put(("erin", "memories"), "m1", {"text": "Erin likes trains"})
    got = default.get((*ERIN, "memories"), "m1")
    assert got is not None and got.value == {"text": "Erin likes trains"}
    assert [i.namespace for i in users.search(("erin", "memories"))] == [("erin", "memories")]
    assert {i.namespace for i in users.search(("erin",))} == {("erin",), ("erin", "memories")}
    assert users.list_namespaces(prefix=("erin",)) == [("erin",), ("erin", "memories")]
    assert users.list_namespaces(prefix=("erin",), max_depth=1) == [("erin",)]
    # The actor after a label: ("app", "memories", actor_id); the label is the sub-namespace.
    third = AidbStore(dsn=dsn, namespace=NS, actor_position=1)
    third.put(("memories", "erin"), "m2", {"text": "Erin likes buses"})
    third.put(("notes", "erin", "x"), "m3", {"text": "Erin likes ferries"})
    got = users.get(("erin", "memories"), "m2")
    assert got is not None and got.value == {"text": "Erin likes buses"}
    assert third.list_namespaces(prefix=("*", "erin")) == [
        ("memories", "erin"),
        ("notes", "erin", "x"),
    ]
    assert third.list_namespaces(prefix=("memories", "erin")) == [("memories", "erin")]
    assert third.list_namespaces(prefix=("*", "erin"), suffix=("x",)) == [("notes", "erin", "x")]
    # The root (keyless memories among them) has no place in this layout: never listed.
    assert [i.key for i in third.search(("memories", "erin"))] == ["m2", "m1"]
    with pytest.raises(InvalidNamespaceError, match="actor"):
        third.search(("memories",))
    # Every actor's: list_actors, which an open namespace refuses.
    with pytest.raises(AidbMemoryError, match="has no grants"):
        third.list_namespaces(prefix=("memories",))
    for bad in ({"actor_position": 0}, {"actor_position": -1}, {"namespace": ""}):
        with pytest.raises(ValueError, match="AidbStore"):
            AidbStore(dsn=dsn, **bad)
    for store in (users, default, third):
        store.close()


def test_list_namespaces_of_one_actor(store: AidbStore) -> None:
    assert store.list_namespaces(prefix=ERIN) == [ERIN]  # the keyless memories
    assert store.list_namespaces(prefix=ERIN, max_depth=1) == [(NS,)]
    assert store.list_namespaces(prefix=(NS, "nobody")) == []
    for place in [(*ERIN, "a"), (*ERIN, "a", "x"), (*ERIN, "b", "y", "z"), (NS, "fred", "a")]:
        store.put(place, "k", {"v": 1})
    assert store.list_namespaces(prefix=ERIN) == [
        ERIN,
        (*ERIN, "a"),
        (*ERIN, "a", "x"),
        (*ERIN, "b", "y", "z"),
    ]
    assert store.list_namespaces(prefix=ERIN, max_depth=3) == [ERIN, (*ERIN, "a"), (*ERIN, "b")]
    assert store.list_namespaces(prefix=(*ERIN, "a")) == [(*ERIN, "a"), (*ERIN, "a", "x")]
    assert store.list_namespaces(prefix=(*ERIN, "*", "x")) == [(*ERIN, "a", "x")]
    assert store.list_namespaces(prefix=ERIN, suffix=("z",)) == [(*ERIN, "b", "y", "z")]
    assert store.list_namespaces(prefix=ERIN, suffix=("*", "y", "*")) == [(*ERIN, "b", "y", "z")]
    assert store.list_namespaces(prefix=ERIN, limit=2, offset=1) == [
        (*ERIN, "a"),
        (*ERIN, "a", "x"),
    ]
    assert store.list_namespaces(prefix=(NS, "fred")) == [(NS, "fred"), (NS, "fred", "a")]
    # Two conditions: the one naming the actor decides whose memories are read, both select.
    both = ListNamespacesOp(
        (MatchCondition("prefix", (NS, "*", "a")), MatchCondition("prefix", ERIN))
    )
    assert store.batch([both]) == [[(*ERIN, "a"), (*ERIN, "a", "x")]]
    for prefix in (None, ("*", "erin")):
        with pytest.raises(NotImplementedError, match="names the aidb_memory namespace"):
            store.list_namespaces(prefix=prefix)
    with pytest.raises(NotImplementedError, match="names the aidb_memory namespace"):
        store.list_namespaces(suffix=ERIN)


def test_list_namespaces_of_every_actor(db: Database, store: AidbStore) -> None:
    """Without an actor in the prefix: every actor's, through list_actors, which lists only in a
    namespace with grants (issue 35)."""
    for place in [(*ERIN, "a"), (NS, "fred", "a"), (NS, "gail", "b", "c")]:
        store.put(place, "k", {"v": 1})
    for prefix in ((NS,), (NS, "*")):
        with pytest.raises(AidbMemoryError, match="has no grants"):
            store.list_namespaces(prefix=prefix)
    db.sql("SELECT aidb_memory.namespace_grant(%s, %s)", (NS, APP_USER))
    everyone = [
        ERIN,
        (*ERIN, "a"),
        (NS, "fred"),
        (NS, "fred", "a"),
        (NS, "gail", "b", "c"),
    ]
    assert store.list_namespaces(prefix=(NS,)) == everyone
    assert store.list_namespaces(prefix=(NS, "*")) == everyone
    assert store.list_namespaces(prefix=(NS, "*", "a")) == [(*ERIN, "a"), (NS, "fred", "a")]
    assert store.list_namespaces(prefix=(NS,), max_depth=2) == [ERIN, (NS, "fred"), (NS, "gail")]
    assert store.list_namespaces(prefix=(NS,), suffix=("c",)) == [(NS, "gail", "b", "c")]
    assert store.list_namespaces(prefix=(NS,), limit=2, offset=1) == [(*ERIN, "a"), (NS, "fred")]


def test_what_cannot_be_honoured_is_refused(store: AidbStore, memory: Memory) -> None:
    # Over the server's bounds of metadata: the client's error, nothing stored.
    with pytest.raises(InvalidArgument, match="more than the namespace limit of 4000"):
        store.put(ERIN, "big", {"text": "x" * 5000}, index=False)
    deep: dict[str, Any] = {"v": 1}
    for _ in range(8):
        deep = {"d": deep}
    with pytest.raises(InvalidArgument, match="nested deeper than 8"):
        store.put(ERIN, "deep", deep)
    with pytest.raises(ValueError, match="memory_max_chars"):
        store.put(ERIN, "long", {"text": "word " * 300})
    with pytest.raises(InvalidArgument, match="key must not contain control characters"):
        store.put(ERIN, "a\nb", {"v": 1})
    assert [r.key for r in memory.list_memories(NS, "erin") if r.key] == []
    with pytest.raises(ValueError, match="JSON"):
        store.put(ERIN, "k", {"when": object()})
    with pytest.raises(ValueError, match="JSON"):
        store.put(ERIN, "k", {"n": float("inf")})
    with pytest.raises(ValueError, match="index"):
        store.put(ERIN, "k", {"v": 1}, index="v")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 100"):
        store.search(ERIN, query="seats", limit=101)
    with pytest.raises(ValueError, match="at most 1000"):
        store.search(ERIN, query="seats", offset=1001)
    with pytest.raises(ValueError, match="at least 0"):
        store.search(ERIN, offset=-1)
    for namespace in ((NS,), ("a.b", "erin")):
        with pytest.raises(InvalidNamespaceError):
            store.search(namespace)
        with pytest.raises(InvalidNamespaceError):
            store.get(namespace, "k")
        with pytest.raises(InvalidNamespaceError):
            store.put(namespace, "k", {"v": 1})
    # A refused operation of a batch runs none of it.
    with pytest.raises(ValueError, match="operators"):
        store.batch(
            [PutOp(ERIN, "k", {"v": 1}), SearchOp(ERIN, {"v": {"$in": [1]}}), GetOp(ERIN, "k")]
        )
    assert store.get(ERIN, "k") is None


def test_async_with_a_pool(dsn: str) -> None:
    async def main() -> None:
        async with AsyncConnectionPool(dsn, open=False) as pool:
            store = AidbStore(pool=pool)
            listed = await store.asearch(ERIN, limit=2)
            assert [i.value["content"] for i in listed] == [FACTS[3][0], FACTS[2][0]]
            hit = (await store.asearch(ERIN, query="peanuts"))[0]
            assert (await store.aget(ERIN, hit.key)) is not None
            await store.adelete(ERIN, hit.key)
            assert (await store.aget(ERIN, hit.key)) is None
            await store.aput((*ERIN, "notes"), "k", {"text": "Erin moved to Porto."})
            moved = await store.asearch(ERIN, query="Porto")
            assert [(i.namespace, i.key) for i in moved] == [((*ERIN, "notes"), "k")]
            got = await store.aget((*ERIN, "notes"), "k")
            assert got is not None and got.value == {"text": "Erin moved to Porto."}
            assert await store.alist_namespaces(prefix=ERIN) == [ERIN, (*ERIN, "notes")]
            with pytest.raises(ValueError, match="operators"):
                await store.asearch(ERIN, filter={"v": {"$in": [1]}})
            with pytest.raises(TypeError, match="async"):
                store.search(ERIN)

    asyncio.run(main())
    with Memory(dsn) as memory:
        assert len(memory.list_memories(NS, "erin")) == len(FACTS)


def test_a_graph_reads_and_writes_its_store(store: AidbStore) -> None:
    class State(TypedDict):
        actor: str
        question: str
        context: list[str]

    def recall(state: State, runtime: Runtime[None]) -> dict[str, Any]:
        assert runtime.store is not None
        hits = runtime.store.search((NS, state["actor"]), query=state["question"], limit=1)
        runtime.store.put((NS, state["actor"], "asked"), "last", {"q": state["question"]})
        return {"context": [hit.value["content"] for hit in hits]}

    graph = StateGraph(State)
    graph.add_node("recall", recall)
    graph.add_edge(START, "recall")
    graph.add_edge("recall", END)
    app = graph.compile(store=store)
    out = app.invoke({"actor": "erin", "question": "bike", "context": []})
    assert out["context"] == ["Erin travels with a folding bike"]
    asked = store.get((*ERIN, "asked"), "last")
    assert asked is not None and asked.value == {"q": "bike"}
