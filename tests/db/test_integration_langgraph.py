"""LangGraph store (issue 12, item 3): AidbStore against a real server with the real langgraph:
namespaces are (namespace, actor), items are memories (get, search with and without a query,
filters, pagination, delete), put records a fact-bearing turn that the extraction worker turns
into memories (the fake OpenAI server answers), what cannot be honoured is refused, async too,
and a compiled graph uses it as its store.

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
from aidb_memory.integrations.langgraph import AidbStore
from conftest import APP_USER, WORKER_USER, Database
from fake_openai import FakeOpenAI, Reply

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
                                               session_id, content, content_hash, created_at)
               SELECT aidb_memory.actor_key(name, %s), id, %s, %s, %s, %s, md5(%s),
                      now() - make_interval(mins => %s)
               FROM aidb_memory.namespace WHERE name = %s""",
            ("erin", "erin", agent, session, content, content, 10 - i, NS),
        )
    db.sql(
        """INSERT INTO aidb_memory.memory (actor_key, namespace_id, actor_id, content,
                                           content_hash)
           SELECT aidb_memory.actor_key(name, 'fred'), id, 'fred', 'Fred prefers aisle seats',
                  'f' FROM aidb_memory.namespace
           WHERE name = %s""",
        (NS,),
    )
    return db.dsn(APP_USER)


@pytest.fixture
def store(dsn: str) -> Any:
    store = AidbStore(dsn=dsn, agent_id="graph")
    yield store
    store.close()


def work(db: Database) -> None:
    with db.connect(WORKER_USER) as conn:
        conn.execute("CALL aidb_memory.process_events(max_events => 10, backoff_s => 0)")


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


def test_put_records_a_turn_the_worker_extracts(
    store: AidbStore, db: Database, fake: FakeOpenAI
) -> None:
    fake.script.append(
        Reply(
            content=json.dumps(
                {"operations": [{"op": "add", "target": None, "text": "Erin speaks Portuguese"}]}
            )
        )
    )
    store.put(ERIN, "note-1", {"content": "I speak Portuguese fluently."})
    store.put(ERIN, "note-1", {"content": "I speak Portuguese fluently."})  # a retry
    # Not an item under the key: nothing until the worker has run, then a memory of its own.
    assert store.get(ERIN, "note-1") is None
    assert store.search(ERIN, query="Portuguese") == []
    events = db.sql(
        "SELECT actor_id, agent_id, session_id, status FROM aidb_memory.events "
        "WHERE actor_id = 'erin'"
    )
    assert events == [("erin", "graph", None, "accepted")]
    work(db)
    found = store.search(ERIN, query="Portuguese")
    assert [i.value["content"] for i in found] == ["Erin speaks Portuguese"]
    assert found[0].value["agent_id"] == "graph"
    assert store.get(ERIN, found[0].key) == Item(
        value=found[0].value,
        key=found[0].key,
        namespace=ERIN,
        created_at=found[0].created_at,
        updated_at=store.get(ERIN, found[0].key).updated_at,  # type: ignore[union-attr]
    )
    # The model was shown the turn as the user's.
    assert "user: I speak Portuguese fluently." in json.dumps(fake.requests[-1].body)


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
            await store.aput(ERIN, "k", {"content": "I moved to Porto."})
            assert await store.alist_namespaces(prefix=ERIN) == [ERIN]
            with pytest.raises(TypeError, match="async"):
                store.search(ERIN)

    asyncio.run(main())
    with Memory(dsn) as memory:
        assert len(memory.list_memories(NS, "erin")) == 3


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
