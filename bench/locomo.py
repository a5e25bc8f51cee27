"""The pure parts of `make bench-quality` (bench/quality.py): LoCoMo-style conversations and their
questions, the content of one memory per dialog turn, the retrieval metrics and reciprocal-rank
fusion. No database, no model: tests/unit/test_bench_quality.py tests them on a conversation it
writes itself.

A conversation file (LoCoMo, Maharana et al., ACL 2024) is a JSON object with ``speaker_a``,
``speaker_b``, ``session_N`` (a list of turns ``{speaker, dia_id, text, blip_caption?}``) with
``session_N_date_time``, and ``qa`` (``{question, answer, evidence: [dia_id...], category}``).
Category 5 (adversarial: no answer in the conversation) is left out of retrieval measures. A
question whose evidence is empty, or names an id that is not a turn of its conversation (``D``,
``D30:05`` where session 30 has no turn 5, ``D8:6; D9:17`` joined in one string), is skipped and
counted under its reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATEGORIES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
LEFT_OUT_CATEGORIES: dict[int, str] = {5: "adversarial"}
RRF_K = 60

_SESSION = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D\d+:\d+")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    date: str
    speaker: str
    text: str
    caption: str | None = None


@dataclass(frozen=True)
class Question:
    conversation: str
    index: int  # its position in the file's qa list
    question: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Skipped:
    conversation: str
    index: int
    category: int
    reason: str  # no evidence | joined ids | malformed id | id not in the conversation
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    name: str  # the file's stem: the actor of its memories
    speakers: tuple[str, str]
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    skipped: tuple[Skipped, ...]
    left_out: int  # questions of LEFT_OUT_CATEGORIES (or of no known category)


def content(turn: Turn) -> str:
    """The memory of one dialog turn: its session's date, the speaker and the text, and the
    photo's caption when the turn shares one."""
    text = f"[{turn.date}] {turn.speaker}: {turn.text}"
    if turn.caption:
        text += f" (shares a photo: {turn.caption})"
    return text


def _evidence_problem(evidence: Sequence[Any], known: set[str]) -> str | None:
    if not evidence:
        return "no evidence"
    for item in evidence:
        if not isinstance(item, str):
            return "malformed id"
        if re.search(r"[\s;,]", item.strip()):
            return "joined ids"
        if not _DIA_ID.fullmatch(item.strip()):
            return "malformed id"
    if any(item.strip() not in known for item in evidence):
        return "id not in the conversation"
    return None


def parse(name: str, data: Mapping[str, Any]) -> Conversation:
    """One conversation from its JSON object; ``name`` names it (and its actor)."""
    sessions = sorted(
        (int(m.group(1)), key)
        for key in data
        if (m := _SESSION.fullmatch(key)) and isinstance(data[key], list)
    )
    turns: list[Turn] = []
    for number, key in sessions:
        date = str(data.get(f"{key}_date_time", "")).strip()
        for raw in data[key]:
            caption = raw.get("blip_caption")
            turns.append(
                Turn(
                    dia_id=str(raw["dia_id"]).strip(),
                    session=number,
                    date=date,
                    speaker=str(raw["speaker"]),
                    text=str(raw["text"]),
                    caption=str(caption) if caption else None,
                )
            )
    ids = [t.dia_id for t in turns]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: a dia_id names two turns")
    known = set(ids)
    questions: list[Question] = []
    skipped: list[Skipped] = []
    left_out = 0
    for index, qa in enumerate(data.get("qa", [])):
        category = qa.get("category")
        if category not in CATEGORIES:
            left_out += 1
            continue
        evidence = qa.get("evidence") or []
        problem = _evidence_problem(evidence, known)
        if problem is not None:
            kept = tuple(str(e) for e in evidence)
            skipped.append(Skipped(name, index, category, problem, kept))
            continue
        questions.append(
            Question(
                conversation=name,
                index=index,
                question=str(qa["question"]),
                category=category,
                evidence=tuple(dict.fromkeys(e.strip() for e in evidence)),
            )
        )
    return Conversation(
        name=name,
        speakers=(str(data["speaker_a"]), str(data["speaker_b"])),
        turns=tuple(turns),
        questions=tuple(questions),
        skipped=tuple(skipped),
        left_out=left_out,
    )


