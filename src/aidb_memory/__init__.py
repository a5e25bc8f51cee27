"""aidb_memory: agent memory that lives inside PostgreSQL. This package installs and runs it."""

__version__ = "0.2.0"
