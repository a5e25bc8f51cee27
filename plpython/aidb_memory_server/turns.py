"""Validation of the turns an ``add`` stores (SPEC §3). Pure Python.

Every rule names the turn index and the field it refuses, so that a client sees exactly what to
fix, and a batch is accepted whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from aidb_memory_server.errors import invalid
from aidb_memory_server.validation import CONFIG_DEFAULTS, json_type, parse_json

ROLES = ("user", "assistant", "system", "tool")
TURN_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "kind", "meta")
TOOL_CALL_KEYS = ("id", "type", "function")
FUNCTION_KEYS = ("name", "arguments")
RESERVED_KINDS = ("summary",)
KIND_MAX = 64
DEFAULT_KIND = {
    "user": "user_prompt",
    "assistant": "model_response",
    "tool": "tool_result",
    "system": "system",
}


@dataclass(frozen=True)
class Limits:
    """Size limits from the namespace config."""

    max_turn_chars: int
    max_turns_per_add: int
    max_identifier_chars: int
    max_add_chars: int = CONFIG_DEFAULTS["max_add_chars"]


@dataclass
class Turn:
    """One validated turn, normalized for storage."""

    role: str
    content: str | None
    kind: str
    name: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    meta: dict[str, Any]
    chars: int
    sequence_id: str | None


@dataclass
class Tail:
    """The end of a session as the next add sees it: the open round and unanswered calls."""

    sequence_id: str | None = None
    round_start: int | None = None
    open_calls: list[str] = field(default_factory=list)


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


def _tool_calls(fn: str, where: str, value: Any, limits: Limits) -> list[dict[str, Any]]:
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
                    hint="a tool call has id, type, function",
                )
        call_id = _text(fn, f"{at}.id", call.get("id"), limits.max_identifier_chars)
        if call.get("type", "function") != "function":
            raise invalid(fn, f"{at}.type", 'must be "function"')
        function = call.get("function")
        if not isinstance(function, dict):
            raise invalid(fn, f"{at}.function", "must be an object with name and arguments")
        for key in function:
            if key not in FUNCTION_KEYS:
                raise invalid(fn, f"{at}.function.{key}", "is not a known key")
        name = _text(fn, f"{at}.function.name", function.get("name"), limits.max_identifier_chars)
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            raise invalid(
                fn, f"{at}.function.arguments", "must be a string (JSON text, as OpenAI sends it)"
            )
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def validate_turn(fn: str, i: int, raw: Any, limits: Limits) -> Turn:
    """One turn, checked against every rule of the turn shape; ``i`` is its index in the batch."""
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

    content = raw.get("content")
    if content is None or content == "":
        if tool_calls is None:
            raise invalid(
                fn,
                f"{at}.content",
                "is required (only an assistant turn with tool_calls may omit it)",
            )
        content = None if content is None else ""
    else:
        content = _text(fn, f"{at}.content", content, limits.max_turn_chars, allow_empty=True)

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

    kind = raw.get("kind")
    if kind is None:
        kind = "tool_call" if tool_calls else DEFAULT_KIND[role]
    else:
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

    chars = len(content or "") + sum(len(c["function"]["arguments"]) for c in tool_calls or ())
    if chars > limits.max_turn_chars:
        # Content alone was checked above: here the tool-call arguments tipped the turn over.
        raise invalid(
            fn,
            f"{at}.tool_calls",
            f"has {chars} characters (content plus tool-call arguments), more than the namespace "
            f"limit of {limits.max_turn_chars}",
            hint="raise config.max_turn_chars with namespace_update",
        )
    return Turn(role, content, kind, name, tool_calls, tool_call_id, meta, chars, sequence_id)


def check_protocol(fn: str, batch: list[Turn], tail: Tail) -> list[str]:
    """Tool results follow the call that asked for them; returns the calls still open after.

    An assistant turn with tool_calls opens calls; until each is answered, only tool turns
    answering them are accepted (every provider rejects anything else in between). A batch may
    end with calls still open: their results may come in a later add.
    """
    open_calls = list(tail.open_calls)
    for i, turn in enumerate(batch):
        at = f"turns[{i}]"
        if turn.role == "tool":
            if turn.tool_call_id not in open_calls:
                raise invalid(
                    fn,
                    f"{at}.tool_call_id",
                    f"{json.dumps(turn.tool_call_id)} does not answer an open tool call",
                    hint="a tool result must answer a call of the assistant turn just before it "
                    "(in this batch or already in the session), once",
                )
            open_calls.remove(turn.tool_call_id)
        elif open_calls:
            raise invalid(
                fn,
                at,
                f"comes before tool call {json.dumps(open_calls[0])} has its result",
                hint="add the tool results right after the assistant turn that called the tools",
            )
        if turn.tool_calls:
            ids = [c["id"] for c in turn.tool_calls]
            if len(set(ids)) != len(ids):
                raise invalid(fn, f"{at}.tool_calls", "has two calls with the same id")
            open_calls = ids
    return open_calls


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
    when it shares that round's meta.sequence_id; otherwise it starts a round. ``sequence_ids``
    are :func:`effective_sequence_ids`, when the caller has them already (the last one is also
    the session's new tail).
    """
    if sequence_ids is None:
        sequence_ids = effective_sequence_ids(turns, tail)
    starts = []
    prev_sequence, prev_start = tail.sequence_id, tail.round_start
    for offset, (turn, sequence_id) in enumerate(zip(turns, sequence_ids, strict=True)):
        seq = first_seq + offset
        joins = prev_start is not None and (
            turn.role == "tool" or (sequence_id is not None and sequence_id == prev_sequence)
        )
        start = prev_start if joins and prev_start is not None else seq
        starts.append(start)
        prev_sequence, prev_start = sequence_id, start
    return starts


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
