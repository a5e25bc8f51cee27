"""Scene: the history read back: session_get without a budget, with a small one (whole rounds
only, compaction skipped without a model), and as an OpenAI messages array (session_messages)."""

from __future__ import annotations

from aidb_memory.demo.context import Context


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("Reading the history back: session_get without a budget")
    page.say(
        """
        Everything, in order. kind defaults from the role (tool_call for an assistant turn with
        tool calls, whose content is NULL).
        """
    )
    page.run(
        app,
        """
        SELECT ord, item->>'role' AS role, item->>'kind' AS kind, item->>'content' AS content
        FROM aidb_memory.session_get(
               namespace  => 'helpdesk_namespace',
               actor_id   => 'alice',
               session_id => 'conv-738949'
             ) s,
             jsonb_array_elements(s.items) WITH ORDINALITY AS t(item, ord);
        """,
    )

    page.heading("session_get with a small budget")
    page.say(
        """
        limit_chars => 100 keeps the newest whole rounds that fit in 100 characters (content plus
        tool-call arguments). The tool round (seqs 3 to 5) does not fit whole, so it is left out
        with everything older: only the thank-you round remains. overflow_chars counts what was
        left out.
        """
    )
    page.run(
        app,
        """
        SELECT jsonb_path_query_array(items, '$[*].seq') AS seqs,
               overflow_chars, compacted_entries, warnings
        FROM aidb_memory.session_get(
               namespace   => 'helpdesk_namespace',
               actor_id    => 'alice',
               session_id  => 'conv-738949',
               limit_chars => 100
             );
        """,
    )
    page.say(
        """
        No model is configured (the namespace's model_spec has no llm and no fallback_model was
        passed), so compaction is skipped: the read returns the ordinary budgeted result, and
        warnings says why. Compaction comes with a model: with one, the oldest three quarters of
        the history become one summary at the start of items, as a later step shows.
        """
    )

    page.heading("The same history as an OpenAI messages array: session_messages")
    page.say(
        """
        Ready for chat.completions.create: the tool call and its result in OpenAI's format.
        """
    )
    page.run(
        app,
        """
        SELECT aidb_memory.session_messages(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738949'
        );
        """,
        json_result=True,
    )
