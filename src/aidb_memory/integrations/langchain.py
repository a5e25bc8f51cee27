"""LangChain chat history on an aidb_memory session: :class:`AidbChatMessageHistory`.

Needs ``aidb-memory[langchain]`` (langchain-core).

**How messages are stored.** Each LangChain message is one chat turn: ``add_messages`` converts
the batch with LangChain's own ``convert_to_openai_messages`` (so an ``AIMessage`` with
``tool_calls`` is an assistant turn with OpenAI ``tool_calls``, a ``ToolMessage`` a ``tool``
turn with its ``tool_call_id``, content blocks stay content parts) and adds it in one call to
``add`` (all or none). The message's ``id`` is kept in the turn's ``meta`` as
``{"langchain": {"id": ...}}``, which chat messages have no field for.

**How they are read.** ``messages`` is one ``session_get`` (with the history's ``limit_chars``
and ``limit_items``, compaction included): each turn's chat message (the message as added, or
its ``role``/``content``/``tool_calls``/``tool_call_id``/``name``) goes through LangChain's
``convert_to_messages`` with the id from ``meta``; a summary is a ``SystemMessage``. When the
session also holds turns added in the Responses shape (by the Agents SDK integration, say), the
history is read with ``session_messages(format="chat")`` instead, the server's conversion, and
the messages then carry no ids.

Not kept: ``additional_kwargs``, ``response_metadata``, ``usage_metadata``, a ``ToolMessage``'s
``artifact`` and ``status``. A round whose tool calls are not all answered yet is left out of
reads (``tool_results_pending``) until the ``ToolMessage``\\ s are added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, convert_to_messages, convert_to_openai_messages

from aidb_memory.client import ReadResult
from aidb_memory.integrations._framework_clients import FrameworkClients

if TYPE_CHECKING:
    from aidb_memory.client import AsyncMemory, Memory

__all__ = ["AidbChatMessageHistory"]

# The keys of a chat turn of ``session_get`` that make its chat message.
_CHAT_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
DEFAULT_CLEAR_REASON = "cleared by LangChain (AidbChatMessageHistory.clear)"


def to_turns(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as chat turns for ``add``, each message's id in ``meta``."""
    turns: list[dict[str, Any]] = convert_to_openai_messages(list(messages))
    for message, turn in zip(messages, turns, strict=True):
        if message.id is not None:
            turn["meta"] = {"langchain": {"id": message.id}}
    return turns


def from_read(read: ReadResult) -> list[BaseMessage] | None:
    """A ``session_get`` read as LangChain messages; None when it holds a Responses-shaped turn
    (then the server converts: ``session_messages(format="chat")``)."""
    messages: list[dict[str, Any]] = []
    for item in read.items:
        if item.get("format") == "responses":
            return None
        if item.get("kind") == "summary" and item.get("seq") is None:
            messages.append({"role": "system", "content": item["content"]})
            continue
        stored = item.get("item")
        message = (
            dict(stored)
            if isinstance(stored, dict)
            else {key: item[key] for key in _CHAT_KEYS if item.get(key) is not None}
        )
        message.setdefault("content", item.get("content"))
        meta = item.get("meta") or {}
        ids = meta.get("langchain") if isinstance(meta, dict) else None
        if isinstance(ids, dict) and isinstance(ids.get("id"), str):
            message["id"] = ids["id"]
        messages.append(message)
    return convert_to_messages(messages)


class AidbChatMessageHistory(BaseChatMessageHistory):
    """A LangChain ``BaseChatMessageHistory`` on the aidb_memory session ``session_id`` of
    ``(namespace, actor_id)``.

    Give it exactly one of ``dsn``, ``pool`` (a psycopg_pool ``ConnectionPool`` for the sync
    methods, ``AsyncConnectionPool`` for the async ones) or ``memory`` (a
    :class:`~aidb_memory.client.Memory` or :class:`~aidb_memory.client.AsyncMemory`).
    ``agent_id`` is recorded when the session is created. ``limit_chars`` and ``limit_items``
    bound what ``messages`` returns (the budget rule of ``session_get``; with ``limit_chars``
    an over-budget history is compacted into a summary). ``clear`` erases the session with
    ``session_delete``, audited with ``clear_reason``.
    """

    def __init__(
        self,
        session_id: str,
        *,
        namespace: str,
        actor_id: str,
        agent_id: str | None = None,
        dsn: str | None = None,
        pool: Any = None,
        memory: Memory | AsyncMemory | None = None,
        limit_chars: int | None = None,
        limit_items: int | None = None,
        clear_reason: str = DEFAULT_CLEAR_REASON,
    ) -> None:
        self.session_id = session_id
        self.namespace = namespace
        self.actor_id = actor_id
        self.agent_id = agent_id
        self.limit_chars = limit_chars
        self.limit_items = limit_items
        self.clear_reason = clear_reason
        self._clients = FrameworkClients(
            "AidbChatMessageHistory", dsn=dsn, pool=pool, memory=memory
        )

    # --- sync -----------------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's history as LangChain messages, oldest first."""
        memory = self._clients.sync()
        read = memory.session_get(
            self.namespace,
            self.actor_id,
            self.session_id,
            limit_chars=self.limit_chars,
            limit_items=self.limit_items,
        )
        converted = from_read(read)
        if converted is not None:
            return converted
        return convert_to_messages(
            memory.session_messages(
                self.namespace,
                self.actor_id,
                self.session_id,
                limit_chars=self.limit_chars,
                limit_items=self.limit_items,
            )
        )

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append the messages, all or none, in one ``add``."""
        if not messages:
            return
        self._clients.sync().add(
            self.namespace,
            self.actor_id,
            to_turns(messages),
            session_id=self.session_id,
            agent_id=self.agent_id,
        )

    def clear(self) -> None:
        """Erase the session (``session_delete``); the next message starts it again."""
        self._clients.sync().session_delete(
            self.namespace, self.actor_id, self.session_id, self.clear_reason
        )

    def close(self) -> None:
        """Close the connection made from ``dsn`` (a pool or client given stays open)."""
        self._clients.close()

    # --- async ----------------------------------------------------------------------------

    async def aget_messages(self) -> list[BaseMessage]:
        """``messages``, async."""
        memory = self._clients.asynchronous()
        read = await memory.session_get(
            self.namespace,
            self.actor_id,
            self.session_id,
            limit_chars=self.limit_chars,
            limit_items=self.limit_items,
        )
        converted = from_read(read)
        if converted is not None:
            return converted
        return convert_to_messages(
            await memory.session_messages(
                self.namespace,
                self.actor_id,
                self.session_id,
                limit_chars=self.limit_chars,
                limit_items=self.limit_items,
            )
        )

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """``add_messages``, async."""
        if not messages:
            return
        await self._clients.asynchronous().add(
            self.namespace,
            self.actor_id,
            to_turns(messages),
            session_id=self.session_id,
            agent_id=self.agent_id,
        )

    async def aclear(self) -> None:
        """``clear``, async."""
        await self._clients.asynchronous().session_delete(
            self.namespace, self.actor_id, self.session_id, self.clear_reason
        )

    async def aclose(self) -> None:
        """Close the connections made from ``dsn``."""
        await self._clients.aclose()
