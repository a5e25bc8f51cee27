"""The distribution key of an actor's rows (issue 15, docs/scaling.md).

Every per-actor table carries ``actor_key``, derived from (namespace name, actor id) by one
definition: the first 8 bytes of SHA-256 of ``"<namespace name>:<actor id>"`` (UTF-8) as a signed
big-endian bigint. A namespace's name never changes, and every API call passes it with the actor:
every call knows its key before it reads anything. SQL has the function as
``aidb_memory.actor_key(text, text)`` (sql/05_keys.sql); this is the same function for the server
code, which passes the key to its statements as a parameter, so that a distributed PostgreSQL
routes each of them to the one shard holding the actor (a parameter, not an expression it would
have to evaluate first). tests/db/test_actor_key.py holds the two equal.
"""

from __future__ import annotations

try:  # the builtin module: hashlib would load OpenSSL (~2 ms) on a read's first call
    from _sha256 import sha256  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Python 3.12 renamed it
    from hashlib import sha256


def actor_key(namespace: str, actor_id: str) -> int:
    """The ``actor_key`` of (namespace name, actor id), as ``aidb_memory.actor_key`` computes it."""
    digest = sha256(f"{namespace}:{actor_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
