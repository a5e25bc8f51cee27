"""The SQL of each call, shared by :class:`Memory` and :class:`AsyncMemory`.

Every function is called with named arguments (``name => %s::type``), and only with the
arguments the caller gave: an optional one left at None is not sent, so the server's default
applies and a server that does not know a newer optional parameter still answers calls that
do not use it. The casts fix the parameter types, so that each query text is one prepared
statement and a Python int never picks another overload.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from psycopg import sql
from psycopg.types.json import Jsonb

from aidb_memory.client.types import (
    EventStatus,
    Handoff,
    Item,
    MemoryRecord,
    MemoryVersion,
    ReadResult,
    SearchHit,
    Session,
    SessionRow,
)

T = TypeVar("T")
Rows = list[tuple[Any, ...]]

# (SQL name, SQL type, value, always sent)
Arg = tuple[str, str, Any, bool]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One statement: the function it calls, its query and parameters, and how its rows become
    the method's result."""

    function: str
    query: sql.Composed
    params: tuple[Any, ...]
    decode: Callable[[Rows], T]


def _jsonb(value: Any) -> Any:
    return None if value is None else (value if isinstance(value, Jsonb) else Jsonb(value))


def _build(
    function: str, columns: Sequence[str] | None, args: Sequence[Arg]
) -> tuple[sql.Composed, tuple[Any, ...]]:
    named: list[sql.Composable] = []
    params: list[Any] = []
    for name, pgtype, value, always in args:
        if value is None and not always:
            continue
        named.append(
            sql.SQL("{} => {}::{}").format(sql.Identifier(name), sql.Placeholder(), sql.SQL(pgtype))
        )
        params.append(_jsonb(value) if pgtype == "jsonb" else value)
    call = sql.SQL("aidb_memory.{}({})").format(sql.SQL(function), sql.SQL(", ").join(named))
    if columns is None:
        query = sql.SQL("SELECT {}").format(call)
    else:
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns), call
        )
    return query, tuple(params)


def _call(
    function: str, columns: Sequence[str] | None, args: Sequence[Arg], decode: Callable[[Rows], T]
) -> Call[T]:
    query, params = _build(function, columns, args)
    return Call(function, query, params, decode)


def _scalar(rows: Rows) -> Any:
    return rows[0][0] if rows else None


# --- sessions -----------------------------------------------------------------------------


def _session(rows: Rows) -> Session:
    session_id, started_at, closed_at, prev = rows[0]
    return Session(session_id, started_at, closed_at, Handoff.from_json(prev) if prev else None)


def session_start(
    namespace: str, actor_id: str, agent_id: str | None, session_id: str | None
) -> Call[Session]:
    return _call(
        "session_start",
        ("session_id", "started_at", "closed_at", "prev_handoff"),
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("agent_id", "text", agent_id, True),
            ("session_id", "text", session_id, False),
        ],
        _session,
    )


def add(
    namespace: str,
    actor_id: str,
    turns: Sequence[Mapping[str, Any]] | Jsonb,
    session_id: str | None,
    agent_id: str | None,
    idempotency_key: str | None,
    memory_metadata: Mapping[str, Any] | Jsonb | None = None,
) -> Call[uuid.UUID]:
    return _call(
        "add",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("turns", "jsonb", turns, True),
            ("session_id", "text", session_id, False),
            ("agent_id", "text", agent_id, False),
            ("idempotency_key", "text", idempotency_key, False),
            ("memory_metadata", "jsonb", memory_metadata, False),
        ],
        _scalar,
    )


def _read_args(
    namespace: str,
    actor_id: str,
    session_id: str,
    limit_chars: int | None,
    fallback_model: str | None,
    limit_turns: int | None,
    limit_items: int | None,
) -> list[Arg]:
    return [
        ("namespace", "text", namespace, True),
        ("actor_id", "text", actor_id, True),
        ("session_id", "text", session_id, True),
        ("limit_chars", "integer", limit_chars, False),
        ("fallback_model", "text", fallback_model, False),
        ("limit_turns", "integer", limit_turns, False),
        ("limit_items", "integer", limit_items, False),
    ]


def _read_result(rows: Rows) -> ReadResult:
    items, overflow_chars, compacted_entries, warnings = rows[0]
    return ReadResult(
        list(items or []), int(overflow_chars), int(compacted_entries), tuple(warnings or ())
    )


def session_get(
    namespace: str,
    actor_id: str,
    session_id: str,
    limit_chars: int | None,
    fallback_model: str | None,
    limit_turns: int | None,
    limit_items: int | None,
) -> Call[ReadResult]:
    return _call(
        "session_get",
        ("items", "overflow_chars", "compacted_entries", "warnings"),
        _read_args(
            namespace, actor_id, session_id, limit_chars, fallback_model, limit_turns, limit_items
        ),
        _read_result,
    )


