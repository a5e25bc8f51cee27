"""Integrations of aidb_memory with agent frameworks and hosts, each behind its own extra."""
