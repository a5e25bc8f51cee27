"""The clients an integration works through, from what the application gives it.

An integration is given one of ``dsn`` (it opens a :class:`~aidb_memory.client.Memory` and an
:class:`~aidb_memory.client.AsyncMemory` on first use, each with its own connection, and closes
them in ``close``/``aclose``), ``pool`` (a ``psycopg_pool.ConnectionPool`` for the sync methods
or an ``AsyncConnectionPool`` for the async ones) or ``memory`` (a ``Memory`` or an
``AsyncMemory`` the application made). The sync methods need a sync client, the async methods
an async one: given only one kind, the other kind of method raises ``TypeError`` saying so.
"""

from __future__ import annotations

from typing import Any

from aidb_memory.client import AsyncMemory, Memory
from aidb_memory.client._shared import is_pool

__all__ = ["FrameworkClients"]


class FrameworkClients:
    """The sync and async clients of one integration object."""

    def __init__(self, owner: str, *, dsn: str | None, pool: Any, memory: Any) -> None:
        given = [
            name
            for name, value in (("dsn", dsn), ("pool", pool), ("memory", memory))
            if value is not None
        ]
        if len(given) != 1:
            raise TypeError(
                f"{owner} takes exactly one of dsn, pool or memory, not {given or 'none'}"
            )
        self.owner = owner
        self._dsn = dsn
        self._sync: Memory | None = None
        self._async: AsyncMemory | None = None
        self._owned = dsn is not None
        if pool is not None:
            if is_pool(pool, "ConnectionPool"):
                self._sync = Memory(pool)
            elif is_pool(pool, "AsyncConnectionPool"):
                self._async = AsyncMemory(pool)
            else:
                raise TypeError(
                    f"{owner}: pool must be a psycopg_pool.ConnectionPool or AsyncConnectionPool,"
                    f" not {type(pool).__name__}"
                )
        elif isinstance(memory, Memory):
            self._sync = memory
        elif isinstance(memory, AsyncMemory):
            self._async = memory
        elif memory is not None:
            raise TypeError(
                f"{owner}: memory must be an aidb_memory.client.Memory or AsyncMemory, "
                f"not {type(memory).__name__}"
            )

    def sync(self) -> Memory:
        """The sync client (made from the DSN on first use)."""
        if self._sync is None:
            if self._dsn is None:
                raise TypeError(
                    f"{self.owner} was given an async client or pool: use its async methods"
                )
            self._sync = Memory(self._dsn)
        return self._sync

    def asynchronous(self) -> AsyncMemory:
        """The async client (made from the DSN on first use; it connects on its first call)."""
        if self._async is None:
            if self._dsn is None:
                raise TypeError(
                    f"{self.owner} was given a sync client or pool: use its sync methods"
                )
            self._async = AsyncMemory(self._dsn)
        return self._async

    def close(self) -> None:
        """Close the sync connection made from the DSN (what the application gave stays open)."""
        if self._owned and self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close both connections made from the DSN."""
        self.close()
        if self._owned and self._async is not None:
            await self._async.close()
            self._async = None
