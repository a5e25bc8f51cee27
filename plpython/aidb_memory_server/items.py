"""Conversions between the shapes of a stored history (issue 11). Pure Python.

A stored turn comes here as a dict ``{"role", "content", "kind", "name", "tool_calls",
"tool_call_id", "item", "shape"}`` (``tool_calls`` a list or None; ``item`` the provider object
or None; ``shape`` "chat" or "responses"; old rows have item None and shape "chat"; summaries
have kind "summary", role system and their text as content).

- :func:`to_chat`: Chat Completions messages, what ``session_messages(format => 'chat')``
  returns. A chat row returns its item when it has one, else :func:`chat_message` (today's
  rendering of the columns). Consecutive Responses rows are converted as the OpenAI Agents SDK
  converts Responses input (``Converter.items_to_messages`` with no model): consecutive
  function calls merge into one assistant message, reasoning items are left out, a tool output
  keeps only its text parts (or becomes "[tool output omitted]"). Where the SDK refuses an item,
  we do not: a call that needs an output (custom_tool_call, computer_call, shell calls) joins
  the assistant message as a tool call (a custom one as ``{"type": "custom", "custom": {"name",
  "input"}}``, the others as the function-style call of the row's ``tool_calls`` column); its
  output becomes a tool message with its text; an assistant EasyInputMessage's output_text parts
  count as text; every other item that chat cannot express (hosted tool calls, item references,
  compaction items, types we do not know) and content parts it cannot carry (an image by file
  id, a file by URL) are left out.
- :func:`to_responses`: a Responses input list, what ``format => 'responses'`` returns.
  Responses rows give their item back verbatim; chat messages convert: user, system and
  developer messages become EasyInputMessages ``{"role", "content"}`` (parts as input_text,
  input_image, input_audio, input_file); an assistant message becomes an EasyInputMessage with
  its text (output_text and refusal parts when it has parts or a refusal), then one
  function_call (custom_tool_call for a custom call) per tool call; a tool message becomes a
  function_call_output (custom_tool_call_output when it answers a custom call). ``name`` and
  ``audio`` have no Responses form and are left out.
- Summaries: ``{"role": "system", "content": text}`` in both formats (an EasyInputMessage
  without ``type`` in Responses, as the Agents SDK writes a plain input).
- :func:`prompt_text`: what the summarizer is shown of a turn: text, tool names, arguments and
  outputs, reasoning summaries; non-text parts described by type ("[image]", "[file
  report.pdf]", "[audio]"); never base64 data, URLs of images or files, nor encrypted content.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

OMITTED_TOOL_OUTPUT = "[tool output omitted]"  # the Agents SDK's placeholder
_NEEDS_OUTPUT = (
    "function_call",
    "custom_tool_call",
    "computer_call",
    "local_shell_call",
    "shell_call",
    "apply_patch_call",
)
_ANSWERS = tuple(f"{t}_output" for t in _NEEDS_OUTPUT)

Row = Mapping[str, Any]


def _is_summary(row: Row) -> bool:
    return row.get("kind") == "summary"


def _is_responses(row: Row) -> bool:
    return row.get("shape") == "responses" and row.get("item") is not None


def chat_message(row: Row) -> dict[str, Any]:
    """An item-less chat row as a Chat Completions message: the columns, as
    ``session_messages`` has always rendered them."""
    if _is_summary(row):
        return {"role": "system", "content": row.get("content")}
    if row.get("role") == "tool":
        return {"role": "tool", "tool_call_id": row.get("tool_call_id"), "content": row["content"]}
    message: dict[str, Any] = {"role": row.get("role"), "content": row.get("content")}
    if row.get("tool_calls") is not None:
        message = {
            "role": "assistant",
            "content": row.get("content"),
            "tool_calls": row["tool_calls"],
        }
    if row.get("name") is not None:
        message["name"] = row["name"]
    return message


# --- Responses → chat (the Agents SDK's rules) ----------------------------------------------------


def _copy_breakpoint(source: Mapping[str, Any], target: dict[str, Any]) -> None:
    if source.get("prompt_cache_breakpoint") is not None:
        target["prompt_cache_breakpoint"] = source["prompt_cache_breakpoint"]


def _chat_part(part: Any) -> dict[str, Any] | None:
    """One Responses content part as a chat part (None: chat cannot carry it)."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "text" or kind == "output_text":
        kind, part = "input_text", {**part, "type": "input_text"}
    elif kind == "image_url":
        image = part.get("image_url")
        if not isinstance(image, dict) or not image.get("url"):
            return None
        alias: dict[str, Any] = {"type": "input_image", "image_url": image["url"]}
        if image.get("detail") is not None:
            alias["detail"] = image["detail"]
        _copy_breakpoint(part, alias)
        kind, part = "input_image", alias
    out: dict[str, Any]
    if kind == "input_text":
        out = {"type": "text", "text": part.get("text")}
    elif kind == "input_image":
        if not part.get("image_url"):
            return None
        detail = part.get("detail", "auto")
        out = {
            "type": "image_url",
            "image_url": {
                "url": part["image_url"],
                "detail": "high" if detail == "original" else detail,
            },
        }
    elif kind == "video_url":
        video = part.get("video_url")
        if not isinstance(video, dict) or not video.get("url"):
            return None
        return {"type": "video_url", "video_url": {"url": video["url"]}}
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not audio.get("data") or not audio.get("format"):
            return None
        out = {
            "type": "input_audio",
            "input_audio": {"data": audio["data"], "format": audio["format"]},
        }
    elif kind == "input_file":
        file: dict[str, Any]
        if part.get("file_data"):
            file = {"file_data": part["file_data"]}
        elif part.get("file_id"):
            file = {"file_id": part["file_id"]}
        else:
            return None
        if part.get("filename"):
            file["filename"] = part["filename"]
        out = {"type": "file", "file": file}
    else:
        return None
    _copy_breakpoint(part, out)
    return out


