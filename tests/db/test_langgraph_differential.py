"""AidbStore against LangGraph's own InMemoryStore (issue 34 item 7): the same generated
sequences of put (and put with index=False), get, delete, search without a query (filters,
offset, limit) and list_namespaces, run on both, must give the same results.

What "the same" means, where the two stores differ by design:

- **Order.** InMemoryStore lists a search's items namespace by namespace (in the order its
  namespaces were first touched), each namespace's in insertion order (a put on a key keeps its
  place). AidbStore lists them newest first across the actor (list_memories; a put in place
  keeps its creation time, so its place). So: the full result (every item, a limit above their
  count) must be the same set of items (namespace, key, value) on both, each namespace's items in
  exactly the reverse order of InMemoryStore's; and every page (offset, limit) must be exactly
  that slice of AidbStore's full result, as many items as InMemoryStore's page: AidbStore's
  pages partition the set both stores hold, in its order.
- **Empty namespaces.** InMemoryStore keeps a namespace that a get or a delete touched (its
  dict entry), items or not, and lists it; AidbStore lists the namespaces that hold items. The
  test drops InMemoryStore's empty entries before it lists.
- **Values** are generated where both stores compare alike: ``n`` is always a number (order
  operators: InMemoryStore raises on an absent field), booleans are compared only with booleans
  (Python's ``True == 1``; JSON's true is no number), a nested ``o`` always has ``m``, and no
  filter is one AidbStore refuses (those have their tests in test_integration_langgraph.py).
  Values are compared by Python's ``==``, where 1 equals 1.0 (the server compares JSON numbers by
  value, so a put of ``{"n": 1.0}`` over ``{"n": 1}`` changes nothing and ``get`` returns 1).
- Times (``created_at``, ``updated_at``) are each store's own and not compared.

Each example uses fresh actors in one database, and one of three layouts of the namespace
tuple: ``(namespace, actor, *sub)`` (the default), ``(actor, *sub)`` (``namespace=``) and
``(label, actor, *sub)`` (``namespace=``, ``actor_position=1``; an operation on the root, which
has no place in it, names the sub-namespace ``("a",)`` instead).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import Item
from langgraph.store.memory import InMemoryStore

from aidb_memory.integrations.langgraph import AidbStore
from conftest import APP_USER, Database

NS = "lgdiff"
LABELS = ["a", "b", "ab"]  # "a" is a prefix of "ab": the key ranges must keep them apart
KEYS = ["k", "j", "a", "a.b", "", " ", "x..y", ".k", "0c3f6b1e-9d2a-4c1e-8f7a-2b5d9e4c6a10"]
KINDS = ["put"] * 4 + ["get", "delete", "search", "search", "list", "list"]
ALL = 10_000  # a limit above any example's item count
_actors = itertools.count()


@dataclass(frozen=True)
class Layout:
    """How a store namespace tuple is made of the actor and a sub-namespace."""

    name: str
    store: Callable[[str], AidbStore]
    make: Callable[[str, tuple[str, ...]], tuple[str, ...]]
    min_sub: int  # labels the tuple needs besides the actor's


LAYOUTS = [
    Layout("default", lambda dsn: AidbStore(dsn=dsn), lambda a, s: (NS, a, *s), 0),
    Layout("namespace", lambda dsn: AidbStore(dsn=dsn, namespace=NS), lambda a, s: (a, *s), 0),
    Layout(
        "label-first",
        lambda dsn: AidbStore(dsn=dsn, namespace=NS, actor_position=1),
        lambda a, s: (s[0], a, *s[1:]),
        1,
    ),
]

# --- generated operations -------------------------------------------------------------------

_subs = st.lists(st.sampled_from(LABELS), max_size=3).map(tuple)
_numbers = st.sampled_from([0, 1, 1.0, 1.5, 3])
_texts = st.sampled_from(["x", "y", "xy", ""])
_values = st.fixed_dictionaries(
    {"n": _numbers, "s": _texts},
    optional={
        "t": st.sampled_from(["p", "q", None]),
        "o": st.fixed_dictionaries(
            {"m": st.sampled_from([0, 1, 2])}, optional={"z": st.sampled_from(["p", "q"])}
        ),
        "l": st.lists(st.sampled_from([0, 1]), max_size=2),
        "b": st.booleans(),
    },
)
_order = st.sampled_from(["$gt", "$gte", "$lt", "$lte"])
_conditions: dict[str, st.SearchStrategy[Any]] = {
    "n": st.one_of(
        _numbers,
        st.builds(lambda v: {"$eq": v}, _numbers),
        st.builds(lambda v: {"$ne": v}, _numbers),
        st.builds(lambda op, v: {op: v}, _order, _numbers),
        st.builds(lambda a, b, x, y: {a: x, b: y}, _order, _order, _numbers, _numbers),
    ),
    "s": st.one_of(_texts, st.builds(lambda v: {"$ne": v}, _texts)),
    "t": st.one_of(
        st.sampled_from(["p", None]),
        st.sampled_from([{"$eq": None}, {"$ne": None}, {"$ne": "p"}]),
    ),
    "o": st.one_of(
        st.builds(lambda m: {"m": m}, st.sampled_from([0, 1])),
        st.builds(lambda op, m: {"m": {op: m}}, _order, st.sampled_from([0, 1, 2])),
        st.builds(lambda m, z: {"m": m, "z": z}, st.sampled_from([0, 1]), st.just("p")),
        st.builds(lambda m: {"$eq": {"m": m}}, st.sampled_from([0, 1])),
    ),
    "l": st.lists(st.sampled_from([0, 1]), max_size=2),
    "b": st.booleans(),
    "absent": st.none(),
}
_filters = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(sorted(_conditions)), st.none(), min_size=1, max_size=2
    ).flatmap(lambda fields: st.fixed_dictionaries({f: _conditions[f] for f in fields})),
)


@st.composite
def _operations(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """A sequence of operations, each naming one of two actors, and one of a few sub-namespaces
    and keys drawn for the example (so that operations meet the same items)."""
    subs = draw(st.lists(_subs, min_size=2, max_size=3, unique=True))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=2, max_size=3, unique=True))
    ops: list[tuple[Any, ...]] = []
    first_puts = draw(st.integers(2, 5))
    for i in range(first_puts + draw(st.integers(2, 12))):
        actor = draw(st.sampled_from([0, 0, 0, 1]))
        sub = draw(st.sampled_from(subs))
        kind = "put" if i < first_puts else draw(st.sampled_from(KINDS))
        if kind == "put":
            unindexed = draw(st.booleans()) and draw(st.booleans())
            ops.append(("put", actor, sub, draw(st.sampled_from(keys)), draw(_values), unindexed))
        elif kind in ("get", "delete"):
            ops.append((kind, actor, sub, draw(st.sampled_from(keys))))
        elif kind == "search":
            prefix = sub[: draw(st.integers(0, len(sub)))]
            offset = draw(st.sampled_from([0, 0, 1, 2, 5]))
            limit = draw(st.sampled_from([1, 2, 3, 10]))
            ops.append(("search", actor, prefix, draw(_filters), offset, limit))
        else:
            # A prefix of a sub-namespace's labels, some of them wildcards; a suffix of labels
            # and wildcards; a depth; a page.
            labels = tuple(
                draw(st.sampled_from([label, "*"]))
                for label in sub[: draw(st.integers(0, len(sub)))]
            )
            suffix = draw(st.sampled_from([(), (), (), ("*",), *((label,) for label in LABELS)]))
            depth = draw(st.sampled_from([None, None, None, 1, 2, 3, 4]))
            offset = draw(st.sampled_from([0, 0, 0, 1]))
            limit = draw(st.sampled_from([2, 100, 100]))
            ops.append(("list", actor, labels, suffix or None, depth, offset, limit))
    return ops


# --- running them on both -------------------------------------------------------------------


@pytest.fixture
def stores(db: Database) -> Iterator[list[AidbStore]]:
    db.sql("SELECT aidb_memory.init(%s)", (NS,))
    made = [layout.store(db.dsn(APP_USER)) for layout in LAYOUTS]
    yield made
    for store in made:
        store.close()


def _seen(item: Item | None) -> tuple[Any, ...] | None:
    return None if item is None else (item.namespace, item.key, item.value)


def _same_items(ours: list[Any], theirs: list[Any]) -> bool:
    """Whether two lists hold the same items in any order, values compared by Python's ``==``
    (1 == 1.0: a put of {"n": 1.0} over {"n": 1} changes nothing on the server, which compares
    JSON numbers by value, so AidbStore returns the 1 InMemoryStore replaced)."""
    left = list(ours)
    for item in theirs:
        if item not in left:
            return False
        left.remove(item)
    return not left


def _drop_empty_namespaces(reference: InMemoryStore) -> None:
    for namespace in [ns for ns, items in reference._data.items() if not items]:
        del reference._data[namespace]


def _check_search(
    ours: AidbStore, reference: InMemoryStore, prefix: tuple[str, ...], op: tuple[Any, ...]
) -> None:
    _, _, _, filter, offset, limit = op
    full = [_seen(i) for i in ours.search(prefix, filter=filter, limit=ALL)]
    expected = [_seen(i) for i in reference.search(prefix, filter=filter, limit=ALL)]
    assert _same_items(full, expected), op
    for namespace in {item[0] for item in full if item is not None}:
        keys = [item[1] for item in full if item is not None and item[0] == namespace]
        want = [item[1] for item in expected if item is not None and item[0] == namespace]
        assert keys == want[::-1], (op, namespace)
    page = [_seen(i) for i in ours.search(prefix, filter=filter, offset=offset, limit=limit)]
    reference_page = reference.search(prefix, filter=filter, offset=offset, limit=limit)
    assert page == full[offset : offset + limit], op
    assert len(page) == len(reference_page), op


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(layout_index=st.integers(0, len(LAYOUTS) - 1), ops=_operations())
def test_aidb_store_does_what_in_memory_store_does(
    stores: list[AidbStore], layout_index: int, ops: list[tuple[Any, ...]]
) -> None:
    layout, ours = LAYOUTS[layout_index], stores[layout_index]
    reference = InMemoryStore()
    actors = [f"actor{next(_actors)}" for _ in range(2)]

    def place(actor: int, sub: tuple[str, ...]) -> tuple[str, ...]:
        # The layout with a label before the actor needs one: the root has no place in it.
        if len(sub) < layout.min_sub:
            sub = (*sub, LABELS[0])
        return layout.make(actors[actor], sub)

    for op in ops:
        kind, actor = op[0], op[1]
        if kind == "put":
            _, _, sub, key, value, unindexed = op
            index = False if unindexed else None
            ours.put(place(actor, sub), key, value, index=index)
            reference.put(place(actor, sub), key, value, index=index)
        elif kind == "get":
            _, _, sub, key = op
            got = ours.get(place(actor, sub), key)
            assert _seen(got) == _seen(reference.get(place(actor, sub), key)), op
        elif kind == "delete":
            _, _, sub, key = op
            ours.delete(place(actor, sub), key)
            reference.delete(place(actor, sub), key)
        elif kind == "search":
            _check_search(ours, reference, place(actor, op[2]), op)
        else:
            _, _, labels, suffix, depth, offset, limit = op
            # The prefix names the actor (and the namespace): labels follow, or come first.
            if layout.min_sub and labels:
                prefix = (labels[0], actors[actor], *labels[1:])
            elif layout.min_sub:
                prefix = ("*", actors[actor])
            else:
                prefix = layout.make(actors[actor], labels)
            _drop_empty_namespaces(reference)
            kwargs = {"prefix": prefix, "suffix": suffix, "max_depth": depth}
            listed = ours.list_namespaces(**kwargs, offset=offset, limit=limit)
            expected = reference.list_namespaces(**kwargs, offset=offset, limit=limit)
            assert listed == expected, op
