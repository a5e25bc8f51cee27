"""The CLI worker's decisions and the events table, without a server (issue 10, item 4-5)."""

from __future__ import annotations

import pytest

from aidb_memory.ops.events import Counts, as_json, table, tally
from aidb_memory.ops.worker import RETRY_MAX_S, classify, retry_delay


@pytest.mark.parametrize(
    ("sqlstate", "lost", "kind"),
    [
        (None, True, "lost"),  # the socket closed under a CALL
        ("57014", True, "lost"),  # whatever it said, the connection is gone
        ("57P01", False, "lost"),  # terminated by an administrator, server shutting down
        ("57P02", False, "lost"),
        ("08006", False, "lost"),
        ("57014", False, "cancelled"),
        ("42501", False, "config"),  # not a member of aidb_workers
        ("42883", False, "config"),  # not installed, or older than the CLI
        ("3F000", False, "config"),
        ("22023", False, "config"),  # an option the server refuses
        ("40P01", False, "failed"),
        ("XX000", False, "failed"),
        (None, False, "failed"),
    ],
)
def test_classify(sqlstate: str | None, lost: bool, kind: str) -> None:
    assert classify(sqlstate, lost) == kind


def test_retry_delay_doubles_and_is_capped() -> None:
    assert [retry_delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert retry_delay(100) == RETRY_MAX_S
    assert retry_delay(0) == 0.5


def test_tally_and_table() -> None:
    counts = tally(
        [
            ("b", "extraction", "failed", 2),
            ("b", "compaction", "processed", 3),
            ("a", "extraction", "processed", 10),
            ("b", "extraction", "accepted", 1),
        ]
    )
    assert counts == [
        Counts("a", "extraction", {"processed": 10}),
        Counts("b", "extraction", {"failed": 2, "accepted": 1}),
        Counts("b", "compaction", {"processed": 3}),
    ]
    assert table(counts) == [
        "namespace  kind        accepted  processing  processed  failed  skipped",
        "a          extraction         0           0         10       0        0",
        "b          extraction         1           0          0       2        0",
        "b          compaction         0           0          3       0        0",
    ]
    assert as_json(counts) == {
        "a": {"extraction": {"processed": 10}},
        "b": {"extraction": {"failed": 2, "accepted": 1}, "compaction": {"processed": 3}},
    }
    assert table([]) == ["namespace  kind  accepted  processing  processed  failed  skipped"]