def _all_content(content: Any) -> Any:
    if isinstance(content, str) or not isinstance(content, list):
        return content
    return [p for p in map(_chat_part, content) if p is not None]


def _text_content(content: Any) -> Any:
    parts = _all_content(content)
    if not isinstance(parts, list):
        return parts
    return [p for p in parts if p.get("type") == "text"]


class _ToChat:
    """The state of ``Converter.items_to_messages`` over consecutive Responses rows."""

    def __init__(self, out: list[dict[str, Any]]) -> None:
        self.out = out
        self.current: dict[str, Any] | None = None

    def flush(self) -> None:
        if self.current is not None:
            if not self.current.get("tool_calls"):
                del self.current["tool_calls"]
            self.out.append(self.current)
            self.current = None

    def assistant(self) -> dict[str, Any]:
        if self.current is None:
            self.current = {"role": "assistant", "content": None, "tool_calls": []}
        return self.current

    def call(self, call: dict[str, Any]) -> None:
        message = self.assistant()
        message["tool_calls"] = [*message.get("tool_calls", []), call]

    def add(self, row: Row) -> None:
        item: dict[str, Any] = row["item"]
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and (role in ("user", "system", "developer") or _easy(item)):
            self.flush()
            content = item.get("content")
            if role == "user":
                self.out.append({"role": "user", "content": _all_content(content)})
            else:
                self.out.append({"role": role, "content": _text_content(content)})
        elif kind == "message" and role == "assistant":
            self.output_message(item)
        elif kind == "file_search_call":
            arguments = {"queries": item.get("queries", []), "status": item.get("status")}
            self.call(
                {
                    "id": item.get("id"),
                    "type": "function",
                    "function": {"name": "file_search_call", "arguments": json.dumps(arguments)},
                }
            )
        elif kind == "function_call":
            self.call(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"] or "{}"},
                }
            )
        elif kind == "custom_tool_call":
            self.call(
                {
                    "id": item["call_id"],
                    "type": "custom",
                    "custom": {"name": item["name"], "input": item["input"]},
                }
            )
        elif kind in _NEEDS_OUTPUT:
            for call in row.get("tool_calls") or ():
                self.call(dict(call))
        elif kind == "function_call_output":
            self.flush()
            output = _all_content(item.get("output"))
            if isinstance(output, list):
                output = [p for p in output if p.get("type") == "text"] or OMITTED_TOOL_OUTPUT
            self.out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind in _ANSWERS:
            self.flush()
            text = row.get("content")
            self.out.append(
                {
                    "role": "tool",
                    "tool_call_id": row.get("tool_call_id"),
                    "content": text if text is not None else OMITTED_TOOL_OUTPUT,
                }
            )
        # reasoning, hosted tool calls, references, compaction and unknown items: no chat form.

    def output_message(self, item: dict[str, Any]) -> None:
        texts: list[str] = []
        refusal: str | None = None
        content = item.get("content")
        if isinstance(content, str):
            texts.append(content)
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("output_text", "input_text", "text"):
                texts.append(part.get("text", ""))
            elif part.get("type") == "refusal":
                refusal = part.get("refusal")
        current = self.current
        if (
            current is not None
            and current.get("tool_calls")
            and "refusal" not in current
            and (current.get("content") is None or isinstance(current.get("content"), list))
        ):
            if texts:
                current["content"] = "\n".join(texts)
            if refusal is not None:
                current["refusal"] = refusal
            return
        self.flush()
        message: dict[str, Any] = {"role": "assistant"}
        if refusal is not None:
            message["refusal"] = refusal
        if texts:
            message["content"] = "\n".join(texts)
        message["tool_calls"] = []
        self.current = message


