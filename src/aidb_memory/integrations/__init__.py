"""Integrations of aidb_memory with agent frameworks, each in its own module and extra.

- :mod:`aidb_memory.integrations.openai_agents`: ``AidbSession``, an OpenAI Agents SDK
  ``Session`` (``pip install 'aidb-memory[agents]'``).
- :mod:`aidb_memory.integrations.langchain`: ``AidbChatMessageHistory``, a LangChain
  ``BaseChatMessageHistory`` (``aidb-memory[langchain]``).
- :mod:`aidb_memory.integrations.langgraph`: ``AidbStore``, a LangGraph ``BaseStore`` over
  long-term memories (``aidb-memory[langgraph]``).

Importing this package imports no framework; each module imports its own. They are thin layers
over :mod:`aidb_memory.client`.
"""
