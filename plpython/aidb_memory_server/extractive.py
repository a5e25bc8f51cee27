"""The builtin extractive summarizer: deterministic, offline, and not a language model. Pure.

It quotes whole sentences from the turns, chosen in this order until the target size is reached:
the user's first stated goal, the latest state (the newest user and assistant sentences),
decisions, sentences with numbers, sentences with names. Chosen sentences keep their original
order. Its output says what it is, so nobody mistakes it for a model's summary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MODEL_NAME = "builtin:extractive"
# A sentence ends at . ! or ? followed by whitespace or the end: "$1,536.00" and "2.1" stay whole.
_SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?]+(?=[^\s.!?]))+(?:[.!?]+|$)", re.MULTILINE)
_NUMBER = re.compile(r"\d")
_NAME = re.compile(r"(?<=[a-z,;:] )[A-Z][a-z]+")
_DECISION = re.compile(
    r"\b(decid\w*|agree\w*|confirm\w*|resolv\w*|fix\w*|(?:re)?appl(?:y|ied)|will|must|cancel\w*|"
    r"refund\w*|approv\w*|reject\w*|schedul\w*|chose|choose|plan\w*|next step)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Source:
    """What the summarizer reads of one turn."""

    role: str
    content: str


@dataclass(frozen=True)
class _Sentence:
    position: int
    role: str
    text: str


def header(first_seq: int, last_seq: int) -> str:
    """The line that opens every extractive summary."""
    return (
        f"[Extractive summary of turns {first_seq}-{last_seq}, quoted by aidb_memory's builtin "
        "summarizer, not a model]"
    )


def _sentences(turns: Sequence[Source]) -> list[_Sentence]:
    out: list[_Sentence] = []
    for turn in turns:
        if turn.role == "system":
            continue
        for match in _SENTENCE.finditer(turn.content or ""):
            text = " ".join(match.group(0).split())
            if len(text) > 1:
                out.append(_Sentence(len(out), turn.role, text))
    return out


def _priority(s: _Sentence, first_user: int | None, latest: set[int]) -> int:
    if s.position == first_user:
        return 0
    if s.position in latest:
        return 1
    decision, number = bool(_DECISION.search(s.text)), bool(_NUMBER.search(s.text))
    if decision and number:
        return 2
    if decision or number:
        return 3
    if _NAME.search(s.text):
        return 4
    return 5


def _line(s: _Sentence) -> str:
    return f"- {s.role}: {s.text}"


def summarize(turns: Sequence[Source], target_chars: int, first_seq: int, last_seq: int) -> str:
    """An extractive summary of ``turns`` of at most ``target_chars`` characters."""
    head = header(first_seq, last_seq)
    if target_chars <= len(head):
        return head[: max(0, target_chars - 1)].rstrip() + "]" if target_chars > 1 else ""
    sentences = _sentences(turns)
    # The goal: the user's first sentence that says something (not a bare greeting).
    users = [s for s in sentences if s.role == "user"]
    goal = next((s for s in users if len(s.text.split()) >= 4), users[0] if users else None)
    first_user = goal.position if goal else None
    latest: set[int] = set()
    for role in ("user", "assistant", "tool"):
        last = next((s.position for s in reversed(sentences) if s.role == role), None)
        if last is not None:
            latest.add(last)
    ranked = sorted(sentences, key=lambda s: (_priority(s, first_user, latest), -s.position))
    chosen: list[_Sentence] = []
    used = len(head)
    for s in ranked:
        cost = len(_line(s)) + 1
        if used + cost <= target_chars:
            chosen.append(s)
            used += cost
        elif s.position == first_user and not chosen:
            # The goal alone is too long: keep its beginning rather than nothing.
            room = target_chars - used - len(f"- {s.role}: ") - 2
            if room > 10:
                text = s.text[:room].rsplit(" ", 1)[0] + "…"
                chosen.append(_Sentence(s.position, s.role, text))
                used += len(_line(chosen[-1])) + 1
    chosen.sort(key=lambda s: s.position)
    return "\n".join([head, *(_line(s) for s in chosen)])