def _easy(item: dict[str, Any]) -> bool:
    """An EasyInputMessage as the Agents SDK recognizes one."""
    keys = set(item)
    return (
        {"content", "role"} <= keys <= {"content", "role", "type", "phase"}
        and item.get("phase") in (None, "commentary", "final_answer")
        and item.get("role") in ("user", "assistant", "system", "developer")
    )


def to_chat(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """The rows as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    converter = _ToChat(out)
    for row in rows:
        if _is_summary(row):
            converter.flush()
            out.append({"role": "system", "content": row.get("content")})
        elif _is_responses(row):
            converter.add(row)
        else:
            converter.flush()
            item = row.get("item")
            out.append(item if item is not None else chat_message(row))
    converter.flush()
    return out


# --- chat → Responses ------------------------------------------------------------------------


def _input_part(part: Any) -> Any:
    """A chat content part as a Responses input part (unknown parts as they are)."""
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    out: dict[str, Any]
    if kind == "text":
        out = {"type": "input_text", "text": part.get("text")}
    elif kind == "image_url":
        image = part.get("image_url") or {}
        out = {
            "type": "input_image",
            "image_url": image.get("url"),
            "detail": image.get("detail") or "auto",
        }
    elif kind == "file":
        out = {"type": "input_file", **(part.get("file") or {})}
    else:
        return part
    _copy_breakpoint(part, out)
    return out


def _output_part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") == "text":
        return {"type": "output_text", "text": part.get("text"), "annotations": []}
    return part


def _chat_to_items(message: Mapping[str, Any], custom: set[str]) -> list[dict[str, Any]]:
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        call_id = message.get("tool_call_id")
        output = [_input_part(p) for p in content] if isinstance(content, list) else content
        kind = "custom_tool_call_output" if call_id in custom else "function_call_output"
        return [{"type": kind, "call_id": call_id, "output": output if output is not None else ""}]
    if role != "assistant":
        if isinstance(content, list):
            content = [_input_part(p) for p in content]
        return [{"role": role, "content": content}]
    out: list[dict[str, Any]] = []
    refusal = message.get("refusal")
    if isinstance(content, list) or refusal is not None:
        parts = [_output_part(p) for p in content] if isinstance(content, list) else []
        if isinstance(content, str) and content:
            parts.append(_output_part({"type": "text", "text": content}))
        if refusal is not None:
            parts.append({"type": "refusal", "refusal": refusal})
        if parts:
            out.append({"role": "assistant", "content": parts})
    elif content:
        out.append({"role": "assistant", "content": content})
    for call in message.get("tool_calls") or ():
        if call.get("type") == "custom":
            body = call.get("custom") or {}
            custom.add(call.get("id"))
            out.append(
                {
                    "type": "custom_tool_call",
                    "call_id": call.get("id"),
                    "name": body.get("name"),
                    "input": body.get("input", ""),
                }
            )
        else:
            body = call.get("function") or {}
            out.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": body.get("name"),
                    "arguments": body.get("arguments", ""),
                }
            )
    return out


def to_responses(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """The rows as a Responses input list."""
    out: list[dict[str, Any]] = []
    custom: set[str] = set()  # call ids of custom tool calls, for the outputs that answer them
    for row in rows:
        if _is_summary(row):
            out.append({"role": "system", "content": row.get("content")})
        elif _is_responses(row):
            item = row["item"]
            if item.get("type") == "custom_tool_call":
                custom.add(item.get("call_id"))
            out.append(item)
        else:
            item = row.get("item")
            out.extend(_chat_to_items(item if item is not None else chat_message(row), custom))
    return out


# --- what the summarizer is shown ----------------------------------------------------------------


def _describe(part: Any) -> str:
    """A content part as text: its text, or its type for anything else."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return ""
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text", "summary_text", "reasoning_text"):
        text = part.get("text")
        return text if isinstance(text, str) else ""
    if kind == "refusal":
        return f"(refused) {part.get('refusal')}"
    if kind in ("image_url", "input_image", "computer_screenshot"):
        return "[image]"
    if kind in ("file", "input_file"):
        file = part.get("file") if kind == "file" else part
        filename = file.get("filename") if isinstance(file, dict) else None
        return f"[file {filename}]" if isinstance(filename, str) and filename else "[file]"
    if kind in ("input_audio", "output_audio"):
        return "[audio]"
    text = part.get("text")
    if isinstance(text, str):
        return text
    if isinstance(kind, str):
        return f"[{kind}]"
    # An object without a type (a shell call's output): its strings.
    return "\n".join(v for v in part.values() if isinstance(v, str))


def _described(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(d for d in map(_describe, content) if d)
    if isinstance(content, dict):
        return _describe(content)
    return content if isinstance(content, str) else ""


def _calls(calls: Any) -> list[str]:
    lines = []
    for call in calls or ():
        body = call.get("function") or call.get("custom") or {}
        arguments = body.get("arguments", body.get("input", ""))
        lines.append(f"calls {body.get('name')}({arguments}) as {call.get('id')}")
    return lines


def prompt_text(row: Row) -> str:
    """What the summarizer reads of a turn (possibly several lines)."""
    item = row.get("item")
    if _is_summary(row) or item is None:
        lines = [row.get("content") or "", *_calls(row.get("tool_calls"))]
        return "\n".join(line for line in lines if line)
    if row.get("shape") != "responses":
        lines = [_described(item.get("content"))]
        if item.get("refusal") is not None:
            lines.append(f"(refused) {item['refusal']}")
        if item.get("audio") is not None:
            lines.append("[audio]")
        lines.extend(_calls(item.get("tool_calls")))
        return "\n".join(line for line in lines if line)
    kind = item.get("type", "message")
    if kind == "message":
        return _described(item.get("content"))
    if kind == "reasoning":
        summary = _described(item.get("summary"))
        return f"(reasoning) {summary}" if summary else "(reasoning)"
    if kind in _NEEDS_OUTPUT:
        return "\n".join(_calls(row.get("tool_calls")))
    if kind.endswith("_output"):
        return _described(item.get("output"))
    if kind == "mcp_call":
        text = f"[mcp_call] {item.get('name')}({item.get('arguments', '')})"
        output = item.get("output")
        return f"{text} → {output}" if isinstance(output, str) and output else text
    if kind == "web_search_call":
        action = item.get("action")
        query = action.get("query") if isinstance(action, dict) else None
        return f"[web_search_call] {query}" if isinstance(query, str) else "[web_search_call]"
    if kind == "file_search_call":
        queries = [q for q in item.get("queries") or () if isinstance(q, str)]
        return f"[file_search_call] {'; '.join(queries)}".rstrip()
    return f"[{kind}]"
