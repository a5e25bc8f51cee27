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