def _messages(rows: Rows) -> list[dict[str, Any]]:
    return list(_scalar(rows) or [])


def session_messages(
    namespace: str,
    actor_id: str,
    session_id: str,
    limit_chars: int | None,
    fallback_model: str | None,
    limit_turns: int | None,
    limit_items: int | None,
    format: str,
) -> Call[list[dict[str, Any]]]:
    args = _read_args(
        namespace, actor_id, session_id, limit_chars, fallback_model, limit_turns, limit_items
    )
    # The server's default is chat: sent only when it is another one.
    args.append(("format", "text", None if format == "chat" else format, False))
    return _call("session_messages", None, args, _messages)


def _handoff(rows: Rows) -> Handoff | None:
    if not rows:
        return None
    handoff, closed_at = rows[0]
    result = Handoff.from_json(handoff or {})
    if result.closed_at is None and closed_at is not None:
        result = Handoff.from_json({**(handoff or {}), "closed_at": closed_at})
    return result


def session_end(
    namespace: str, actor_id: str, session_id: str, notes: str | None
) -> Call[Handoff | None]:
    return _call(
        "session_end",
        ("handoff", "closed_at"),
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("session_id", "text", session_id, True),
            ("notes", "text", notes, False),
        ],
        _handoff,
    )


def _item(rows: Rows) -> Item | None:
    value = _scalar(rows)
    return dict(value) if value is not None else None


def session_pop(namespace: str, actor_id: str, session_id: str) -> Call[Item | None]:
    return _call(
        "session_pop",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("session_id", "text", session_id, True),
        ],
        _item,
    )


def _session_rows(rows: Rows) -> list[SessionRow]:
    return [SessionRow(*row) for row in rows]


def session_list(
    namespace: str,
    actor_id: str,
    agent_id: str | None,
    include_closed: bool | None,
    limit: int | None,
) -> Call[list[SessionRow]]:
    return _call(
        "session_list",
        (
            "session_id",
            "agent_id",
            "started_at",
            "closed_at",
            "turn_count",
            "total_chars",
            "updated_at",
        ),
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("agent_id", "text", agent_id, False),
            ("include_closed", "boolean", include_closed, False),
            ("limit", "integer", limit, False),
        ],
        _session_rows,
    )


def _int(rows: Rows) -> int:
    return int(_scalar(rows) or 0)


def session_delete(namespace: str, actor_id: str, session_id: str, reason: str) -> Call[int]:
    return _call(
        "session_delete",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("session_id", "text", session_id, True),
            ("reason", "text", reason, True),
        ],
        _int,
    )


# --- long-term memory ---------------------------------------------------------------------


def _hits(rows: Rows) -> list[SearchHit]:
    return [SearchHit(i, c, float(s), a, sid, t, m, k, e) for i, c, s, a, sid, t, m, k, e in rows]


def search(
    namespace: str,
    actor_id: str,
    query: str,
    limit: int | None,
    session_id: str | None,
    agent_id: str | None,
    query_embedding: Sequence[float] | None = None,
    filter: Mapping[str, Any] | Jsonb | None = None,
    offset: int | None = None,
) -> Call[list[SearchHit]]:
    vector = None if query_embedding is None else [float(x) for x in query_embedding]
    return _call(
        "search",
        (
            *("id", "content", "score", "agent_id", "session_id", "created_at", "metadata"),
            *("key", "expires_at"),
        ),
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("query", "text", query, True),
            ("limit", "integer", limit, False),
            ("session_id", "text", session_id, False),
            ("agent_id", "text", agent_id, False),
            ("query_embedding", "double precision[]", vector, False),
            ("filter", "jsonb", filter, False),
            ("offset", "integer", offset, False),
        ],
        _hits,
    )


def remember(
    namespace: str,
    actor_id: str,
    content: str,
    session_id: str | None,
    agent_id: str | None,
    metadata: Mapping[str, Any] | Jsonb | None = None,
    key: str | None = None,
    expires_at: datetime.datetime | None = None,
    ttl_s: int | None = None,
) -> Call[uuid.UUID]:
    return _call(
        "remember",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("content", "text", content, True),
            ("session_id", "text", session_id, False),
            ("agent_id", "text", agent_id, False),
            ("metadata", "jsonb", metadata, False),
            ("key", "text", key, False),
            ("expires_at", "timestamptz", expires_at, False),
            ("ttl_s", "integer", ttl_s, False),
        ],
        _scalar,
    )


