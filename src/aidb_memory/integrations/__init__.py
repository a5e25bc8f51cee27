"""Integrations of aidb_memory with agent frameworks, each an optional extra.

Each module imports its framework: ``aidb_memory.integrations.langchain`` needs
``aidb-memory[langchain]``, ``aidb_memory.integrations.langgraph`` ``aidb-memory[langgraph]``.
They are thin layers over :mod:`aidb_memory.client`.
"""
