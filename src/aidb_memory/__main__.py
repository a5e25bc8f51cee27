"""``python -m aidb_memory`` is the ``aidb-memory`` command."""

import sys

from aidb_memory.cli import main

sys.exit(main())