def load(directory: Path) -> list[Conversation]:
    """Every ``*.json`` of ``directory`` that is a conversation (has ``qa`` and sessions), in
    name order."""
    conversations = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "qa" in data and any(_SESSION.fullmatch(k) for k in data):
            conversations.append(parse(path.stem, data))
    if not conversations:
        raise ValueError(f"{directory}: no conversation files (*.json with qa and sessions)")
    return conversations


# --- metrics --------------------------------------------------------------------------------


def any_at(found: Sequence[str], relevant: Iterable[str], k: int) -> bool:
    """Some relevant id is in the first k found."""
    top = set(found[:k])
    return any(r in top for r in relevant)


def all_at(found: Sequence[str], relevant: Iterable[str], k: int) -> bool:
    """Every relevant id is in the first k found."""
    top = set(found[:k])
    return all(r in top for r in relevant)


METRICS: dict[str, Any] = {
    "any@5": lambda f, r: any_at(f, r, 5),
    "any@10": lambda f, r: any_at(f, r, 10),
    "all@5": lambda f, r: all_at(f, r, 5),
}


def score(
    results: Sequence[tuple[int, Sequence[str], Sequence[str]]],
) -> dict[str, Any]:
    """Per category and overall: the count of questions and, per metric, the share of hits.
    ``results`` are (category, found ids best first, relevant ids)."""
    groups: dict[str, list[tuple[Sequence[str], Sequence[str]]]] = {"overall": []}
    for category, found, relevant in results:
        groups["overall"].append((found, relevant))
        groups.setdefault(CATEGORIES[category], []).append((found, relevant))
    out: dict[str, Any] = {}
    for label in ["overall", *(CATEGORIES[c] for c in sorted(CATEGORIES))]:
        rows = groups.get(label, [])
        entry: dict[str, Any] = {"questions": len(rows)}
        for metric, hit in METRICS.items():
            hits = sum(1 for f, r in rows if hit(f, r))
            entry[metric] = round(hits / len(rows), 4) if rows else None
            entry[f"{metric}_hits"] = hits
        out[label] = entry
    return out


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K, limit: int = 10) -> list[str]:
    """Reciprocal-rank fusion with equal weights: each id scores the sum of 1 / (k + rank) over
    the rankings that hold it (rank 1 first); best first, ties by the first ranking that reached
    the id (then its rank there)."""
    scores: dict[str, float] = {}
    first_seen: dict[str, tuple[int, int]] = {}
    for which, ranking in enumerate(rankings):
        for rank, doc in enumerate(ranking, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
            first_seen.setdefault(doc, (rank, which))
    ordered = sorted(scores, key=lambda d: (-scores[d], first_seen[d]))
    return ordered[:limit]


def tokens(text: str, stop: frozenset[str] = frozenset()) -> list[str]:
    """BM25's tokens: the lowercase words (``\\w+``) of a text, less the ``stop`` words."""
    return [w for w in _WORD.findall(text.lower()) if w not in stop]


def latency(seconds: Sequence[float]) -> dict[str, Any]:
    """Mean, median and p95 (nearest rank) in ms of a list of durations in seconds."""
    if not seconds:
        return {"calls": 0, "mean_ms": None, "p50_ms": None, "p95_ms": None}
    ordered = sorted(seconds)
    n = len(ordered)

    def pct(p: float) -> float:
        return ordered[min(n - 1, max(0, math.ceil(p * n) - 1))] * 1000

    return {
        "calls": n,
        "mean_ms": round(sum(ordered) / n * 1000, 3),
        "p50_ms": round(pct(0.50), 3),
        "p95_ms": round(pct(0.95), 3),
    }
