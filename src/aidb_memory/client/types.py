"""The results of the client's calls: frozen dataclasses, one per shape the SQL API returns.

Items and messages stay plain JSON (``dict``): they are provider-native (chat messages,
Responses items) and go to a model as they are.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EventStatus",
    "Handoff",
    "Item",
    "MemoryRecord",
    "MemoryVersion",
    "ReadResult",
    "SearchHit",
    "Session",
    "SessionRow",
]

Item = dict[str, Any]
"""One entry of a read: a turn ``{"seq", "role", "content", "kind", "meta", "created_at", ...}``
or a summary (``kind`` ``summary``, ``seq`` None)."""


def _time(value: Any) -> datetime.datetime | None:
    if value is None or isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromisoformat(str(value))


@dataclass(frozen=True)
class ReadResult:
    """What ``session_get`` returns: ``items`` oldest first (summaries, then turns),
    ``overflow_chars`` of history left out, ``compacted_entries`` that the summaries stand in
    for, and the read's ``warnings`` (codes such as ``compaction_busy``; empty when none)."""

    items: list[Item]
    overflow_chars: int
    compacted_entries: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Handoff:
    """What ``session_end`` stores when it closes a session (and the next session of the same
    actor and agent gets as ``prev_handoff``). ``summary`` is the newest summary as
    ``{"content", "from_seq", "to_seq", "model"}`` or None; ``raw`` the stored JSON as it is."""

    session_id: str
    agent_id: str | None
    notes: str | None
    started_at: datetime.datetime | None
    closed_at: datetime.datetime | None
    turn_count: int
    last_user_prompt: str | None
    summary: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Handoff:
        return cls(
            session_id=data.get("session_id", ""),
            agent_id=data.get("agent_id"),
            notes=data.get("notes"),
            started_at=_time(data.get("started_at")),
            closed_at=_time(data.get("closed_at")),
            turn_count=int(data.get("turn_count") or 0),
            last_user_prompt=data.get("last_user_prompt"),
            summary=data.get("summary"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Session:
    """What ``session_start`` returns: the session's stored row (``closed_at`` set for a
    closed one) and the handoff of the actor's previous session with the same agent."""

    session_id: str
    started_at: datetime.datetime
    closed_at: datetime.datetime | None
    prev_handoff: Handoff | None

    @property
    def closed(self) -> bool:
        return self.closed_at is not None


@dataclass(frozen=True)
class SessionRow:
    """One row of ``session_list``: an index row, never a transcript."""

    session_id: str
    agent_id: str | None
    started_at: datetime.datetime
    closed_at: datetime.datetime | None
    turn_count: int
    total_chars: int
    updated_at: datetime.datetime

    @property
    def closed(self) -> bool:
        return self.closed_at is not None


@dataclass(frozen=True)
class SearchHit:
    """One memory ``search`` found; ``score`` in [0, 1], best first."""

    id: uuid.UUID
    content: str
    score: float
    agent_id: str | None
    session_id: str | None
    created_at: datetime.datetime
    metadata: dict[str, Any]  # what remember tagged it with ({} when nothing)
    key: str | None = None  # the application's name for it (remember's key)
    expires_at: datetime.datetime | None = None  # when it expires (None: never)


@dataclass(frozen=True)
class MemoryRecord:
    """One long-term memory of ``list_memories``; ``valid_to`` and ``superseded_by`` are set
    for a fact a later one replaced."""

    id: uuid.UUID
    content: str
    agent_id: str | None
    session_id: str | None
    valid_from: datetime.datetime | None
    valid_to: datetime.datetime | None
    superseded_by: uuid.UUID | None
    created_at: datetime.datetime
    updated_at: datetime.datetime | None
    metadata: dict[str, Any]  # what remember tagged it with ({} when nothing)
    key: str | None = None  # the application's name for it (remember's key)
    expires_at: datetime.datetime | None = None  # when it expires (None: never)

    @property
    def current(self) -> bool:
        return self.superseded_by is None and self.valid_to is None


@dataclass(frozen=True)
class MemoryVersion:
    """One version of a memory (``memory_history``), oldest first: what ``operation`` made it say
    (``content``; ``previous_content`` before), who (the login role), why, when."""

    version: int
    operation: str  # add, update, supersede, invalidate
    content: str | None
    previous_content: str | None
    metadata: dict[str, Any] | None
    at: datetime.datetime
    by_role: str | None
    reason: str | None
    event_id: uuid.UUID | None


@dataclass(frozen=True)
class EventStatus:
    """What ``status`` returns for an event that ``add`` recorded: ``status`` is one of
    ``accepted``, ``processing``, ``processed``, ``failed``, ``skipped``; ``result`` what
    extraction produced (counts and the ids of new memories) once processed."""

    event_id: uuid.UUID
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime.datetime | None
    processed_at: datetime.datetime | None
    next_attempt_at: datetime.datetime | None
    result: dict[str, Any] | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EventStatus:
        return cls(
            event_id=uuid.UUID(str(data["event_id"])),
            status=str(data["status"]),
            attempts=int(data.get("attempts") or 0),
            last_error=data.get("last_error"),
            created_at=_time(data.get("created_at")),
            processed_at=_time(data.get("processed_at")),
            next_attempt_at=_time(data.get("next_attempt_at")),
            result=data.get("result"),
        )
