"""Validation of the turns an ``add`` stores (SPEC §3). Pure Python.

Every rule names the turn index and the field it refuses, so that a client sees exactly what to
fix, and a batch is accepted whole or not at all.

Two shapes of batch (issue 11). A batch in which any element has a top-level ``type`` key (or,
without one, a ``phase`` or a Responses content part such as input_text) is *Responses-shaped*:
every element is an OpenAI Responses input or output item (an element without ``type`` is an
EasyInputMessage). Otherwise it is *chat-shaped*: Chat Completions
messages. A Responses-shaped batch with a chat-only form in it (role ``tool``, ``tool_calls``,
``tool_call_id``) is refused (22023) naming the element and the field.

Every turn is stored as a chat-like projection in the columns (role, content, name, tool_calls,
tool_call_id, kind, meta, chars) that compaction, search, handoff and rounds read, plus, where
the columns cannot give back what was sent, the original object in :attr:`Turn.item`:

- chat: ``item`` is set only when the columns cannot reproduce the message exactly as
  ``session_messages`` renders an item-less row (:func:`aidb_memory_server.items.chat_message`):
  content as an array of parts, role ``developer``, ``refusal``, ``audio``, a tool call of type
  ``custom`` or without ``type``/``arguments``, a ``name`` on a tool result, explicit nulls, ….
  A plain chat message keeps ``item`` None, as before.
- responses: ``item`` is always the element as sent (without our own ``kind`` and ``meta`` keys,
  which are taken from Responses items too and never sent to a provider).

The projection of a Responses item:

- ``role``: a message's role; ``tool`` for an ``*_output`` item; ``assistant`` for everything the
  model produced (function/custom/computer/shell calls, hosted tool calls, reasoning, and any
  item type we do not know); an item with a ``role`` of its own (``additional_tools``) keeps it;
  ``mcp_approval_response`` is the user's.
- ``content``: the text parts joined with "\\n" (input_text, output_text, refusal, text); a tool
  output's text; a reasoning item's summary texts; None when there is no text.
- ``tool_calls``: for an item that needs an output (:data:`CALL_OUTPUTS`), one chat-style call
  ``{"id": call_id, "type": "function", "function": {"name", "arguments"}}``: a function_call's
  own name and arguments; a custom_tool_call's name with its ``input`` as arguments; any other
  (computer_call, local_shell_call, shell_call, apply_patch_call) named by its type, with the
  compact JSON of the item without type, id, call_id and status as arguments (for a
  computer_call: its action or actions and pending safety checks).
- ``tool_call_id``: the call_id an output answers.
- ``kind`` (default): user_prompt, model_response, system, developer for messages;
  ``tool_call`` for any ``*_call`` item, ``tool_result`` for any ``*_output`` item,
  ``reasoning``; else the item's type.

Budget cost (``chars``, which ``max_turn_chars`` caps): the text of every content part (text,
refusal, input/output text), tool-call arguments (or input) and outputs, reasoning summary and
reasoning text; every image, file or audio part (and a computer screenshot, an image generation
result) costs ``Limits.non_text_part_chars`` (namespace config ``non_text_part_chars``, default
1000); a part of a type we do not know costs its ``text`` if it has one, else the same fixed
cost. Ids, statuses and ``encrypted_content`` are not counted. An item of a type we do not know
costs the length of its compact JSON without type, id, call_id, status and encrypted_content.
A plain chat turn costs what it always did: content plus every call's arguments.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from aidb_memory_server.errors import invalid
from aidb_memory_server.items import chat_message
from aidb_memory_server.validation import CONFIG_DEFAULTS, json_type, parse_json

ROLES = ("user", "assistant", "system", "developer", "tool")
TURN_KEYS = (
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "refusal",
    "audio",
    "kind",
    "meta",
)
OWN_KEYS = ("kind", "meta")  # ours, on either shape; never part of the stored item
TOOL_CALL_KEYS = ("id", "type", "function", "custom")
FUNCTION_KEYS = ("name", "arguments")
CUSTOM_KEYS = ("name", "input")
RESERVED_KINDS = ("summary",)
KIND_MAX = 64
DEFAULT_KIND = {
    "user": "user_prompt",
    "assistant": "model_response",
    "tool": "tool_result",
    "system": "system",
    "developer": "developer",
}
SHAPES = ("chat", "responses")

# Responses items that need an output from the caller, and the output type that answers each.
CALL_OUTPUTS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
}
ANSWERS = frozenset(CALL_OUTPUTS.values())
# Keys of a chat message that a Responses-shaped batch may not have (mixing the shapes).
CHAT_ONLY_KEYS = ("tool_calls", "tool_call_id")
# An element without "type" in a Responses-shaped batch is an EasyInputMessage.
EASY_KEYS = ("role", "content", "phase", "kind", "meta")
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
# Content parts: the text they carry, and those that cost the fixed non-text price.
TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "summary_text": "text",
    "reasoning_text": "text",
}
NON_TEXT_PARTS = (
    "image_url",
    "input_image",
    "file",
    "input_file",
    "input_audio",
    "output_audio",
    "computer_screenshot",
)
_UNCOUNTED = ("type", "id", "call_id", "status", "encrypted_content")


@dataclass(frozen=True)
class Limits:
    """Size limits from the namespace config."""

    max_turn_chars: int
    max_turns_per_add: int
    max_identifier_chars: int
    max_add_chars: int = CONFIG_DEFAULTS["max_add_chars"]
    non_text_part_chars: int = CONFIG_DEFAULTS["non_text_part_chars"]


@dataclass
class Turn:
    """One validated turn, normalized for storage.

    ``item`` is the provider object to store verbatim (jsonb) when the columns cannot give it
    back (always for ``shape == "responses"``); ``shape`` is "chat" or "responses".
    """

    role: str
    content: str | None
    kind: str
    name: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    meta: dict[str, Any]
    chars: int
    sequence_id: str | None
    item: dict[str, Any] | None = None
    shape: str = "chat"

    @property
    def item_type(self) -> str | None:
        """The Responses item type ("message" for an EasyInputMessage); None for chat."""
        if self.shape != "responses" or self.item is None:
            return None
        value = self.item.get("type", "message")
        return value if isinstance(value, str) else None


@dataclass
class Tail:
    """The end of a session as the next add sees it: the open round and unanswered calls.

    ``joinable``: the open calls belong to a Responses model response still in progress (no
    output has arrived since they opened), so more call items (and reasoning or assistant
    message items) may still join them. ``last_type``: the Responses type of the session's last
    turn (None after a chat turn), for rounds that continue across adds.
    """

    sequence_id: str | None = None
    round_start: int | None = None
    open_calls: list[str] = field(default_factory=list)
    joinable: bool = False
    last_type: str | None = None


def parse_turns(fn: str, text: str, limits: Limits) -> list[Any]:
    """The ``turns`` argument as a non-empty JSON array within the per-add limits. Its size is
    checked before it is parsed: parsing is what a hostile batch would make expensive."""
    if len(text) > limits.max_add_chars:
        raise invalid(
            fn,
            "turns",
            f"has {len(text)} characters of JSON, more than the namespace limit of "
            f"{limits.max_add_chars}",
            hint="split the batch, or raise config.max_add_chars with namespace_update",
        )
    value = parse_json(fn, "turns", text)
    if not isinstance(value, list):
        raise invalid(fn, "turns", f"must be a JSON array of turns, not {json_type(value)}")
    if not value:
        raise invalid(fn, "turns", "must contain at least one turn")
    if len(value) > limits.max_turns_per_add:
        raise invalid(
            fn,
            "turns",
            f"has {len(value)} turns, more than the namespace limit of {limits.max_turns_per_add}",
            hint="split the batch, or raise config.max_turns_per_add with namespace_update",
        )
    return value


def _text(fn: str, where: str, value: Any, limit: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise invalid(fn, where, f"must be a string, not {json_type(value)}")
    if not allow_empty and not value.strip():
        raise invalid(fn, where, "must not be empty")
    if len(value) > limit:
        raise invalid(fn, where, f"is longer than {limit} characters")
    return value


def _string(fn: str, where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise invalid(fn, where, f"must be a string, not {json_type(value)}")
    return value


def _object(fn: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(fn, where, f"must be an object, not {json_type(value)}")
    return value


# --- content parts ---------------------------------------------------------------------------


def _part(fn: str, where: str, part: Any, limits: Limits) -> tuple[str | None, int]:
    """A content part's text (None for a non-text part) and its budget cost."""
    part = _object(fn, where, part)
    kind = part.get("type")
    if kind is None:
        raise invalid(fn, f"{where}.type", "is required", hint="a content part has a type")
    kind = _string(fn, f"{where}.type", kind)
    key = TEXT_PARTS.get(kind)
    if key is not None:
        text = _string(fn, f"{where}.{key}", part.get(key))
        return text, len(text)
    if kind == "image_url":
        image = _object(fn, f"{where}.image_url", part.get("image_url"))
        _string(fn, f"{where}.image_url.url", image.get("url"))
    elif kind == "input_audio":
        audio = _object(fn, f"{where}.input_audio", part.get("input_audio"))
        _string(fn, f"{where}.input_audio.data", audio.get("data"))
        _string(fn, f"{where}.input_audio.format", audio.get("format"))
    elif kind == "file":
        _object(fn, f"{where}.file", part.get("file"))
    elif kind not in NON_TEXT_PARTS:
        # A part type we do not know is kept as it is; its text, if it has one, counts.
        text = part.get("text")
        if isinstance(text, str):
            return text, len(text)
    return None, limits.non_text_part_chars


