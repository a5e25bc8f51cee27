"""``aidb-memory events``: the extraction queue at a glance, and failed events put back in it.

``list`` counts events by status per namespace (from the ``events`` and ``namespaces`` views,
which admins and workers may read); ``retry`` calls ``aidb_memory.events_retry`` (admins), which
puts failed events back in the queue with attempts reset and wakes the workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

STATUSES = ("accepted", "processing", "processed", "failed", "skipped")

_COUNTS = """
SELECT n.name, e.status, count(*)
FROM aidb_memory.events AS e
JOIN aidb_memory.namespaces AS n ON n.id = e.namespace_id
WHERE %(namespace)s::text IS NULL OR n.name = %(namespace)s::text
GROUP BY n.name, e.status
"""
_RETRY = "SELECT aidb_memory.events_retry(%s::text, %s::text, %s::timestamptz)"


@dataclass
class Counts:
    """Events of one namespace by status."""

    namespace: str
    by_status: dict[str, int] = field(default_factory=dict)


def tally(rows: Iterable[tuple[str, str, int]]) -> list[Counts]:
    """(namespace, status, count) rows as one Counts per namespace, by name."""
    out: dict[str, Counts] = {}
    for name, status, n in rows:
        out.setdefault(name, Counts(name)).by_status[status] = int(n)
    return [out[name] for name in sorted(out)]


def table(counts: list[Counts]) -> list[str]:
    """Aligned lines: a header, then one line per namespace (every status, 0 when none)."""
    header = ["namespace", *STATUSES]
    body = [[c.namespace, *(str(c.by_status.get(s, 0)) for s in STATUSES)] for c in counts]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = []
    for row in [header, *body]:
        cells = [row[0].ljust(widths[0])] + [
            v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def list_counts(
    conn: psycopg.Connection[tuple[object, ...]], namespace: str | None
) -> list[Counts]:
    """Counts by status of each namespace (only ``namespace``, when given) that has events."""
    rows = conn.execute(_COUNTS, {"namespace": namespace}).fetchall()
    return tally((str(r[0]), str(r[1]), int(str(r[2]))) for r in rows)


def retry(
    conn: psycopg.Connection[tuple[object, ...]],
    namespace: str,
    actor_id: str | None,
    failed_since: str | None,
) -> int:
    """Put failed events back in the queue; how many."""
    row = conn.execute(_RETRY, (namespace, actor_id, failed_since)).fetchone()
    return int(str(row[0])) if row else 0
