"""Integrations of aidb_memory with agent frameworks, each in its own module and extra.

- :mod:`aidb_memory.integrations.openai_agents`: :class:`AidbSession`, an OpenAI Agents SDK
  ``Session`` (``pip install 'aidb-memory[agents]'``).

Importing this package imports no framework; each module imports its own.
"""