def _parts(fn: str, where: str, value: list[Any], limits: Limits) -> tuple[str | None, int]:
    """An array of content parts: the text parts joined with "\\n" (None without any) and the
    cost of them all."""
    texts: list[str] = []
    cost = 0
    for j, part in enumerate(value):
        text, chars = _part(fn, f"{where}[{j}]", part, limits)
        cost += chars
        if text is not None:
            texts.append(text)
    return ("\n".join(texts) if texts else None), cost


def _output(fn: str, where: str, value: Any, limits: Limits) -> tuple[str | None, int]:
    """A tool output (a string, an array of parts, or one object such as a screenshot): its
    text and cost. Objects without a ``type`` (a shell call's stdout/stderr) count their
    strings."""
    if value is None:
        return None, 0
    if isinstance(value, str):
        return value, len(value)
    elements = value if isinstance(value, list) else [value]
    texts: list[str] = []
    cost = 0
    for j, element in enumerate(elements):
        at = f"{where}[{j}]" if isinstance(value, list) else where
        if isinstance(element, dict) and "type" in element:
            text, chars = _part(fn, at, element, limits)
        elif isinstance(element, dict):
            strings = [v for v in element.values() if isinstance(v, str) and v]
            text, chars = ("\n".join(strings) or None), sum(len(s) for s in strings)
        elif isinstance(element, str):
            text, chars = element, len(element)
        else:
            raise invalid(fn, at, f"must be an object or a string, not {json_type(element)}")
        cost += chars
        if text is not None:
            texts.append(text)
    return ("\n".join(texts) if texts else None), cost


