"""The rules of compaction (SPEC §3), as plain Python. Pure.

When a budgeted read finds that the unsummarized turns and the newest summary no longer fit, the
oldest three quarters (by chars) of the unsummarized turns, cut at a round boundary, become one
summary of at most a quarter of the budget. This module decides whether a read should compact,
the rule of where the cut falls, what the model is sent, and whether its answer is usable;
``compactor`` does the database part.

Why this keeps compaction rare: it only runs when the unsummarized turns U exceed the budget B
less the newest summary (at most B/4), so U > 3B/4; the cut is the first round boundary at or
past three quarters of U, so each run folds more than 9B/16 of history into a summary (when
the newest round is at most a quarter of U; otherwise the last boundary before it, which still
folds U minus that round). A history of C chars read with a budget B whose turns are at most
B/4 therefore costs at most C / (B/2) + 1 model calls, whatever the number of reads. A cut
"nearest" three quarters would not keep that bound: it may fall up to half a turn short.
"""

from __future__ import annotations

# A read imports this module for target_chars and needed: it must not make the read import
# dataclasses (~9 ms on a backend's first call, for inspect), typing, json nor items
# (docs/architecture.md, "Loading the code"). Hence plain classes below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

SHARE_NUM, SHARE_DEN = 3, 4  # the oldest three quarters of the unsummarized chars
TARGET_DIVISOR = 4  # a summary is at most a quarter of limit_chars


class _Value:
    """Equality and repr by the fields in ``__slots__`` (what a frozen dataclass gave)."""

    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Value)
            and type(other) is type(self)
            and self._fields() == other._fields()
        )

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__)
        return f"{type(self).__name__}({args})"


class Span(_Value):
    """What the cut needs of an unsummarized turn."""

    __slots__ = ("chars", "round_start", "seq")

    def __init__(self, seq: int, round_start: int, chars: int) -> None:
        self.seq = seq
        self.round_start = round_start
        self.chars = chars


