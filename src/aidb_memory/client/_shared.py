"""What :class:`Memory` and :class:`AsyncMemory` (and the integrations) use alike and that does no
I/O: recognizing a pool, logging a read's warnings.

Kept out of async_client.py so that sync_client.py, generated from it, does not define them a
second time.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

__all__ = ["is_pool", "log_read_warnings", "logger"]

logger = logging.getLogger("aidb_memory.client")


def log_read_warnings(
    function: str, namespace: str, actor_id: str, session_id: str, warnings: Sequence[str]
) -> None:
    """Log a read's warnings on the ``aidb_memory.client`` logger (warning level)."""
    for code in warnings:
        logger.warning(
            "aidb_memory.%s: %s (namespace %r, actor %r, session %r)",
            function,
            code,
            namespace,
            actor_id,
            session_id,
        )


def is_pool(source: object, class_name: str) -> bool:
    """Whether ``source`` is a psycopg_pool pool of that class (psycopg_pool is imported only
    if the caller has imported it already: it is an optional dependency)."""
    module = sys.modules.get("psycopg_pool")
    cls = getattr(module, class_name, None) if module is not None else None
    return cls is not None and isinstance(source, cls)
