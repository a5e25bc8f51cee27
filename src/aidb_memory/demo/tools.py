"""Scene: the agent calls a tool. The call is stored before it runs (a read leaves the
unfinished round out and says why), then its result, the answer and a thank-you."""

from __future__ import annotations

from aidb_memory.demo.context import Context


def scene(ctx: Context) -> None:
    page, app = ctx.page, ctx.app
    page.heading("The agent calls a tool")
    page.say(
        """
        The model answers with a tool call (an assistant turn with tool_calls and no content,
        in OpenAI's format). The application stores it before running the tool.
        """
    )
    page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => '[
            {"role": "assistant", "content": null, "meta": {"sequence_id": "s-02"},
             "tool_calls": [{"id": "call_renewal_1", "type": "function",
                             "function": {"name": "lookup_renewal_history",
                                          "arguments": "{\\"account\\": \\"alice\\"}"}}]}
          ]'::jsonb,
          session_id      => 'conv-738949',
          idempotency_key => 'conv-738949-turn-002'
        );
        """,
    )
    page.say(
        """
        Until its result is stored, the call is history that no model accepts, so a read leaves
        the unfinished round out and says why:
        """
    )
    page.run(
        app,
        """
        SELECT jsonb_path_query_array(items, '$[*].seq') AS seqs, warnings
        FROM aidb_memory.session_get(
          namespace  => 'helpdesk_namespace',
          actor_id   => 'alice',
          session_id => 'conv-738949'
        );
        """,
    )

    page.heading("The tool result, the answer, and a thank-you")
    page.say(
        """
        The tool result answers the call by its tool_call_id; the call, its result and the answer
        built on it share sequence_id s-02: one reasoning round, which reads keep whole.
        """
    )
    page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => '[
            {"role": "tool", "tool_call_id": "call_renewal_1", "meta": {"sequence_id": "s-02"},
             "content": "renewed 2025-03-01, plan pro, discount SAVE20 not applied"},
            {"role": "assistant", "meta": {"sequence_id": "s-02"},
             "content": "SAVE20 was dropped at your March renewal; I reapplied it."}
          ]'::jsonb,
          session_id      => 'conv-738949',
          idempotency_key => 'conv-738949-turn-003'
        );
        """,
    )
    page.run(
        app,
        """
        SELECT aidb_memory.add(
          namespace       => 'helpdesk_namespace',
          actor_id        => 'alice',
          turns           => '[
            {"role": "user", "content": "great, thanks!", "meta": {"sequence_id": "s-03"}},
            {"role": "assistant", "content": "You are welcome.", "meta": {"sequence_id": "s-03"}}
          ]'::jsonb,
          session_id      => 'conv-738949',
          idempotency_key => 'conv-738949-turn-004'
        );
        """,
    )