class Source(_Value):
    """A turn as the summarizer is shown it.

    ``item``, ``shape``: the stored provider item (turn.item) and its shape: when there is an
    item, the model is shown items.prompt_text of it (text, tool calls and outputs, non-text
    parts by type, never base64 payloads nor encrypted reasoning).
    """

    __slots__ = ("content", "item", "name", "role", "seq", "shape", "tool_call_id", "tool_calls")

    def __init__(
        self,
        seq: int,
        role: str,
        content: str | None,
        name: str | None = None,
        tool_calls: Sequence[dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        item: dict[str, Any] | None = None,
        shape: str = "chat",
    ) -> None:
        self.seq = seq
        self.role = role
        self.content = content
        self.name = name
        self.tool_calls = tool_calls
        self.tool_call_id = tool_call_id
        self.item = item
        self.shape = shape

    def text(self) -> str:
        """The turn's text as the summarizer reads it (its calls on lines of their own for an
        item-less turn, as before)."""
        if self.item is None:
            return self.content or ""
        from aidb_memory_server import items

        return items.prompt_text(
            {
                "role": self.role,
                "content": self.content,
                "name": self.name,
                "tool_calls": self.tool_calls,
                "tool_call_id": self.tool_call_id,
                "item": self.item,
                "shape": self.shape,
            }
        )


def target_chars(limit_chars: int) -> int:
    """The largest summary a read with this budget accepts."""
    return limit_chars // TARGET_DIVISOR


def needed(unsummarized_chars: int, newest_summary_chars: int, limit_chars: int) -> bool:
    """Whether a budgeted read is over budget in the sense that compaction can help: the
    unsummarized turns and the newest summary do not fit together."""
    return unsummarized_chars > 0 and unsummarized_chars + newest_summary_chars > limit_chars


def past_share(total_chars: int) -> int:
    """The fewest chars before a cut that reach three quarters of ``total_chars``: the bound
    of :func:`choose_cut`'s "at or past three quarters", as the cut query in SQL uses it."""
    return -(-SHARE_NUM * total_chars // SHARE_DEN)


def head_and_tail(from_offset: int, to_offset: int, max_input_chars: int) -> tuple[int, int]:
    """For a round larger than the input cap, (head_end, tail_start): the model is sent the
    chars before head_end and from tail_start, half the cap each (the opening states the goal,
    the end the latest state), never the whole round."""
    head = max_input_chars // 2
    return from_offset + head, to_offset - (max_input_chars - head)


def over_budget_alone(tail_round_start: int, covered_seq: int) -> bool:
    """Whether the newest round is all that is left to summarize: then no summary can help a
    read that is over budget (a summary never covers the newest round, which an add may still
    extend), whatever model there is."""
    return tail_round_start <= covered_seq + 1


def choose_cut(spans: Sequence[Span], stop_seq: int, max_input_chars: int) -> int | None:
    """The last seq to summarize, or None when no round can be summarized.

    The rule itself: the compactor chooses the cut with one SQL statement that follows it over
    the char offsets (``compactor._CUT``), so as not to load the history;
    tests/db/test_compaction_bounds.py checks that the two agree.

    ``spans`` are the unsummarized readable turns in order; the first begins a round. A cut after
    a turn is allowed when no round crosses it (every later turn's round starts after it) and the
    next turn is at or before ``stop_seq`` (the newest round, which a later ``add`` may still
    extend, is never summarized). Of the allowed cuts: the first at or past three quarters of
    the chars, else the last before it; but never more input than ``max_input_chars`` (then the
    last cut within it) unless no cut is that small (then the first cut).
    """
    if not spans:
        return None
    total = sum(s.chars for s in spans)
    # suffix_floor[i]: the smallest round_start among spans[i:]; a cut before spans[i] is allowed
    # exactly when it equals spans[i].seq.
    suffix_floor = [0] * len(spans)
    floor = stop_seq
    for i in range(len(spans) - 1, -1, -1):
        floor = min(floor, spans[i].round_start)
        suffix_floor[i] = floor
    candidates: list[tuple[int, int]] = []  # (chars before the cut, last summarized seq)
    prefix = 0
    for i, span in enumerate(spans):
        prefix += span.chars
        nxt = i + 1
        if nxt < len(spans):
            allowed = suffix_floor[nxt] == spans[nxt].seq and spans[nxt].seq <= stop_seq
        else:
            allowed = span.seq < stop_seq
        if allowed and prefix > 0:
            candidates.append((prefix, span.seq))
    if not candidates:
        return None
    within = [c for c in candidates if c[0] <= max_input_chars]
    if not within:
        return candidates[0][1]
    past = [c for c in within if SHARE_DEN * c[0] >= SHARE_NUM * total]
    return past[0][1] if past else within[-1][1]


# --- what the model is sent ---------------------------------------------------------------------

_INSTRUCTIONS = (
    "You write the running summary of an earlier part of a conversation between a user and an AI "
    "assistant, so that the assistant can continue the conversation without those turns. Keep "
    "what the assistant will need: the user's goals and constraints, decisions and agreements, "
    "facts, names, numbers and identifiers, what tools returned that still matters, open "
    "questions and the latest state of things. Leave out greetings and repetition. Write plain "
    "text in the conversation's language, in the third person. Never add anything that is not in "
    "the turns. Your answer must be at most {target} characters long."
)


def transcript(turns: Sequence[Source]) -> str:
    """The turns as numbered lines: what the model reads."""
    lines: list[str] = []
    for t in turns:
        who = t.role if not t.name else f"{t.role} ({t.name})"
        if t.role == "tool":
            who = f"tool result for {t.tool_call_id}"
        if t.item is not None:
            lines.append(f"[{t.seq}] {who}: {t.text()}".rstrip())
            continue
        text = t.content or ""
        lines.append(f"[{t.seq}] {who}: {text}".rstrip())
        for call in t.tool_calls or ():
            fn = call.get("function") or {}
            lines.append(
                f"    calls {fn.get('name')}({fn.get('arguments', '')}) as {call.get('id')}"
            )
    return "\n".join(lines)


def prompt(turns: Sequence[Source], target: int) -> list[dict[str, str]]:
    """The chat messages that ask a model for the summary of ``turns``."""
    first, last = turns[0].seq, turns[-1].seq
    return [
        {"role": "system", "content": _INSTRUCTIONS.format(target=target)},
        {
            "role": "user",
            "content": f"Turns {first} to {last} of the conversation:\n\n{transcript(turns)}",
        },
    ]


def retry_prompt(first: Sequence[dict[str, str]], answer: str, target: int) -> list[dict[str, str]]:
    """The second and last attempt after an overlength answer: the same request, the answer,
    and how much shorter it must be."""
    return [
        *first,
        {"role": "assistant", "content": answer},
        {
            "role": "user",
            "content": (
                f"That summary is {len(answer)} characters; the limit is {target}. Rewrite it in "
                f"at most {target} characters, keeping the goals, decisions, numbers and the "
                "latest state."
            ),
        },
    ]


def extractive_sources(turns: Sequence[Source]) -> list[dict[str, str]]:
    """The turns as the builtin extractive summarizer reads them: role and text, with a tool
    call's name and arguments standing in for an empty assistant message."""
    out: list[dict[str, str]] = []
    for t in turns:
        if t.item is not None:
            out.append({"role": t.role, "content": " ".join(t.text().split("\n")).strip()})
            continue
        text = t.content or ""
        for call in t.tool_calls or ():
            fn = call.get("function") or {}
            text += f" Called {fn.get('name')} with {fn.get('arguments', '')}."
        out.append({"role": t.role, "content": text.strip()})
    return out


def usable(answer: str) -> str | None:
    """A model's answer as the summary to store, or None when it says nothing."""
    text = answer.strip()
    return text or None


def tool_calls(raw: str | None) -> list[dict[str, Any]] | None:
    """A stored ``tool_calls`` column (JSON text) as a list."""
    if raw is None:
        return None
    import json  # only a compaction reads tool_calls; a plain read never imports json

    value = json.loads(raw)
    return value if isinstance(value, list) else None


# --- compaction ahead of reads (issue 13) ---------------------------------------------------------

# The worker compacts a session once its unsummarized chars pass two thirds of the budget its reads
# use: early enough that the summary is written before a read finds the session over budget (at
# more than three quarters, B - newest summary), and late enough that each of these compactions
# still folds more than half the budget (three quarters of more than two thirds), so that the bound
# of the module's docstring, C / (B/2) + 1 model calls, holds for ahead and inline calls together.
AHEAD_NUM, AHEAD_DEN = 2, 3


def ahead_chars(room_chars: int) -> int:
    """The unsummarized chars past which a session is compacted ahead of its reads, for reads
    that leave ``room_chars`` to the history (the budget less the pinned instructions)."""
    return AHEAD_NUM * room_chars // AHEAD_DEN


def ahead_due(unsummarized_chars: int, newest_summary_chars: int, room_chars: int) -> bool:
    """Whether the worker should compact now: past the ahead threshold, or already over budget
    as a read sees it (:func:`needed`, e.g. when the newest summary was written for a larger
    budget)."""
    return unsummarized_chars > ahead_chars(room_chars) or needed(
        unsummarized_chars, newest_summary_chars, room_chars
    )
