"""Verbatim extraction (issue 26): long-term memory without a language model. Pure.

A namespace whose ``extraction_mode`` resolves to ``verbatim`` (or ``verbatim_all``) stores what
the user said (and, for ``verbatim_all``, what the assistant said) as memories, as it was said:
each turn's text cut into :func:`pieces` of at most ``memory_max_chars`` characters on sentence
boundaries. No model is called; the worker stores the pieces under the actor's lock, merging only
exact duplicates (``extraction.content_hash``).

:func:`mode` decides which extraction an event gets; :func:`spoken` which turns count.
"""

from __future__ import annotations

import re

# A sentence ends after ., !, ?, … (one or more) followed by whitespace, or at a newline.
_END = re.compile(r"[.!?\u2026]+(?=\s)|\n")

# Never stored verbatim, whatever the mode: a tool call (an assistant turn that calls a tool) or
# a tool's result, and what the model thought (a reasoning item's summary) rather than said.
_NOT_SAID = frozenset(("tool_call", "tool_result", "reasoning"))


def mode(configured: str, can_extract: bool) -> str:
    """The extraction an event gets: ``model``, ``verbatim`` or ``verbatim_all``. ``auto`` is
    ``model`` when the namespace's ``model_spec.llm`` is a model that can extract
    (``can_extract``: registered and not the builtin summarizer), else ``verbatim``."""
    if configured == "auto":
        return "model" if can_extract else "verbatim"
    return configured


def spoken(role: str, kind: str | None, all_roles: bool) -> bool:
    """Whether a turn of ``role`` (and ``kind``, as stored) is stored verbatim: the user's turns,
    and with ``all_roles`` (``verbatim_all``) the assistant's; never a tool call or result, a
    reasoning item, or a system or developer turn."""
    if kind in _NOT_SAID:
        return False
    return role == "user" or (all_roles and role == "assistant")


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    for m in _END.finditer(text):
        out.append(text[start : m.end()])
        start = m.end()
    out.append(text[start:])
    return [s.strip() for s in out if s and not s.isspace()]


def _cut(sentence: str, max_chars: int) -> tuple[str, str]:
    """The first part of a (stripped) sentence longer than ``max_chars``: up to the last
    whitespace before the limit, else exactly ``max_chars`` characters; and the rest."""
    for i in range(max_chars, 0, -1):
        if sentence[i].isspace():
            return sentence[:i].rstrip(), sentence[i:].lstrip()
    return sentence[:max_chars], sentence[max_chars:].lstrip()


def pieces(text: str, max_chars: int) -> list[str]:
    """``text`` split into pieces of at most ``max_chars`` characters on sentence boundaries,
    consecutive sentences packed into one piece (joined by a space) while they fit. A sentence
    longer than ``max_chars`` is split at the last whitespace before the limit, else cut hard.
    Pieces are stripped and never empty; joined by single spaces, they hold every non-whitespace
    character of ``text``, in order."""
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    out: list[str] = []
    current = ""
    for sentence in _sentences(text):
        while len(sentence) > max_chars:
            if current:
                out.append(current)
                current = ""
            first, sentence = _cut(sentence, max_chars)
            out.append(first)
        if not sentence:
            continue
        if not current:
            current = sentence
        elif len(current) + 1 + len(sentence) <= max_chars:
            current = f"{current} {sentence}"
        else:
            out.append(current)
            current = sentence
    if current:
        out.append(current)
    return out
