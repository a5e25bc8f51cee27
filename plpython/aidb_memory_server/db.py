"""The thin database layer: statements prepared once per connection and code generation.

Plans live in a module-level dict, so they are dropped with the module when an upgrade loads a
new code generation; PostgreSQL itself re-validates a saved plan after DDL on what it touches.
"""

from __future__ import annotations

import plpy

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a first call ~4 ms (docs/architecture.md, "Loading the code")
    from collections.abc import Sequence
    from typing import Any

_plans: dict[str, Any] = {}


def execute(sql: str, types: Sequence[str] = (), params: Sequence[Any] = ()) -> Any:
    """Run ``sql`` through a plan prepared on first use in this connection."""
    plan = _plans.get(sql)
    if plan is None:
        plan = plpy.prepare(sql, list(types))
        _plans[sql] = plan
    return plpy.execute(plan, list(params))


def notice(message: str) -> None:
    """Send a NOTICE to the client."""
    plpy.notice(message)


def clock() -> str:
    """The wall clock now, as ``clock_timestamp()`` reads it (ISO 8601, UTC), for a statement to
    take as a ``timestamptz`` parameter: Citus refuses a VOLATILE function in an UPDATE of a
    distributed or reference table, and any non-IMMUTABLE one in ON CONFLICT DO UPDATE SET
    (docs/scaling.md), so a write that must record the time passes it in, on one server too."""
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat()