# --- chat messages -----------------------------------------------------------------------------


def _tool_calls(fn: str, where: str, value: Any, limits: Limits) -> list[dict[str, Any]]:
    """Chat tool calls, normalized to function calls (a custom call's input as arguments)."""
    if not isinstance(value, list) or not value:
        raise invalid(fn, where, "must be a non-empty array of tool calls")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise invalid(fn, at, f"must be an object, not {json_type(call)}")
        for key in call:
            if key not in TOOL_CALL_KEYS:
                raise invalid(
                    fn,
                    f"{at}.{key}",
                    "is not a known key",
                    hint="a tool call has id, type, function (or custom)",
                )
        call_id = _text(fn, f"{at}.id", call.get("id"), limits.max_identifier_chars)
        kind = call.get("type", "function")
        if kind not in ("function", "custom"):
            raise invalid(fn, f"{at}.type", 'must be "function" or "custom"')
        body_key, keys, args_key = (
            ("function", FUNCTION_KEYS, "arguments")
            if kind == "function"
            else ("custom", CUSTOM_KEYS, "input")
        )
        body = call.get(body_key)
        if not isinstance(body, dict):
            raise invalid(fn, f"{at}.{body_key}", f"must be an object with name and {args_key}")
        for key in body:
            if key not in keys:
                raise invalid(fn, f"{at}.{body_key}.{key}", "is not a known key")
        name = _text(fn, f"{at}.{body_key}.name", body.get("name"), limits.max_identifier_chars)
        arguments = body.get(args_key, "")
        if not isinstance(arguments, str):
            raise invalid(
                fn,
                f"{at}.{body_key}.{args_key}",
                "must be a string (JSON text, as OpenAI sends it)",
            )
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def _own_keys(
    fn: str, at: str, raw: dict[str, Any], limits: Limits
) -> tuple[str | None, dict[str, Any], str | None]:
    """Our own ``kind`` and ``meta`` (either shape): kind (None for the default), meta and its
    sequence_id."""
    kind = raw.get("kind")
    if kind is not None:
        kind = _text(fn, f"{at}.kind", kind, KIND_MAX)
        if kind in RESERVED_KINDS:
            raise invalid(
                fn, f"{at}.kind", f'"{kind}" is reserved for summaries written by aidb_memory'
            )
    meta = raw.get("meta")
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise invalid(fn, f"{at}.meta", f"must be an object, not {json_type(meta)}")
    sequence_id = meta.get("sequence_id")
    if sequence_id is not None:
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, (str, int)):
            raise invalid(fn, f"{at}.meta.sequence_id", "must be a string or an integer")
        sequence_id = str(sequence_id)
        # An identifier like the others: the session row keeps the newest one (its tail).
        if len(sequence_id) > limits.max_identifier_chars:
            raise invalid(
                fn,
                f"{at}.meta.sequence_id",
                f"is longer than {limits.max_identifier_chars} characters",
            )
    return kind, meta, sequence_id


