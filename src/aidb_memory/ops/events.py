"""``aidb-memory events``: the queue at a glance, and failed events put back in it.

``list`` counts events by status per namespace and kind (``extraction``: the long-term-memory
event of an add; ``compaction``: a task for the worker to summarize a session ahead of its
reads, issue 13), from the ``events`` and ``namespaces`` views,
which admins and workers may read); ``retry`` calls ``aidb_memory.events_retry`` (admins), which
puts failed events back in the queue with attempts reset and wakes the workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg

STATUSES = ("accepted", "processing", "processed", "failed", "skipped")
KINDS = ("extraction", "compaction")

_COUNTS = """
-- spans actors: admins' and workers' counts of the queue per namespace
SELECT n.name, e.kind, e.status, count(*)
FROM aidb_memory.events AS e
JOIN aidb_memory.namespaces AS n ON n.id = e.namespace_id
WHERE %(namespace)s::text IS NULL OR n.name = %(namespace)s::text
GROUP BY n.name, e.kind, e.status
"""
_RETRY = "SELECT aidb_memory.events_retry(%s::text, %s::text, %s::timestamptz)"


@dataclass
class Counts:
    """Events of one namespace and kind by status."""

    namespace: str
    kind: str = "extraction"
    by_status: dict[str, int] = field(default_factory=dict)


def tally(rows: Iterable[tuple[str, str, str, int]]) -> list[Counts]:
    """(namespace, kind, status, count) rows as one Counts per namespace and kind, by name
    (extraction first)."""
    out: dict[tuple[str, str], Counts] = {}
    for name, kind, status, n in rows:
        out.setdefault((name, kind), Counts(name, kind)).by_status[status] = int(n)

    def order(key: tuple[str, str]) -> tuple[str, int, str]:
        name, kind = key
        return name, KINDS.index(kind) if kind in KINDS else len(KINDS), kind

    return [out[key] for key in sorted(out, key=order)]


def as_json(counts: list[Counts]) -> dict[str, dict[str, dict[str, int]]]:
    """{namespace: {kind: {status: count}}}."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for c in counts:
        out.setdefault(c.namespace, {})[c.kind] = c.by_status
    return out


def table(counts: list[Counts]) -> list[str]:
    """Aligned lines: a header, then one line per namespace and kind (every status, 0 when
    none)."""
    header = ["namespace", "kind", *STATUSES]
    body = [[c.namespace, c.kind, *(str(c.by_status.get(s, 0)) for s in STATUSES)] for c in counts]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = []
    for row in [header, *body]:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])] + [
            v.rjust(w) for v, w in zip(row[2:], widths[2:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def list_counts(
    conn: psycopg.Connection[tuple[object, ...]], namespace: str | None
) -> list[Counts]:
    """Counts by status of each namespace (only ``namespace``, when given) that has events."""
    rows = conn.execute(_COUNTS, {"namespace": namespace}).fetchall()
    return tally((str(r[0]), str(r[1]), str(r[2]), int(str(r[3]))) for r in rows)


def retry(
    conn: psycopg.Connection[tuple[object, ...]],
    namespace: str,
    actor_id: str | None,
    failed_since: str | None,
) -> int:
    """Put failed events back in the queue; how many."""
    row = conn.execute(_RETRY, (namespace, actor_id, failed_since)).fetchone()
    return int(str(row[0])) if row else 0
