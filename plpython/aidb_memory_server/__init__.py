"""aidb_memory's server-side Python.

These modules run inside PostgreSQL backends (PL/Python). The installer stores them in
``aidb_memory.runtime_modules``; ``boot.py`` loads them into a backend on its first call and again
after an upgrade. Modules that import ``plpy`` are the thin database layer; the others are pure
logic that the unit tests import directly.
"""
