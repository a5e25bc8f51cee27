"""The pure parts of `make bench-quality` (bench/locomo.py): loading a conversation and its
questions, malformed evidence, the memory content of a turn, any@k / all@k and reciprocal-rank
fusion. On a tiny conversation written here (never the evaluation data); no database, no model,
and nothing here imports torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import locomo

sys.path.pop(0)


def conversation() -> dict[str, Any]:
    return {
        "speaker_a": "Ada",
        "speaker_b": "Bo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ada", "dia_id": "D1:1", "text": "I adopted a cat."},
            {
                "speaker": "Bo",
                "dia_id": "D1:2",
                "text": "Look at mine!",
                "blip_caption": "a photo of a dog on a sofa",
                "img_url": ["https://example.invalid/x.jpg"],
            },
        ],
        "session_2_date_time": "10:00 am on 9 June, 2023",
        "session_2": [
            {"speaker": "Bo", "dia_id": "D2:1", "text": "How is the cat?"},
            {"speaker": "Ada", "dia_id": "D2:2", "text": "She loves the garden."},
        ],
        # Not sessions: ignored.
        "session_1_summary": "Ada adopted a cat.",
        "events_session_1": {"Ada": ["adopted a cat"]},
        "qa": [
            {"question": "What pet did Ada adopt?", "answer": "a cat", "evidence": ["D1:1"],
             "category": 4},
            {"question": "When was the garden?", "answer": "June 2023",
             "evidence": ["D2:2", "D1:1", "D2:2"], "category": 2},
            {"question": "Adversarial?", "adversarial_answer": "x", "evidence": ["D1:1"],
             "category": 5},
            {"question": "No evidence", "answer": "x", "evidence": [], "category": 1},
            {"question": "Joined", "answer": "x", "evidence": ["D1:1; D2:1"], "category": 1},
            {"question": "Spaces", "answer": "x", "evidence": ["D1:1 D2:2"], "category": 3},
            {"question": "Bare D", "answer": "x", "evidence": ["D"], "category": 1},
            {"question": "Colons", "answer": "x", "evidence": ["D1:1", "D:1:2"], "category": 4},
            {"question": "Unknown", "answer": "x", "evidence": ["D30:05"], "category": 2},
            {"question": "Zero-padded", "answer": "x", "evidence": ["D1:01"], "category": 2},
        ],
    }  # fmt: skip


def test_turns_are_read_in_session_order_with_their_date_and_caption() -> None:
    conv = locomo.parse("c1", conversation())
    assert conv.name == "c1"
    assert conv.speakers == ("Ada", "Bo")
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D2:1", "D2:2"]
    assert conv.turns[1].caption == "a photo of a dog on a sofa"
    assert conv.turns[0].caption is None
    assert conv.turns[2].date == "10:00 am on 9 June, 2023"
    assert conv.turns[2].session == 2


def test_sessions_sort_by_number_not_by_name() -> None:
    data = conversation()
    data["session_10_date_time"] = "later"
    data["session_10"] = [{"speaker": "Ada", "dia_id": "D10:1", "text": "Ten."}]
    conv = locomo.parse("c1", data)
    assert [t.session for t in conv.turns] == [1, 1, 2, 2, 10]


def test_the_content_of_a_memory_is_the_turn_with_its_date_speaker_and_photo() -> None:
    turns = locomo.parse("c1", conversation()).turns
    assert locomo.content(turns[0]) == "[1:56 pm on 8 May, 2023] Ada: I adopted a cat."
    assert locomo.content(turns[1]) == (
        "[1:56 pm on 8 May, 2023] Bo: Look at mine! (shares a photo: a photo of a dog on a sofa)"
    )


def test_questions_of_categories_1_to_4_are_kept_and_malformed_evidence_is_skipped() -> None:
    conv = locomo.parse("c1", conversation())
    assert [(q.index, q.category, q.evidence) for q in conv.questions] == [
        (0, 4, ("D1:1",)),
        (1, 2, ("D2:2", "D1:1")),  # a repeated id counts once
    ]
    assert conv.left_out == 1  # category 5
    assert [(s.index, s.reason) for s in conv.skipped] == [
        (3, "no evidence"),
        (4, "joined ids"),
        (5, "joined ids"),
        (6, "malformed id"),
        (7, "malformed id"),
        (8, "id not in the conversation"),
        (9, "id not in the conversation"),
    ]
    assert all(s.conversation == "c1" for s in conv.skipped)


def test_load_reads_every_conversation_file_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text(json.dumps(conversation()))
    (tmp_path / "a.json").write_text(json.dumps(conversation()))
    (tmp_path / "notes.json").write_text(json.dumps({"not": "a conversation"}))
    (tmp_path / "README.md").write_text("not json")
    assert [c.name for c in locomo.load(tmp_path)] == ["a", "b"]
    with pytest.raises(ValueError, match="no conversation files"):
        locomo.load(tmp_path / "missing")


def test_a_dia_id_naming_two_turns_is_refused() -> None:
    data = conversation()
    data["session_2"][0]["dia_id"] = "D1:1"
    with pytest.raises(ValueError, match="two turns"):
        locomo.parse("c1", data)


def test_any_at_k_and_all_at_k() -> None:
    found = ["m3", "m1", "m7", "m2", "m9", "m4"]
    assert locomo.any_at(found, ["m4"], 10)
    assert not locomo.any_at(found, ["m4"], 5)
    assert locomo.any_at(found, ["m8", "m9"], 5)
    assert not locomo.any_at([], ["m1"], 5)
    assert locomo.all_at(found, ["m1", "m9"], 5)
    assert not locomo.all_at(found, ["m1", "m4"], 5)
    assert not locomo.all_at(found, ["m1", "m8"], 10)


def test_score_counts_per_category_and_overall() -> None:
    results = [
        (4, ["a", "b"], ["a"]),  # hit at 1
        (4, ["x", "y", "z", "w", "v", "a"], ["a"]),  # any@10 only
        (2, ["a", "b"], ["a", "b"]),  # all@5
        (1, ["c"], ["a", "c"]),  # any, not all
    ]
    scored = locomo.score(results)
    assert scored["overall"]["questions"] == 4
    assert scored["overall"]["any@5"] == 0.75
    assert scored["overall"]["any@10"] == 1.0
    assert scored["overall"]["all@5"] == 0.5
    assert scored["overall"]["all@5_hits"] == 2
    assert scored["single-hop"] == {
        "questions": 2,
        "any@5": 0.5,
        "any@5_hits": 1,
        "any@10": 1.0,
        "any@10_hits": 2,
        "all@5": 0.5,
        "all@5_hits": 1,
    }
    assert scored["open-domain"]["questions"] == 0
    assert scored["open-domain"]["any@5"] is None
    assert list(scored) == ["overall", "multi-hop", "temporal", "open-domain", "single-hop"]


def test_rrf_sums_reciprocal_ranks_with_k_60() -> None:
    bm25 = ["a", "b", "c"]
    dense = ["c", "d", "a"]
    fused = locomo.rrf([bm25, dense])
    # a: 1/61 + 1/63, c: 1/63 + 1/61 (a tie, a reached first), then b 1/62, d 1/62.
    assert fused == ["a", "c", "b", "d"]
    assert locomo.rrf([bm25, dense], limit=2) == ["a", "c"]
    # One ranking alone keeps its order; an empty one changes nothing.
    assert locomo.rrf([bm25, []]) == bm25
    # k matters: with k = 60, two third places (2/63) beat one first place (1/61); with k = 0
    # they do not (2/3 against 1).
    assert locomo.rrf([["x", "y", "z"], ["w", "v", "z"]], k=60)[0] == "z"
    assert locomo.rrf([["x", "y", "z"], ["w", "v", "z"]], k=0)[:2] == ["x", "w"]


def test_bm25_tokens_are_lowercase_words() -> None:
    assert locomo.tokens("When did Caroline go to the LGBTQ support-group?") == [
        "when", "did", "caroline", "go", "to", "the", "lgbtq", "support", "group",
    ]  # fmt: skip


def test_latency_summary() -> None:
    stats = locomo.latency([0.001 * i for i in range(1, 101)])
    assert stats["calls"] == 100
    assert stats["mean_ms"] == pytest.approx(50.5)
    assert stats["p95_ms"] == pytest.approx(95.0)
    assert stats["p50_ms"] == pytest.approx(50.0)
    assert locomo.latency([])["mean_ms"] is None


def test_the_pure_parts_import_neither_torch_nor_a_baseline() -> None:
    code = (
        "import sys; sys.path.insert(0, 'bench'); import locomo; "
        "bad = {'torch', 'sentence_transformers', 'rank_bm25', 'numpy'} & set(sys.modules); "
        "assert not bad, bad"
    )
    import subprocess

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_bm25_tokens_leave_the_stop_words_out_when_given() -> None:
    stop = frozenset({"the", "to", "did"})
    assert locomo.tokens("Did Ada go to THE garden?", stop) == ["ada", "go", "garden"]
