"""sync_client.py is what async_client.py generates, and the rules that generate it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aidb_memory.client import _async_to_sync as generator
from aidb_memory.client._async_to_sync import GenerateError, generate, to_sync


def test_sync_client_is_what_async_client_generates() -> None:
    # A hand edit of sync_client.py, or an edit of async_client.py not carried over, fails here.
    assert generate() == generator.TARGET.read_text(encoding="utf-8"), (
        "sync_client.py is stale: edit async_client.py, then run "
        "python -m aidb_memory.client._async_to_sync"
    )


def test_check_says_stale_and_a_run_rewrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "sync_client.py"
    shutil.copy(generator.TARGET, target)
    target.write_text(target.read_text(encoding="utf-8") + "# a hand edit\n", encoding="utf-8")
    monkeypatch.setattr(generator, "TARGET", target)
    assert generator.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert target.read_text(encoding="utf-8").endswith("# a hand edit\n")
    assert generator.main([]) == 0
    assert target.read_text(encoding="utf-8") == generate()
    assert generator.main(["--check"]) == 0


SOURCE = '''\
"""An async module, :class:`AsyncMemory`."""

# How this file is made.

from contextlib import asynccontextmanager

if True:  # ASYNC
    import asyncio

__all__ = ["AsyncMemory"]


class AsyncMemory:
    """AsyncMemory's words."""

    async def __aenter__(self) -> AsyncMemory:
        """The AsyncMemory (AsyncMemoryish is another word)."""
        async with self.lock:  # this comment stays
            value = await self.get(await self.key, "AsyncConnection", "an AsyncConnection")
        if True:  # ASYNC: the reason
            await asyncio.sleep(0)
        else:
            # the sync side's comment
            self.wait(0)
        if False:  # SYNC
            for item in value:
                self.seen(item)
        return self
'''

SYNC = '''\
"""An async module, :class:`Memory`."""

# Generated from async_client.py by `python -m aidb_memory.client._async_to_sync`: do not edit
# this file, edit that one and run this command (tests/unit/test_async_to_sync.py checks it).

from contextlib import contextmanager

__all__ = ["Memory"]


class Memory:
    """Memory's words."""

    def __enter__(self) -> Memory:
        """The Memory (AsyncMemoryish is another word)."""
        with self.lock:  # this comment stays
            value = self.get(self.key, "Connection", "an AsyncConnection")
        # the sync side's comment
        self.wait(0)
        for item in value:
            self.seen(item)
        return self
'''


def test_the_rules() -> None:
    # async/await go, NAMES are renamed in code, in a string that is just a name and as words
    # in docstrings (not in other strings), and of the marked blocks each client keeps its own.
    assert to_sync(SOURCE, {}) == SYNC


def test_docstrings_replaced_by_qualified_name() -> None:
    docstrings = {"": "A sync module.", "AsyncMemory": "Memory, said otherwise."}
    result = to_sync(SOURCE, docstrings)
    assert result.startswith('"""A sync module."""\n')
    assert '    """Memory, said otherwise."""\n' in result
    with pytest.raises(GenerateError, match="DOCSTRINGS of nothing"):
        to_sync(SOURCE, {"AsyncMemory.gone": "x"})


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("if True:\n    x = 1\n", "without # ASYNC or # SYNC"),
        ("if False:  # ASYNC\n    x = 1\n", "marks an `if True:`"),
        ("if True:  # SYNC\n    x = 1\n", "marks an `if False:`"),
        ("if False:  # SYNC\n    x = 1\nelse:\n    x = 2\n", "has no else"),
        ("if True:  # ASYNC\n    x = 1\nelif y:\n    x = 2\n", "an else, not an elif"),
        ("x = 1  # ASYNC\n", "marks no if block"),
        ("from typing import AsyncGenerator\n", "AsyncGenerator"),
        ("async def f():\n    return [x async for x in y]\n", "async comprehensions"),
        ("import asyncio\n", "asyncio"),
    ],
)
def test_what_it_refuses(source: str, error: str) -> None:
    with pytest.raises(GenerateError, match=error):
        to_sync(source, {})