def _without_own_keys(raw: dict[str, Any]) -> dict[str, Any]:
    if "kind" in raw or "meta" in raw:
        return {k: v for k, v in raw.items() if k not in OWN_KEYS}
    return raw


def validate_turn(fn: str, i: int, raw: Any, limits: Limits) -> Turn:
    """One chat message, checked against every rule of the chat shape; ``i`` is its index in
    the batch."""
    at = f"turns[{i}]"
    if not isinstance(raw, dict):
        raise invalid(fn, at, f"must be an object, not {json_type(raw)}")
    for key in raw:
        if key not in TURN_KEYS:
            raise invalid(
                fn, f"{at}.{key}", "is not a known key", hint="a turn has: " + ", ".join(TURN_KEYS)
            )
    role = raw.get("role")
    if role is None:
        raise invalid(fn, f"{at}.role", "is required", hint="one of: " + ", ".join(ROLES))
    if role not in ROLES:
        raise invalid(
            fn, f"{at}.role", f"must be one of {', '.join(ROLES)}, not {json.dumps(role)}"
        )

    tool_calls = None
    if raw.get("tool_calls") is not None:
        if role != "assistant":
            raise invalid(fn, f"{at}.tool_calls", "is allowed only on an assistant turn")
        tool_calls = _tool_calls(fn, f"{at}.tool_calls", raw["tool_calls"], limits)

    refusal = raw.get("refusal")
    if refusal is not None:
        if role != "assistant":
            raise invalid(fn, f"{at}.refusal", "is allowed only on an assistant turn")
        refusal = _text(fn, f"{at}.refusal", refusal, limits.max_turn_chars, allow_empty=True)
    audio = raw.get("audio")
    if audio is not None:
        if role != "assistant":
            raise invalid(fn, f"{at}.audio", "is allowed only on an assistant turn")
        _object(fn, f"{at}.audio", audio)

    content = raw.get("content")
    # OpenAI takes no content from an assistant that called tools, refused or spoke (audio),
    # and an empty tool result; everything else says something.
    may_be_empty = role == "assistant" and (
        tool_calls is not None or refusal is not None or audio is not None
    )
    cost = 0
    if content is None or content == "":
        if not may_be_empty and not (role == "tool" and content == ""):
            raise invalid(
                fn,
                f"{at}.content",
                "is required (only an assistant turn with tool_calls, refusal or audio may "
                "omit it; a tool result may be empty)",
            )
        content = None if content is None else ""
    elif isinstance(content, list):
        if not content:
            raise invalid(fn, f"{at}.content", "must not be an empty array")
        content, cost = _parts(fn, f"{at}.content", content, limits)
    elif isinstance(content, str):
        content = _text(fn, f"{at}.content", content, limits.max_turn_chars, allow_empty=True)
        cost = len(content)
    else:
        raise invalid(
            fn,
            f"{at}.content",
            f"must be a string or an array of content parts, not {json_type(content)}",
        )
    if refusal is not None:
        content = refusal if content is None else f"{content}\n{refusal}"
        cost += len(refusal)

    tool_call_id = raw.get("tool_call_id")
    if role == "tool":
        if tool_call_id is None:
            raise invalid(fn, f"{at}.tool_call_id", "is required on a tool turn")
        tool_call_id = _text(fn, f"{at}.tool_call_id", tool_call_id, limits.max_identifier_chars)
    elif tool_call_id is not None:
        raise invalid(fn, f"{at}.tool_call_id", "is allowed only on a tool turn")

    name = raw.get("name")
    if name is not None:
        name = _text(fn, f"{at}.name", name, limits.max_identifier_chars)

    kind, meta, sequence_id = _own_keys(fn, at, raw, limits)
    if kind is None:
        kind = "tool_call" if tool_calls else DEFAULT_KIND[role]

    chars = cost + sum(len(c["function"]["arguments"]) for c in tool_calls or ())
    if chars > limits.max_turn_chars:
        # A string content alone was checked above: here parts, a refusal or tool-call
        # arguments tipped the turn over.
        where, what = (
            ("tool_calls", "content plus tool-call arguments")
            if tool_calls
            else ("content", "content parts")
        )
        raise invalid(
            fn,
            f"{at}.{where}",
            f"has {chars} characters ({what}), more than the namespace limit of "
            f"{limits.max_turn_chars}",
            hint="raise config.max_turn_chars with namespace_update",
        )
    turn = Turn(role, content, kind, name, tool_calls, tool_call_id, meta, chars, sequence_id)
    if _PLAIN_KEYS.issuperset(raw) and role in _PLAIN_ROLES and isinstance(raw["content"], str):
        return turn  # the common case, which the columns always give back
    message = _without_own_keys(raw)
    if role == "developer" or not _reproduces(turn, message):
        turn.item = message
    return turn


