"""What the installation knows about itself (for ``doctor`` and admins)."""

from __future__ import annotations

import json
import sys

from aidb_memory_server import runtime


def runtime_info() -> str:
    """The loaded code generation, the server's Python and its package directory, as JSON."""
    rt = runtime.current()
    return json.dumps(
        {
            "generation": rt.generation,
            "version": rt.settings.get("version"),
            "python": ".".join(map(str, sys.version_info[:3])),
            "server_pythonpath": rt.settings.get("server_pythonpath"),
        }
    )
