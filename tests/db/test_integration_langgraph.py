"""LangGraph store (issue 12, item 3): AidbStore against a real server with the real langgraph:
namespaces are (namespace, actor), items are memories (get, search with and without a query,
filters, pagination, delete), put stores a memory directly through ``remember`` (found at once,
no model: the namespace's model, the fake OpenAI server, sees no request) and replaces the memory
its key names, what cannot be honoured is refused, async too, and a compiled graph uses it as its
store.

The installed langgraph (1.2) and langgraph-checkpoint (4.3) ship no store conformance tests
(their wheels hold no tests; langgraph-checkpoint-conformance covers checkpointers, and is not
installed): this file is the store's test."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, InvalidNamespaceError, Item, SearchItem
from psycopg_pool import AsyncConnectionPool

from aidb_memory.client import Memory
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


def test_is_a_base_store(store: AidbStore) -> None:
    assert isinstance(store, BaseStore)


def test_search_without_a_query_lists_newest_first(store: AidbStore) -> None:
    found = store.search(ERIN)
    assert [i.value["content"] for i in found] == [f[0] for f in reversed(FACTS)]
    assert all(isinstance(i, SearchItem) and i.score is None for i in found)
    assert all(i.namespace == ERIN for i in found)
    assert found[0].value == {
        "content": "Erin travels with a folding bike",
        "agent_id": "bikes",
        "session_id": "trip-2",
    }
    # Pagination and the server-side filters.
    assert [i.value["content"] for i in store.search(ERIN, limit=2, offset=1)] == [
        FACTS[2][0],
        FACTS[1][0],
    ]
    assert [i.value["content"] for i in store.search(ERIN, filter={"session_id": "trip-1"})] == [
        FACTS[1][0],
        FACTS[0][0],
    ]
    assert [
        i.value["content"] for i in store.search(ERIN, filter={"agent_id": {"$eq": "bikes"}})
    ] == [FACTS[3][0]]
    assert [i.value["content"] for i in store.search((NS, "fred"))] == ["Fred prefers aisle seats"]
    assert store.search((NS, "nobody")) == []


def test_search_with_a_query_ranks(store: AidbStore) -> None:
    found = store.search(ERIN, query="allergic to peanuts", limit=2)
    assert found[0].value["content"] == "Erin is allergic to peanuts"
    assert found[0].score == 1.0
    assert len(found) <= 2
    window = store.search(ERIN, query="window seat")
    assert window[0].value["content"] == "Erin prefers window seats"
    assert "Fred prefers aisle seats" not in [i.value["content"] for i in window]
    assert store.search(ERIN, query="window seat", offset=1) == window[1:]


def test_get_and_delete_by_memory_id(store: AidbStore, dsn: str) -> None:
    first = store.search(ERIN, query="Lisbon")[0]
    got = store.get(ERIN, first.key)
    assert isinstance(got, Item)
    assert (got.key, got.value, got.namespace) == (first.key, first.value, ERIN)
    # Another actor's namespace does not see it; a key that is no memory id is no item.
    assert store.get((NS, "fred"), first.key) is None
    assert store.get(ERIN, "not-a-uuid") is None
    store.delete((NS, "fred"), first.key)  # not fred's: nothing happens
    assert store.get(ERIN, first.key) is not None
    store.delete(ERIN, first.key)
    assert store.get(ERIN, first.key) is None
    assert len(store.search(ERIN)) == 3
    store.delete(ERIN, "not-a-uuid")  # deletes nothing, fails nothing
    with Memory(dsn) as memory:
        assert len(memory.list_memories(NS, "erin")) == 3


def test_put_stores_a_memory_that_search_finds_at_once(
    store: AidbStore, db: Database, fake: FakeOpenAI
) -> None:
    store.put(ERIN, "note-1", {"content": "Erin speaks Portuguese fluently."})
    store.put(ERIN, "note-1", {"content": "Erin speaks Portuguese fluently."})  # a retry
    found = store.search(ERIN, query="Portuguese")
    assert [i.value for i in found] == [
        {"content": "Erin speaks Portuguese fluently.", "agent_id": "graph", "session_id": None}
    ]
    # The memory has an id of its own, its key; the key put under is no item.
    assert store.get(ERIN, "note-1") is None
    got = store.get(ERIN, found[0].key)
    assert got is not None and got.value == found[0].value
    # Stored directly: no event for the worker, no model call.
    assert db.value("SELECT count(*) FROM aidb_memory.event") == 0
    assert fake.requests == []
    # A value may name its agent and session: an item's value can be put back as it is.
    store.put(
        ERIN,
        "note-2",
        {"content": "Erin rents a car in Porto.", "session_id": "trip-3", "agent_id": "cars"},
    )
    (car,) = store.search(ERIN, filter={"session_id": "trip-3"})
    assert car.value == {
        "content": "Erin rents a car in Porto.",
        "agent_id": "cars",
        "session_id": "trip-3",
    }
    assert len(store.search(ERIN)) == len(FACTS) + 2


def test_put_under_a_memorys_key_replaces_it(store: AidbStore, db: Database) -> None:
    (old,) = store.search(ERIN, query="Lisbon", limit=1)
    store.put(ERIN, old.key, {**old.value, "content": "Erin lives in Porto"})
    assert store.get(ERIN, old.key) is None
    (new,) = store.search(ERIN, filter={"session_id": "trip-2", "agent_id": "travel"})
    assert new.key != old.key
    assert new.value == {
        "content": "Erin lives in Porto",
        "agent_id": "travel",
        "session_id": "trip-2",
    }
    assert len(store.search(ERIN)) == len(FACTS)
    # The replaced memory's delete is audited with the store's reason.
    assert db.sql("SELECT action, reason FROM aidb_memory.audit_log") == [
        ("delete", DEFAULT_DELETE_REASON)
    ]
    # Put again (a retry): the same memory, nothing else deleted.
    store.put(ERIN, old.key, {**old.value, "content": "Erin lives in Porto"})
    assert [i.key for i in store.search(ERIN, query="Porto")] == [new.key]
    assert len(store.search(ERIN)) == len(FACTS)
    # Fred's memory is not Erin's to replace.
    (fred,) = store.search((NS, "fred"))
    store.put(ERIN, fred.key, {"content": "Erin likes trains"})
    assert store.get((NS, "fred"), fred.key) is not None


def test_what_cannot_be_honoured_is_refused(store: AidbStore) -> None:
    for value in ({"text": "x"}, {"content": "x", "tags": ["a"]}, {"content": 3}, {"content": " "}):
        with pytest.raises(ValueError, match="content"):
            store.put(ERIN, "k", value)
    with pytest.raises(ValueError, match="index"):
        store.put(ERIN, "k", {"content": "x"}, index=["content"])
    with pytest.raises(NotImplementedError):
        store.put(ERIN, "k", {"content": "x"}, ttl=5)
    with pytest.raises(ValueError, match="filter"):
        store.search(ERIN, filter={"content": "x"})
    with pytest.raises(ValueError, match="at most 100"):
        store.search(ERIN, query="seats", limit=100, offset=1)
    for namespace in ((NS,), (NS, "erin", "extra"), ("a.b", "erin")):
        with pytest.raises(InvalidNamespaceError):
            store.search(namespace)
        with pytest.raises(InvalidNamespaceError):
            store.get(namespace, "k")
    with pytest.raises(NotImplementedError, match="lists no actors"):
        store.list_namespaces()
    with pytest.raises(NotImplementedError, match="lists no actors"):
        store.list_namespaces(prefix=(NS,))


def test_list_namespaces_for_one_actor(store: AidbStore) -> None:
    assert store.list_namespaces(prefix=ERIN) == [ERIN]
    assert store.list_namespaces(prefix=ERIN, max_depth=1) == [(NS,)]
    assert store.list_namespaces(prefix=(NS, "nobody")) == []


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
            await store.aput(ERIN, "k", {"content": "Erin moved to Porto."})
            moved = await store.asearch(ERIN, query="Porto")
            assert [i.value["content"] for i in moved] == ["Erin moved to Porto."]
            assert await store.alist_namespaces(prefix=ERIN) == [ERIN]
            with pytest.raises(TypeError, match="async"):
                store.search(ERIN)

    asyncio.run(main())
    with Memory(dsn) as memory:
        assert len(memory.list_memories(NS, "erin")) == len(FACTS)


def test_a_graph_reads_its_store(store: AidbStore) -> None:
    class State(TypedDict):
        actor: str
        question: str
        context: list[str]

    def recall(state: State, runtime: Runtime[None]) -> dict[str, Any]:
        assert runtime.store is not None
        hits = runtime.store.search((NS, state["actor"]), query=state["question"], limit=1)
        return {"context": [hit.value["content"] for hit in hits]}

    graph = StateGraph(State)
    graph.add_node("recall", recall)
    graph.add_edge(START, "recall")
    graph.add_edge("recall", END)
    app = graph.compile(store=store)
    out = app.invoke({"actor": "erin", "question": "bike", "context": []})
    assert out["context"] == ["Erin travels with a folding bike"]