_PLAIN_KEYS = frozenset(("role", "content", "kind", "meta"))
_PLAIN_ROLES = ("user", "assistant", "system")


def _reproduces(turn: Turn, message: dict[str, Any]) -> bool:
    """Whether the columns alone give ``message`` back (as session_messages renders them)."""
    row = {
        "role": turn.role,
        "content": turn.content,
        "kind": turn.kind,
        "name": turn.name,
        "tool_calls": turn.tool_calls,
        "tool_call_id": turn.tool_call_id,
    }
    return chat_message(row) == message


# --- Responses items ---------------------------------------------------------------------------


def _identifier(fn: str, where: str, value: Any, limits: Limits) -> str:
    if value is None:
        raise invalid(fn, where, "is required")
    return _text(fn, where, value, limits.max_identifier_chars)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _item_role(kind: str, raw: dict[str, Any]) -> str:
    if kind == "message":
        role = raw.get("role")
        return role if isinstance(role, str) else "user"
    if kind.endswith("_output"):
        return "tool"
    if kind == "mcp_approval_response":
        return "user"
    role = raw.get("role")
    if isinstance(role, str) and role in MESSAGE_ROLES:
        return role
    return "assistant"


def _item_kind(kind: str, role: str) -> str:
    if kind == "message":
        return DEFAULT_KIND[role]
    if kind.endswith("_call"):
        return "tool_call"
    if kind.endswith("_output"):
        return "tool_result"
    return kind[:KIND_MAX]


def _mixing(fn: str, where: str, first: int) -> Exception:
    return invalid(
        fn,
        where,
        "is a Chat Completions form, but this batch is Responses-shaped "
        f"(turns[{first}] is a Responses item)",
        hint="send Chat Completions messages and Responses items in separate adds",
    )


