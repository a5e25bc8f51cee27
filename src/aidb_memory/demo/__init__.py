"""``make demo`` / ``aidb-memory demo``: the walkthrough of SPEC §9 on a throwaway server.

It tells the help-desk story of the AIDB sessions page (``seeds/003``) as a person reads it, top
to bottom: each step says what happens, shows the SQL it runs (exactly as it runs) and prints the
result. The namespace starts without a model, so the first budgeted read skips compaction and says
why; later an admin gives it one and a long conversation is compacted. That model is the
OpenAI-compatible endpoint of ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` when
either of the first two is set (the key goes into the database with ``set_secret`` and is never
printed), else the builtin extractive summarizer, which is not a model, and the demo says so.

Long-term memory follows (extraction is off until then, so the earlier conversations stay out of
it): alice and bob mention lasting facts, a worker role runs the extraction worker
(``process_events``) once, and the demo shows the events' statuses, ``status``,
``list_memories``, ``search`` (an exact word and a misspelled one), a direct ``remember`` that
``search`` finds at once, and ``forget`` with its audit row. With the builtin summarizer, which
is not a language model, extraction is verbatim (``extraction_mode`` ``auto``, the default): the
worker stores what the user said, as said, with no model and no network, and the demo says so
(``VERBATIM_LINE``). With an endpoint the model extracts the facts; when it fails or answers
malformed JSON, the events are retried and failed, and the demo shows their ``last_error`` and
goes on.

The story is told in scenes, one module each (``install``, ``namespace``, ``sessions``,
``tools``, ``reads``, ``handoff``, ``undo``, ``model``, ``compaction``, ``extraction``,
``memories``, ``remember``, ``forget``, ``listing``): a function ``scene(ctx)`` that prints one
or a few numbered steps. ``runner.SCENES`` puts them in order; ``context.Context`` is what they
share (the page they print on, the connections, the endpoint); ``page`` prints.
"""

from aidb_memory.demo.extraction import ALICE_FACTS as _ALICE_FACTS
from aidb_memory.demo.extraction import BOB_FACTS as _BOB
from aidb_memory.demo.extraction import VERBATIM_LINE
from aidb_memory.demo.model import BUILTIN_LINE
from aidb_memory.demo.page import pretty_json
from aidb_memory.demo.runner import main

# main is the CLI's entry point; the rest is what tests/db/test_demo.py reads of the story.
__all__ = ["BUILTIN_LINE", "VERBATIM_LINE", "_ALICE_FACTS", "_BOB", "main", "pretty_json"]
