"""``python -m aidb_memory.citus``: the path operators ran before the module moved to
``aidb_memory.install.citus`` (issue 28), kept so that their scripts keep working."""

from __future__ import annotations

from aidb_memory.install.citus import main

if __name__ == "__main__":
    raise SystemExit(main())