def validate_item(fn: str, i: int, raw: Any, limits: Limits, first: int | None = None) -> Turn:
    """One Responses input or output item (an element of a Responses-shaped batch); ``first``
    is the index of an element with a ``type`` (for the message that refuses mixed shapes)."""
    at = f"turns[{i}]"
    if not isinstance(raw, dict):
        raise invalid(fn, at, f"must be an object, not {json_type(raw)}")
    first = i if first is None else first
    if "type" not in raw:
        for key in raw:
            if key in CHAT_ONLY_KEYS:
                raise _mixing(fn, f"{at}.{key}", first)
            if key not in EASY_KEYS:
                raise invalid(
                    fn,
                    f"{at}.{key}",
                    "is not a known key of a message without a type",
                    hint="an EasyInputMessage has: " + ", ".join(EASY_KEYS),
                )
        if raw.get("role") == "tool":
            raise _mixing(fn, f"{at}.role", first)
        kind = "message"
    else:
        kind = _text(fn, f"{at}.type", raw["type"], KIND_MAX)
    if "id" in raw and raw["id"] is not None:
        _string(fn, f"{at}.id", raw["id"])

    if kind == "message":
        role = raw.get("role")
        if role is None:
            raise invalid(
                fn, f"{at}.role", "is required", hint="one of: " + ", ".join(MESSAGE_ROLES)
            )
        if role not in MESSAGE_ROLES:
            raise invalid(
                fn,
                f"{at}.role",
                f"must be one of {', '.join(MESSAGE_ROLES)}, not {json.dumps(role)}",
            )
    own_kind, meta, sequence_id = _own_keys(fn, at, raw, limits)
    role = _item_role(kind, raw)
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    where = at
    if kind == "message":
        value = raw.get("content")
        where = f"{at}.content"
        if isinstance(value, str):
            if not value and role != "assistant":
                raise invalid(fn, where, "must not be empty")
            content, cost = value, len(value)
        elif isinstance(value, list):
            if not value and role != "assistant":  # a model's message may be empty
                raise invalid(fn, where, "must not be an empty array")
            content, cost = _parts(fn, where, value, limits)
        elif value is None:
            raise invalid(fn, where, "is required")
        else:
            raise invalid(
                fn, where, f"must be a string or an array of content parts, not {json_type(value)}"
            )
    elif kind in CALL_OUTPUTS:
        call_id = _identifier(fn, f"{at}.call_id", raw.get("call_id"), limits)
        if kind == "function_call":
            name = _identifier(fn, f"{at}.name", raw.get("name"), limits)
            arguments = _string(fn, f"{at}.arguments", raw.get("arguments"))
            where = f"{at}.arguments"
        elif kind == "custom_tool_call":
            name = _identifier(fn, f"{at}.name", raw.get("name"), limits)
            arguments = _string(fn, f"{at}.input", raw.get("input"))
            where = f"{at}.input"
        else:
            name = kind
            arguments = _compact(
                {k: v for k, v in raw.items() if k not in (*_UNCOUNTED, *OWN_KEYS)}
            )
        tool_calls = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ]
        name = None
        cost = len(arguments)
    elif kind in ANSWERS:
        answer = raw.get("call_id")
        if answer is None and kind == "local_shell_call_output":
            answer = raw.get("id")  # this output names its call by "id"
        tool_call_id = _identifier(fn, f"{at}.call_id", answer, limits)
        where = f"{at}.output"
        if "output" not in raw and kind in ("function_call_output", "custom_tool_call_output"):
            raise invalid(fn, where, "is required")
        value = raw.get("output")
        if kind in ("function_call_output", "custom_tool_call_output") and not isinstance(
            value, (str, list)
        ):
            raise invalid(
                fn, where, f"must be a string or an array of content parts, not {json_type(value)}"
            )
        content, cost = _output(fn, where, value, limits)
        if isinstance(raw.get("name"), str):
            name = _text(fn, f"{at}.name", raw["name"], limits.max_identifier_chars)
    elif kind == "reasoning":
        summary = raw.get("summary")
        if not isinstance(summary, list):
            raise invalid(fn, f"{at}.summary", f"must be an array, not {json_type(summary)}")
        content, cost = _parts(fn, f"{at}.summary", summary, limits)
        reasoning = raw.get("content")
        if reasoning is not None:
            if not isinstance(reasoning, list):
                raise invalid(fn, f"{at}.content", f"must be an array, not {json_type(reasoning)}")
            cost += _parts(fn, f"{at}.content", reasoning, limits)[1]
        encrypted = raw.get("encrypted_content")
        if encrypted is not None:
            _string(fn, f"{at}.encrypted_content", encrypted)
        where = f"{at}.summary"
    elif kind == "image_generation_call":
        cost = limits.non_text_part_chars if raw.get("result") else 0
    else:
        # Any other item (hosted tool calls, and types we do not know) is kept as it is.
        rest = {k: v for k, v in raw.items() if k not in (*_UNCOUNTED, *OWN_KEYS)}
        cost = len(_compact(rest)) if rest else 0

    if cost > limits.max_turn_chars:
        raise invalid(
            fn,
            where,
            f"has {cost} characters, more than the namespace limit of {limits.max_turn_chars}",
            hint="raise config.max_turn_chars with namespace_update",
        )
    kind_value = own_kind if own_kind is not None else _item_kind(kind, role)
    return Turn(
        role,
        content,
        kind_value,
        name,
        tool_calls,
        tool_call_id,
        meta,
        cost,
        sequence_id,
        _without_own_keys(raw),
        "responses",
    )


