"""An OpenAI Agents SDK ``Session`` stored in aidb_memory: :class:`AidbSession`.

``pip install 'aidb-memory[agents]'``. The Agents SDK hands a session Responses input items and
reads them back as a Responses input list; aidb_memory stores Responses items as they come
(``add``) and gives them back as they went in (``session_messages(format => 'responses')``), so
this module converts nothing: every method is one call of the SQL API through
:class:`~aidb_memory.client.AsyncMemory`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from aidb_memory.client import AsyncMemory

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from psycopg_pool import AsyncConnectionPool

__all__ = ["CLEAR_REASON", "AidbSession"]

CLEAR_REASON = "openai-agents: Session.clear_session"
"""The reason ``clear_session`` records in the audit log (``session_delete`` needs one)."""

MAX_LIMIT_ITEMS = 1_000_000  # the largest limit_items session_messages takes

# The keys a read adds to a stored turn; what is left of an item-less chat turn is the message.
_OWN_KEYS = frozenset({"seq", "kind", "meta", "created_at", "item", "format"})


class AidbSession:
    """The Agents SDK ``Session`` protocol on an aidb_memory session.

    ``AidbSession(session_id, namespace=..., actor_id=..., dsn=... or pool=...)``: the history of
    session ``session_id`` of actor ``actor_id`` in namespace ``namespace`` (created by the first
    ``add_items``, with ``agent_id`` when given). Give either ``dsn`` (the session opens one
    connection on first use, in autocommit, and closes it in :meth:`close`) or ``pool`` (a
    ``psycopg_pool.AsyncConnectionPool``: a connection is borrowed for each call).

    - :meth:`get_items` (``limit``, else ``session_settings.limit``): ``session_messages(format =>
      'responses', limit_items => limit, limit_chars => limit_chars)``. ``limit`` counts items, as
      the SDK's sessions do, but never returns a tool result without its call, and a round whose
      calls still wait for their results is left out (no model accepts it). With ``limit_chars``
      the read is budgeted, and a namespace with a model compacts older turns into a summary
      (``{"role": "system", "content": ...}``) instead of dropping them.
    - :meth:`add_items`: ``add`` of the items, all or none, as one batch.
    - :meth:`pop_item`: ``session_pop``; the item as it was added.
    - :meth:`clear_session`: ``session_delete`` with the reason :data:`CLEAR_REASON` (or
      ``clear_reason``), recorded in the audit log; the session is gone, and the next
      ``add_items`` starts it again.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        *,
        namespace: str,
        actor_id: str,
        agent_id: str | None = None,
        dsn: str | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        limit_chars: int | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        clear_reason: str = CLEAR_REASON,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise TypeError("AidbSession takes a dsn or a pool (one of them)")
        self.session_id = session_id
        self.namespace = namespace
        self.actor_id = actor_id
        self.agent_id = agent_id
        self.limit_chars = limit_chars
        self.clear_reason = clear_reason
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        source: str | AsyncConnectionPool[Any] = dsn if dsn is not None else cast(Any, pool)
        self.memory = AsyncMemory(source)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items (all when None), oldest first, as a Responses input list."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit < 0:
            limit = None  # as SQLiteSession: a negative limit is no limit
        if limit == 0:
            return []
        items = await self.memory.session_messages(
            self.namespace,
            self.actor_id,
            self.session_id,
            limit_chars=self.limit_chars,
            limit_items=None if limit is None else min(limit, MAX_LIMIT_ITEMS),
            format="responses",
        )
        return cast("list[TResponseInputItem]", items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items to the session, in one ``add`` (all or none)."""
        if not items:
            return
        await self.memory.add(
            self.namespace,
            self.actor_id,
            cast("list[dict[str, Any]]", items),
            session_id=self.session_id,
            agent_id=self.agent_id,
        )

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (None when the session is empty or unknown).

        An item added in the Responses shape comes back exactly as added (the ``item`` the
        server returns). A turn stored as a chat message (a plain ``{"role", "content"}`` message,
        which is the same in both APIs, or a message another client added in the chat shape)
        comes back as that message, without the server's keys (``seq``, ``kind``, ...).
        """
        row = await self.memory.session_pop(self.namespace, self.actor_id, self.session_id)
        if row is None:
            return None
        item = row.get("item")
        if item is None:
            item = {k: v for k, v in row.items() if k not in _OWN_KEYS}
        return cast("TResponseInputItem", item)

    async def clear_session(self) -> None:
        """Delete the session with all its items (``session_delete``, audited)."""
        await self.memory.session_delete(
            self.namespace, self.actor_id, self.session_id, self.clear_reason
        )

    async def close(self) -> None:
        """Close the connection opened from ``dsn`` (a pool stays open)."""
        await self.memory.close()