# The columns of list_memories_result, which get_memory and update_memory return too.
_RECORD_COLUMNS = (
    "id",
    "content",
    "agent_id",
    "session_id",
    "valid_from",
    "valid_to",
    "superseded_by",
    "created_at",
    "updated_at",
    "metadata",
    "key",
    "expires_at",
)


def _records(rows: Rows) -> list[MemoryRecord]:
    return [MemoryRecord(*row) for row in rows]


def list_memories(
    namespace: str,
    actor_id: str,
    session_id: str | None,
    agent_id: str | None,
    limit: int | None,
    include_superseded: bool | None,
    filter: Mapping[str, Any] | Jsonb | None = None,
    after: uuid.UUID | str | None = None,
) -> Call[list[MemoryRecord]]:
    return _call(
        "list_memories",
        _RECORD_COLUMNS,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("session_id", "text", session_id, False),
            ("agent_id", "text", agent_id, False),
            ("limit", "integer", limit, False),
            ("include_superseded", "boolean", include_superseded, False),
            ("filter", "jsonb", filter, False),
            ("after", "uuid", None if after is None else str(after), False),
        ],
        _records,
    )


def _actors(rows: Rows) -> list[str]:
    return [row[0] for row in rows]


def list_actors(
    namespace: str, prefix: str | None, limit: int | None, after: str | None
) -> Call[list[str]]:
    return _call(
        "list_actors",
        ("actor_id",),
        [
            ("namespace", "text", namespace, True),
            ("prefix", "text", prefix, False),
            ("limit", "integer", limit, False),
            ("after", "text", after, False),
        ],
        _actors,
    )


def _record(rows: Rows) -> MemoryRecord | None:
    records = _records(rows)
    return records[0] if records else None


def get_memory(
    namespace: str,
    actor_id: str,
    memory_id: uuid.UUID | str | None,
    key: str | None,
    refresh_ttl: bool | None = None,
) -> Call[MemoryRecord | None]:
    return _call(
        "get_memory",
        _RECORD_COLUMNS,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("id", "uuid", None if memory_id is None else str(memory_id), False),
            ("key", "text", key, False),
            ("refresh_ttl", "boolean", refresh_ttl, False),
        ],
        _record,
    )


def _updated(rows: Rows) -> MemoryRecord:
    (record,) = _records(rows)
    return record


def update_memory(
    namespace: str,
    actor_id: str,
    memory_id: uuid.UUID | str,
    content: str | None,
    metadata: Mapping[str, Any] | Jsonb | None,
    reason: str | None,
) -> Call[MemoryRecord]:
    return _call(
        "update_memory",
        _RECORD_COLUMNS,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("id", "uuid", str(memory_id), True),
            ("content", "text", content, False),
            ("metadata", "jsonb", metadata, False),
            ("reason", "text", reason, False),
        ],
        _updated,
    )


def memory_history(
    namespace: str, actor_id: str, memory_id: uuid.UUID | str
) -> Call[list[MemoryVersion]]:
    return _call(
        "memory_history",
        (
            "version",
            "operation",
            "content",
            "previous_content",
            "metadata",
            "at",
            "by_role",
            "reason",
            "event_id",
        ),
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("id", "uuid", str(memory_id), True),
        ],
        lambda rows: [MemoryVersion(*row) for row in rows],
    )


def delete(
    namespace: str,
    actor_id: str,
    selector: Mapping[str, Any] | Jsonb,
    reason: str,
    session_id: str | None,
    agent_id: str | None,
) -> Call[int]:
    if isinstance(selector, Mapping) and isinstance(selector.get("ids"), Sequence):
        ids = selector["ids"]
        if not isinstance(ids, str):
            selector = {**selector, "ids": [str(i) for i in ids]}
    return _call(
        "delete",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("selector", "jsonb", selector, True),
            ("reason", "text", reason, True),
            ("session_id", "text", session_id, False),
            ("agent_id", "text", agent_id, False),
        ],
        _int,
    )


def _counts(rows: Rows) -> dict[str, int]:
    return dict(_scalar(rows) or {})


def forget(namespace: str, actor_id: str, reason: str) -> Call[dict[str, int]]:
    return _call(
        "forget",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("reason", "text", reason, True),
        ],
        _counts,
    )


def _status(rows: Rows) -> EventStatus | None:
    value = _scalar(rows)
    return EventStatus.from_json(value) if value is not None else None


def status(namespace: str, actor_id: str, event_id: uuid.UUID | str) -> Call[EventStatus | None]:
    return _call(
        "status",
        None,
        [
            ("namespace", "text", namespace, True),
            ("actor_id", "text", actor_id, True),
            ("event_id", "uuid", event_id, True),
        ],
        _status,
    )
