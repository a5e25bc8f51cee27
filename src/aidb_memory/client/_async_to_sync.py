"""Write sync_client.py (:class:`Memory`) from async_client.py (:class:`AsyncMemory`).

    python -m aidb_memory.client._async_to_sync          # rewrite sync_client.py
    python -m aidb_memory.client._async_to_sync --check  # exit 1 if it is not what this writes

The two clients are the same calls, one awaited: a call is written once, in async_client.py,
and this turns it into the sync one (as psycopg makes its sync classes from its async ones):

- ``async def``, ``async with`` and ``async for`` lose ``async``; ``await x`` becomes ``x``;
- each name of :data:`NAMES` becomes its sync name: in the code, in a string that is just that
  name (``is_pool(source, "AsyncConnectionPool")``, ``__all__``) and as a word in docstrings;
- an ``if True:  # ASYNC`` block is AsyncMemory's alone: Memory gets its ``else:`` part, if it
  has one, in its place; an ``if False:  # SYNC`` block is Memory's alone;
- :data:`DOCSTRINGS` replaces the docstrings that say more than the renamed async ones;

and ruff formats the result. The rewrite is a list of edits of the source text at the places
``ast`` finds, so that comments and layout stay as written; a name that still says async
afterwards stops it (add it to :data:`NAMES`). tests/unit/test_async_to_sync.py fails when
sync_client.py is not what this writes.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DOCSTRINGS", "NAMES", "SOURCE", "TARGET", "generate", "main", "to_sync"]

SOURCE = Path(__file__).with_name("async_client.py")
TARGET = Path(__file__).with_name("sync_client.py")

# The async names and the sync ones.
NAMES = {
    "AsyncMemory": "Memory",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}

# Memory's own docstrings, by the qualified name in async_client.py ("" for the module's): they
# say what AsyncMemory's say by referring to them.
DOCSTRINGS = {
    "": "The synchronous client, :class:`Memory`.",
    "AsyncMemory": """aidb_memory over psycopg 3, synchronous.

    ``Memory(source)``: ``source`` is a DSN (the client opens its own autocommit connection and
    closes it in :meth:`close` or at the end of a ``with`` block), a ``psycopg.Connection`` (used
    as it is, in the caller's transaction: never committed, rolled back or closed) or a
    ``psycopg_pool.ConnectionPool`` (a connection borrowed for each call, committed when the call
    succeeds). ``log_warnings=True`` logs the warnings of ``session_get`` on the
    ``aidb_memory.client`` logger; they are on the result either way. Every statement is
    prepared on its connection the first time it runs; ``prepare=False`` turns that off (for a
    pooler in transaction mode that cannot keep prepared statements).

    One method per function of the SQL API, with its parameters' names; errors are
    :class:`~aidb_memory.client.AidbMemoryError` subclasses.
    """,
}

# In the place of the comment that follows the module docstring (how the file is made).
HEADER = """\
# Generated from async_client.py by `python -m aidb_memory.client._async_to_sync`: do not edit
# this file, edit that one and run this command (tests/unit/test_async_to_sync.py checks it).
"""

_ASYNC_ONLY = "# ASYNC"
_SYNC_ONLY = "# SYNC"
_WORDS = re.compile(r"\b(" + "|".join(map(re.escape, NAMES)) + r")\b")


class GenerateError(Exception):
    """async_client.py holds something this cannot turn into sync code."""


class _Text:
    """The source and its positions: ast gives (line, UTF-8 byte column), edits want offsets."""

    def __init__(self, text: str) -> None:
        if "\r" in text:
            raise GenerateError("line ends other than \\n")
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode())

    def start(self, node: ast.expr | ast.stmt | ast.alias) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.expr | ast.stmt | ast.alias) -> int:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return self.offset(node.end_lineno, node.end_col_offset)


class _Rewrite(ast.NodeVisitor):
    """Collects the edits (start, end, new text) that make the sync source of the async one."""

    def __init__(self, text: _Text, comments: dict[int, str], docstrings: dict[str, str]) -> None:
        self.text = text
        self.comments = comments
        self.replacements = docstrings
        self.edits: list[tuple[int, int, str]] = []
        self.scope: list[str] = []
        self.docstring_nodes: set[int] = set()
        self.used_docstrings: set[str] = set()
        self.markers: set[int] = set()

    # --- helpers --------------------------------------------------------------------------------

    def _fail(self, node: ast.expr | ast.stmt, why: str) -> GenerateError:
        return GenerateError(f"async_client.py:{node.lineno}: {why}")

    def _drop_keyword(self, node: ast.stmt | ast.expr, keyword: str) -> None:
        start = self.text.start(node)
        found = re.compile(keyword + r"\s*").match(self.text.text, start)
        if found is None:
            raise self._fail(node, f"expected {keyword!r} here")
        self.edits.append((start, found.end(), ""))

    def _rename_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        if node.name not in NAMES:
            return
        keyword = "class" if isinstance(node, ast.ClassDef) else "def"
        pattern = re.compile(rf"\b{keyword}\s+({re.escape(node.name)})\b")
        found = pattern.search(self.text.text, self.text.start(node))
        if found is None:
            raise self._fail(node, f"cannot find the name {node.name!r}")
        self.edits.append((found.start(1), found.end(1), NAMES[node.name]))

    def _docstring(self, body: Sequence[ast.stmt]) -> None:
        literal = _docstring_of(body)
        if literal is None:
            return
        self.docstring_nodes.add(id(literal))
        name = ".".join(self.scope)
        start, end = self.text.start(literal), self.text.end(literal)
        if name in self.replacements:
            doc = self.replacements[name]
            if '"""' in doc or "\\" in doc:
                raise GenerateError(f'DOCSTRINGS[{name!r}]: no """ nor backslash, please')
            self.edits.append((start, end, f'"""{doc}"""'))
            self.used_docstrings.add(name)
        else:
            old = self.text.text[start:end]
            new = _WORDS.sub(lambda m: NAMES[m.group(1)], old)
            if new != old:
                self.edits.append((start, end, new))

    def _marker(self, node: ast.If) -> str | None:
        """``# ASYNC`` or ``# SYNC`` when the ``if`` is one of the blocks of one client."""
        comment = self.comments.get(node.lineno, "")
        marker = next((m for m in (_ASYNC_ONLY, _SYNC_ONLY) if comment.startswith(m)), None)
        constant = node.test.value if isinstance(node.test, ast.Constant) else None
        if marker is None:
            if isinstance(constant, bool):
                raise self._fail(node, f"if {constant}: without {_ASYNC_ONLY} or {_SYNC_ONLY}")
            return None
        wanted = marker == _ASYNC_ONLY
        if constant is not wanted or not self.text.text.startswith("if", self.text.start(node)):
            raise self._fail(node, f"{marker} marks an `if {wanted}:` (not an elif)")
        if marker == _SYNC_ONLY and node.orelse:
            raise self._fail(node, f"an `if False:  {_SYNC_ONLY}` has no else")
        if node.orelse and self.text.text.startswith("elif", self.text.start(node.orelse[0])):
            raise self._fail(node, f"{marker}: an else, not an elif")
        self.markers.add(node.lineno)
        return marker

    def _line_start(self, lineno: int) -> int:
        return self.text.starts[lineno - 1]

    def _blank(self, lineno: int) -> bool:
        return 0 < lineno <= len(self.text.lines) and not self.text.lines[lineno - 1].strip()

    def header(self, module: ast.Module) -> None:
        """HEADER in the place of the comment lines that follow the module docstring."""
        doc = _docstring_of(module.body)
        first = doc.end_lineno + 1 if doc is not None and doc.end_lineno is not None else 1
        while self._blank(first):
            first += 1
        last = first
        while last <= len(self.text.lines) and self.text.lines[last - 1].startswith("#"):
            last += 1
        if last == first:
            self.edits.append((self._line_start(first), self._line_start(first), HEADER + "\n"))
        else:
            self.edits.append((self._line_start(first), self._line_start(last), HEADER))

    def _keep_block(self, owner: ast.If, first: int, block: list[ast.stmt]) -> None:
        """Lines ``first`` to the end of ``owner``, ``block`` and its comments, one level left,
        in the place of the ``if`` that held them; and the rules applied to ``block``."""
        assert owner.end_lineno is not None
        step = " " * (block[0].col_offset - owner.col_offset)
        for lineno in range(first, owner.end_lineno + 1):
            line = self.text.lines[lineno - 1]
            if line.startswith(step):
                start = self._line_start(lineno)
                self.edits.append((start, start + len(step), ""))
            elif line.strip() and not line.lstrip().startswith("#"):
                raise self._fail(owner, f"line {lineno} is not indented as its block")
        for statement in block:
            self.visit(statement)

    # --- the rules ------------------------------------------------------------------------------

    def visit_Module(self, node: ast.Module) -> None:
        self.header(node)
        self._docstring(node.body)
        self.generic_visit(node)

    def _definition(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if isinstance(node, ast.AsyncFunctionDef):
            self._drop_keyword(node, "async")
        self._rename_def(node)
        self.scope.append(node.name)
        self._docstring(node.body)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._definition(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._definition(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._definition(node)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self._drop_keyword(node, "async")
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._drop_keyword(node, "async")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            raise self._fail(node.target, "async comprehensions are not handled: write a loop")
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self._drop_keyword(node, "await")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        marker = self._marker(node)
        assert node.end_lineno is not None
        if marker is None:
            self.generic_visit(node)
        elif marker == _SYNC_ONLY:
            self.edits.append(
                (self._line_start(node.lineno), self._line_start(node.lineno + 1), "")
            )
            self._keep_block(node, node.lineno + 1, node.body)
        elif node.orelse:
            last = node.body[-1].end_lineno
            assert last is not None
            # the `else:` line: the first after the body's that is not blank nor a comment
            after = last + 1
            while self._blank(after) or self.text.lines[after - 1].lstrip().startswith("#"):
                after += 1
            if not re.match(r"\s*else\s*:", self.text.lines[after - 1]):
                raise self._fail(node, f"line {after}: expected the else: of the {marker} block")
            self.edits.append((self._line_start(node.lineno), self._line_start(after + 1), ""))
            self._keep_block(node, after + 1, node.orelse)
        else:
            start, after = node.lineno, node.end_lineno + 1
            if self._blank(start - 1) and self._blank(after):
                after += 1  # not two blank lines where the block was
            self.edits.append((self._line_start(start), self._line_start(after), ""))

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in NAMES:
            self.edits.append((self.text.start(node), self.text.end(node), NAMES[node.id]))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in NAMES:
            end = self.text.end(node)
            self.edits.append((end - len(node.attr), end, NAMES[node.attr]))
        self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> None:
        if node.name in NAMES:
            start = self.text.start(node)
            self.edits.append((start, start + len(node.name), NAMES[node.name]))

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, str) or node.value not in NAMES:
            return
        if id(node) in self.docstring_nodes:
            return
        start, end = self.text.start(node), self.text.end(node)
        quote = self.text.text[start]
        if self.text.text[start:end] == quote + node.value + quote and quote in "'\"":
            self.edits.append((start, end, quote + NAMES[node.value] + quote))


def _docstring_of(body: Sequence[ast.stmt]) -> ast.Constant | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return first.value if isinstance(first.value.value, str) else None
    return None


def _comments(source: str) -> dict[int, str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def _apply(source: str, edits: list[tuple[int, int, str]]) -> str:
    pieces: list[str] = []
    at = 0
    for start, end, new in sorted(edits):
        if start < at:
            raise GenerateError(f"two edits overlap at offset {start}")
        pieces += [source[at:start], new]
        at = end
    return "".join(pieces) + source[at:]


def _still_async(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef | ast.AsyncWith | ast.AsyncFor | ast.Await):
            found.append(f"line {node.lineno}: {type(node).__name__}")
            continue
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.alias | ast.FunctionDef | ast.ClassDef):
            names = [node.name]
        found += [
            f"line {getattr(node, 'lineno', '?')}: {name}"
            for name in names
            if "async" in name.lower()
            or name in NAMES
            or re.fullmatch(r"__a(enter|exit|iter|next)__", name)
        ]
    return found


def to_sync(source: str, docstrings: dict[str, str] = DOCSTRINGS) -> str:
    """The sync module of an async one, before formatting (``docstrings`` as DOCSTRINGS)."""
    text = _Text(source)
    comments = _comments(source)
    rewrite = _Rewrite(text, comments, docstrings)
    rewrite.visit(ast.parse(source))
    stray = {n for n, c in comments.items() if c.startswith((_ASYNC_ONLY, _SYNC_ONLY))}
    if stray - rewrite.markers:
        lines = ", ".join(map(str, sorted(stray - rewrite.markers)))
        raise GenerateError(f"async_client.py:{lines}: a marker comment that marks no if block")
    if unused := set(docstrings) - rewrite.used_docstrings:
        raise GenerateError(f"DOCSTRINGS of nothing: {sorted(unused)}")
    result = _apply(source, rewrite.edits)
    if leftover := _still_async(ast.parse(result)):
        raise GenerateError("still async (add the names to NAMES): " + "; ".join(leftover))
    return result


def _format(code: str) -> str:
    # --stdin-filename: the settings that apply to sync_client.py apply (the project's).
    as_file = Path(__file__).with_name("sync_client.py")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(as_file), "-"],
        input=code,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise GenerateError(f"ruff format failed: {done.stderr.strip()}")
    return done.stdout


def generate() -> str:
    """What sync_client.py should hold."""
    return _format(to_sync(SOURCE.read_text(encoding="utf-8")))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only say whether it is up to date")
    args = parser.parse_args(argv)
    try:
        code = generate()
    except GenerateError as error:
        print(f"async_to_sync: {error}", file=sys.stderr)
        return 2
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if args.check:
        if code != current:
            print(
                f"{TARGET} is stale: run python -m aidb_memory.client._async_to_sync",
                file=sys.stderr,
            )
            return 1
        return 0
    if code != current:
        TARGET.write_text(code, encoding="utf-8")
        print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
