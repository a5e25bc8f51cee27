"""Scene: an admin gives the namespace a model for compaction: the endpoint of the environment
(its key stored with set_secret, never printed), else the builtin extractive summarizer; and
turns extraction on."""

from __future__ import annotations

import json
from typing import Any

from aidb_memory.demo.context import MODEL, Context

SECRET = "helpdesk_openai_key"
BUILTIN_LINE = (
    "no OPENAI_API_KEY/OPENAI_BASE_URL: using the builtin extractive summarizer (not a model)"
)


def _sql_json(value: dict[str, Any], indent: int) -> str:
    """A JSON object as a SQL string literal, one key per line (continuation lines indented by
    ``indent`` spaces)."""
    members = [json.dumps({k: v})[1:-1] for k, v in value.items()]
    text = "{" + (",\n" + " " * (indent + 2)).join(members) + "}"
    return "'" + text.replace("'", "''") + "'"


def scene(ctx: Context) -> None:
    page, admin, endpoint = ctx.page, ctx.admin, ctx.endpoint
    page.heading("A model for compaction (as an admin)")
    if endpoint is None:
        page.say(
            f"""
            {BUILTIN_LINE}. It quotes whole sentences of the turns (the first goal, the latest
            state, decisions, numbers, names): deterministic and offline, and its output says what
            it is. Set OPENAI_API_KEY, or OPENAI_BASE_URL for another OpenAI-compatible endpoint
            (and OPENAI_MODEL), to see a model summarize instead.
            """
        )
        page.run(
            admin,
            f"""
            SELECT aidb_memory.create_model(
              name     => '{MODEL}',
              provider => 'builtin',
              options  => '{{"kind": "extractive"}}'
            ) AS model_id;
            """,
        )
    else:
        page.say(
            f"""
            {"OPENAI_API_KEY" if endpoint.api_key else "OPENAI_BASE_URL"} is set: using the
            OpenAI-compatible endpoint {endpoint.base_url} with the model {endpoint.model}
            (OPENAI_MODEL). Models are registered by admins only, so a caller can never make the
            server contact a URL of its choosing.
            """
        )
        options: dict[str, Any] = {"model": endpoint.model, "base_url": endpoint.base_url}
        if endpoint.api_key:
            page.say(
                """
                The key goes into the database with set_secret, where no API role can read it
                and no message shows it; $1 is the value of OPENAI_API_KEY (not shown), and $2
                the endpoint above: the only one the key may ever be sent to:
                """
            )
            page.run(
                admin,
                f"SELECT aidb_memory.set_secret(name => '{SECRET}', value => $1, "
                "endpoints => ARRAY[$2]);",
                (endpoint.api_key, endpoint.base_url),
            )
            options["api_key_secret"] = SECRET
        options |= {"timeout_s": 30, "max_retries": 1}
        # Built line by line: the options literal spans lines of its own indentation.
        create = (
            "SELECT aidb_memory.create_model(\n"
            f"  name     => '{MODEL}',\n"
            "  provider => 'openai',\n"
            f"  options  => {_sql_json(options, len('  options  => '))}\n"
            ") AS model_id;"
        )
        page.run(admin, create)
    if endpoint is None:
        later = """
            The builtin summarizer is not a language model, though: it cannot extract facts, so
            with extraction_mode auto (the default) the worker stores what the user says, as
            said, with no model at all, as a later step shows.
            """
    else:
        later = "Extraction into long-term memory uses it too; a later step runs the worker."
    page.say(
        """
        The namespace's model_spec names it as its llm, the model that compaction uses. config
        turns extraction on (its default): from now on each add's event is accepted for the
        extraction worker.
        """
        + " ".join(later.split())
    )
    page.run(
        admin,
        f"""
        SELECT name, model_spec, config
        FROM aidb_memory.namespace_update(
          name       => 'helpdesk_namespace',
          model_spec => '{{"llm": "{MODEL}"}}',
          config     => '{{"extraction": true}}'
        );
        """,
    )
