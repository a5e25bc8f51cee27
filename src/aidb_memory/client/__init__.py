"""The typed Python client of aidb_memory: :class:`Memory` (sync) and :class:`AsyncMemory`.

One method per function of the SQL API (docs/reference.md), named and with parameters named as
in SQL; results are frozen dataclasses; errors are :class:`AidbMemoryError` subclasses chosen
by SQLSTATE. Importing it imports psycopg and nothing of the installer (no pglast, no
testing.postgresql).
"""

from aidb_memory.client.async_client import AsyncMemory
from aidb_memory.client.errors import (
    AidbMemoryError,
    ConnectionFailed,
    IdempotencyConflict,
    InvalidArgument,
    InvalidState,
    InvalidTurn,
    NamespaceInactive,
    NamespaceNotFound,
    NotFound,
    PermissionDenied,
    SessionClosed,
    TransientError,
)
from aidb_memory.client.sync_client import Memory
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

__all__ = [
    "AidbMemoryError",
    "AsyncMemory",
    "ConnectionFailed",
    "EventStatus",
    "Handoff",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidState",
    "InvalidTurn",
    "Item",
    "Memory",
    "MemoryRecord",
    "MemoryVersion",
    "NamespaceInactive",
    "NamespaceNotFound",
    "NotFound",
    "PermissionDenied",
    "ReadResult",
    "SearchHit",
    "Session",
    "SessionClosed",
    "SessionRow",
    "TransientError",
]
