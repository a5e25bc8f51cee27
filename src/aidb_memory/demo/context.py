"""What the demo's scenes share: the page they print on, the server and its connections, the
model endpoint of the environment, and the few names and results that pass from scene to scene."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import psycopg

from aidb_memory.demo.page import Connection, Page
from aidb_memory.throwaway import ThrowawayServer

APP_ROLE = "helpdesk_app"
MODEL = "helpdesk_llm"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


@dataclass(frozen=True)
class Endpoint:
    """The OpenAI-compatible endpoint the demo's environment names."""

    base_url: str
    model: str
    api_key: str | None  # never printed

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoint | None:
        """The endpoint of ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` (``OPENAI_MODEL``), or None
        when neither is set (an empty value counts as unset)."""
        key = env.get("OPENAI_API_KEY", "").strip() or None
        base_url = env.get("OPENAI_BASE_URL", "").strip()
        if key is None and not base_url:
            return None
        model = env.get("OPENAI_MODEL", "").strip() or DEFAULT_OPENAI_MODEL
        return cls(base_url or DEFAULT_BASE_URL, model, key)


@dataclass
class Context:
    """What every scene is given. ``admin`` is the superuser's connection to the database demo;
    ``closing`` closes what a scene opens for the rest of the story when the story ends."""

    page: Page
    server: ThrowawayServer
    admin: Connection
    endpoint: Endpoint | None
    closing: ExitStack
    # Why alice may have no memories, as the extraction scene found it; the memories scene says it.
    why_no_memories: str = "the extraction worker has not run"

    @functools.cached_property
    def app(self) -> Connection:
        """The application's connection, as APP_ROLE: opened at its first use, since the
        namespace scene creates that role."""
        conn = psycopg.connect(self.server.dsn("demo", APP_ROLE), autocommit=True)
        return self.closing.enter_context(conn)