RESPONSES_PART_TYPES = ("input_text", "output_text", "input_image", "input_file")


def _responses_only(element: Any) -> bool:
    """Whether an element is a Responses item by its form: a top-level ``type``; or, for an
    EasyInputMessage (which has none), a ``phase`` or a Responses content part (input_text,
    output_text, input_image, input_file), which no Chat Completions message has."""
    if not isinstance(element, dict):
        return False
    if "type" in element or "phase" in element:
        return True
    content = element.get("content")
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in RESPONSES_PART_TYPES for p in content
    )


def batch_shape(raw: list[Any]) -> tuple[str, int | None]:
    """("responses", index of the first element that is a Responses item by its form) or
    ("chat", None). A batch of messages that both APIs accept (``{"role", "content"}`` with
    string content) is chat-shaped: both formats read it back the same."""
    for i, element in enumerate(raw):
        if _responses_only(element):
            return "responses", i
    return "chat", None


def _plain_batch(raw: list[Any], limits: Limits) -> list[Turn] | None:
    """The batch when every element is a plain chat message, ``{"role", "content"}`` with a
    user, assistant or system role and non-empty string content within the turn limit (what
    :func:`validate_turn` makes of it, in one pass); else None."""
    out = []
    for element in raw:
        if not isinstance(element, dict) or len(element) != 2:
            return None
        role = element.get("role")
        content = element.get("content")
        if (
            role not in _PLAIN_ROLES
            or not isinstance(content, str)
            or not content
            or len(content) > limits.max_turn_chars
        ):
            return None
        out.append(
            Turn(role, content, DEFAULT_KIND[role], None, None, None, {}, len(content), None)
        )
    return out


def validate_batch(fn: str, raw: list[Any], limits: Limits) -> list[Turn]:
    """Every element of a batch (from :func:`parse_turns`), in the batch's shape; raises on the
    first refused element, so that nothing of a batch with any refused element is stored."""
    plain = _plain_batch(raw, limits)
    if plain is not None:
        return plain
    shape, first = batch_shape(raw)
    if shape == "chat":
        return [validate_turn(fn, i, t, limits) for i, t in enumerate(raw)]
    return [validate_item(fn, i, t, limits, first) for i, t in enumerate(raw)]


# --- the tool-call protocol --------------------------------------------------------------------


def _protocol(fn: str, batch: list[Turn], tail: Tail) -> tuple[list[str], bool]:
    open_calls = list(tail.open_calls)
    joinable = tail.joinable and bool(open_calls)
    for i, turn in enumerate(batch):
        at = f"turns[{i}]"
        responses = turn.shape == "responses"
        item_type = turn.item_type
        if turn.role == "tool" and (not responses or item_type in ANSWERS):
            if turn.tool_call_id not in open_calls:
                field_name = "call_id" if responses else "tool_call_id"
                raise invalid(
                    fn,
                    f"{at}.{field_name}",
                    f"{json.dumps(turn.tool_call_id)} does not answer an open tool call",
                    hint="a tool output must answer a call of the model response just before "
                    "it (in this batch or already in the session), once",
                )
            open_calls.remove(turn.tool_call_id)
            joinable = False
        elif turn.role == "tool":
            pass  # an output no call of ours waits for (tool_search_output, …)
        elif open_calls and not (responses and turn.role == "assistant" and joinable):
            raise invalid(
                fn,
                at,
                f"comes before tool call {json.dumps(open_calls[0])} has its "
                + ("output" if responses else "result"),
                hint="add the tool outputs right after the model response that called the tools",
            )
        if turn.tool_calls:
            ids = [c["id"] for c in turn.tool_calls]
            if len(set(ids)) != len(ids):
                raise invalid(fn, f"{at}.tool_calls", "has two calls with the same id")
            for call_id in ids:
                if call_id in open_calls:
                    raise invalid(
                        fn,
                        f"{at}.call_id",
                        f"{json.dumps(call_id)} is the call_id of a call still open",
                    )
            open_calls = [*open_calls, *ids] if responses else ids
            # A chat assistant message is a whole response; Responses calls may be joined by
            # the response's next items until an output arrives.
            joinable = responses
        if not open_calls:
            joinable = False
    return open_calls, joinable


def check_protocol(fn: str, batch: list[Turn], tail: Tail) -> list[str]:
    """Tool outputs follow the calls that asked for them; returns the calls still open after.

    Chat: an assistant turn with tool_calls opens calls; until each is answered, only tool
    turns answering them are accepted (every provider rejects anything else in between).

    Responses: the call items of one model response accumulate open calls (parallel calls,
    with reasoning and assistant message items between them, need no grouping); outputs answer
    open calls by call_id in any order; once an output has arrived, no new model item is
    accepted until every open call is answered; a user, system or developer message while calls
    are open is refused; hosted tool calls (web_search_call, file_search_call, mcp_call, …) need
    no output. A batch may end with calls still open: their outputs may come in a later add.
    """
    return _protocol(fn, batch, tail)[0]


def _is_call(item_type: str | None) -> bool:
    return item_type is not None and item_type.endswith("_call")


def effective_sequence_ids(turns: list[Turn], tail: Tail) -> list[str | None]:
    """Each turn's meta.sequence_id, where a tool result without one carries its round's.

    Tool results rarely carry meta (OpenAI's tool messages have none); without this, the
    assistant answer that follows them with the round's sequence_id would start a new round.
    """
    out: list[str | None] = []
    previous = tail.sequence_id
    for turn in turns:
        current = turn.sequence_id
        if current is None and turn.role == "tool":
            current = previous
        out.append(current)
        previous = current
    return out


def place_in_rounds(
    turns: list[Turn],
    first_seq: int,
    tail: Tail,
    sequence_ids: list[str | None] | None = None,
) -> list[int]:
    """The round_start of each new turn (positions from ``first_seq``), given the session's tail.

    A turn joins the round before it when it is a tool result (it answers that round's call) or
    when it shares that round's meta.sequence_id; otherwise it starts a round. A Responses item
    also joins it when the item before is a reasoning item (which travels with what follows
    it), when both are call items (parallel calls of one response), or when calls are still
    open before it (a call never leaves its round before its output). ``sequence_ids`` are
    :func:`effective_sequence_ids`, when the caller has them already (the last one is also the
    session's new tail).
    """
    if sequence_ids is None:
        sequence_ids = effective_sequence_ids(turns, tail)
    starts = []
    prev_sequence, prev_start, prev_type = tail.sequence_id, tail.round_start, tail.last_type
    open_calls = set(tail.open_calls)
    for offset, (turn, sequence_id) in enumerate(zip(turns, sequence_ids, strict=True)):
        seq = first_seq + offset
        item_type = turn.item_type
        joins = prev_start is not None and (
            turn.role == "tool"
            or (sequence_id is not None and sequence_id == prev_sequence)
            or (
                turn.shape == "responses"
                and (
                    prev_type == "reasoning"
                    or (_is_call(item_type) and _is_call(prev_type))
                    or bool(open_calls)
                )
            )
        )
        start = prev_start if joins and prev_start is not None else seq
        starts.append(start)
        if turn.tool_call_id is not None:
            open_calls.discard(turn.tool_call_id)
        if turn.tool_calls:
            open_calls.update(c["id"] for c in turn.tool_calls)
        prev_sequence, prev_start, prev_type = sequence_id, start, item_type
    return starts


def next_tail(
    fn: str,
    batch: list[Turn],
    tail: Tail,
    sequence_ids: list[str | None],
    starts: list[int],
) -> Tail:
    """The session's tail after ``batch`` (all of what an add persists of it), given the
    batch's :func:`effective_sequence_ids` and :func:`place_in_rounds`."""
    open_calls, joinable = _protocol(fn, batch, tail)
    return Tail(sequence_ids[-1], starts[-1], open_calls, joinable, batch[-1].item_type)


def turns_hash(text: str, *context: str | None) -> str:
    """A canonical hash of a batch, to tell a retried add from a different one.

    ``context`` (the session and agent ids) is part of it: the same turns sent to another
    session under a used key are a different request, not a retry.
    """
    canonical = json.dumps(
        [parse_json("add", "turns", text), *context],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
