"""The documentation is tested: docs/reference.md and docs/models.md run their examples and
print what they say, the reference misses no function or view, and links between the documents
resolve.

The conventions (also stated at the top of the reference; models.md follows them too):

- Every ```sql block runs, in document order, in one freshly installed database, through psql,
  as the superuser; a first line ``-- role: NAME`` runs it after ``SET ROLE NAME``.
- A ```text block right after a ```sql block (only blank lines between) is its expected output:
  rows as ``psql -X -q -A -t`` prints them, and ERROR/HINT/DETAIL/NOTICE/WARNING lines as psql
  prints them with ``VERBOSITY=verbose`` minus CONTEXT and LOCATION (NOTICE without its 00000).
  ``...`` in an expected line matches any text, ``<uuid>`` one UUID. An expected ERROR means the
  block must fail.
- A ```sql block without a ```text block must succeed and print no error or warning.
- Every function and view of the schema has a heading naming it and at least one example.
- Each document's examples run in a database of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from aidb_memory.install.codebundle import BODY_SUFFIX
from conftest import REPO, Database, psql

REFERENCE = REPO / "docs" / "reference.md"
MODELS = REPO / "docs" / "models.md"
# The documents whose relative links must resolve, to files and to headings.
LINKED = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCHEMA = "aidb_memory"
_ROLE = re.compile(r"^--\s*role:\s*(\S+)\s*$")
_STDERR = ("ERROR:", "HINT:", "DETAIL:", "NOTICE:", "WARNING:")
_PSQL_PREFIX = re.compile(r"^psql:[^:]*:\d+: ")
# What an expected line may leave open: values that differ between runs.
_PLACEHOLDERS = {
    "...": ".*",
    "<uuid>": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
}
_PLACEHOLDER = re.compile("(" + "|".join(re.escape(p) for p in _PLACEHOLDERS) + ")")


@dataclass(frozen=True)
class Example:
    """One ```sql block and what it must print."""

    line: int  # line of the opening fence in reference.md, for messages
    sql: str
    role: str | None
    expected: list[str] | None  # None: only success is checked
    doc: str = "reference.md"  # for messages


@dataclass(frozen=True)
class _Block:
    lang: str
    start: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    body: list[str]


def _blocks(text: str, doc: str = "reference.md") -> list[_Block]:
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        words = lines[i][3:].split()
        lang = words[0] if words else ""
        start = i + 1
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{doc}:{start}: code block is never closed")
        blocks.append(_Block(lang, start, i + 1, body))
        i += 1
    return blocks


def parse_examples(text: str, doc: str = "reference.md") -> list[Example]:
    """Every ```sql block with its expected output; a stray ```text block is an error."""
    lines = text.splitlines()
    blocks = _blocks(text, doc)
    examples = []
    paired: set[int] = set()
    for n, block in enumerate(blocks):
        if block.lang != "sql":
            continue
        if not "\n".join(block.body).strip():
            raise ValueError(f"{doc}:{block.start}: empty sql block")
        expected = None
        following = blocks[n + 1] if n + 1 < len(blocks) else None
        between = lines[block.end : following.start - 1] if following else []
        if following and following.lang == "text" and not any(ln.strip() for ln in between):
            expected = [ln.rstrip() for ln in following.body]
            while expected and not expected[-1]:
                expected.pop()
            paired.add(n + 1)
        first = block.body[0].strip() if block.body else ""
        match = _ROLE.match(first)
        role = match.group(1) if match else None
        examples.append(Example(block.start, "\n".join(block.body) + "\n", role, expected, doc))
    for n, block in enumerate(blocks):
        if block.lang == "text" and n not in paired:
            raise ValueError(
                f"{doc}:{block.start}: a text block must directly follow a sql block "
                "(it is that block's expected output)"
            )
    return examples


def _stderr_lines(stderr: str) -> list[str]:
    """psql's messages, normalised: no file prefix, CONTEXT or LOCATION, no 00000 on notices."""
    out = []
    for raw in stderr.splitlines():
        line = _PSQL_PREFIX.sub("", raw.rstrip())
        if not line or line.startswith("LOCATION:"):
            continue
        out.append(line.replace("NOTICE:  00000: ", "NOTICE:  ", 1))
    return out


def _line_matches(expected: str, actual: str) -> bool:
    parts = _PLACEHOLDER.split(expected)
    pattern = "".join(_PLACEHOLDERS.get(part, re.escape(part)) for part in parts)
    return re.fullmatch(pattern, actual) is not None


def _compare(what: str, expected: list[str], actual: list[str], where: str) -> None:
    ok = len(expected) == len(actual) and all(
        _line_matches(e, a) for e, a in zip(expected, actual, strict=True)
    )
    assert ok, (
        f"{where}: {what} differs\n--- documented\n"
        + "\n".join(expected)
        + "\n--- actual\n"
        + "\n".join(actual)
    )


def run_example(db: Database, example: Example) -> None:
    """Run one example through psql and assert what the documentation says about it."""
    where = f"docs/{example.doc}:{example.line}"
    script = example.sql
    if example.role:
        script = f'SET ROLE "{example.role}";\n' + script
    result = psql(
        db.dsn(),
        "-q",
        "-A",
        "-t",
        "-v",
        "VERBOSITY=verbose",
        "-v",
        "SHOW_CONTEXT=never",
        input=script,
    )
    stdout = [ln.rstrip() for ln in result.stdout.splitlines()]
    messages = _stderr_lines(result.stderr)
    if example.expected is None:
        assert result.returncode == 0, f"{where}: failed\n{result.stderr}"
        problems = [m for m in messages if m.startswith(("ERROR:", "WARNING:"))]
        assert not problems, f"{where}: printed\n" + "\n".join(problems)
        return
    expected_messages = [ln for ln in example.expected if ln.startswith(_STDERR)]
    expected_rows = [ln for ln in example.expected if not ln.startswith(_STDERR)]
    fails = any(ln.startswith("ERROR:") for ln in expected_messages)
    if fails:
        assert result.returncode != 0, f"{where}: documented to fail, but succeeded"
    else:
        assert result.returncode == 0, f"{where}: failed\n{result.stderr}"
    _compare("output", expected_rows, stdout, where)
    _compare("messages", expected_messages, messages, where)


def test_reference_examples_run_and_print_what_they_say(db: Database) -> None:
    examples = parse_examples(REFERENCE.read_text(encoding="utf-8"))
    # A sanity floor, so that a broken parser cannot pass by finding nothing to run.
    assert len(examples) >= 20
    assert sum(e.expected is not None for e in examples) >= 20
    assert any(e.role for e in examples)
    assert any(e.expected and e.expected[0].startswith("ERROR:") for e in examples)
    for example in examples:
        run_example(db, example)


def test_models_guide_examples_run_and_print_what_they_say(db: Database) -> None:
    examples = parse_examples(MODELS.read_text(encoding="utf-8"), "models.md")
    assert len(examples) >= 8
    assert sum(e.expected is not None for e in examples) >= 8
    sql = "\n".join(e.sql for e in examples)
    for provider in ("api.openai.com", "openai.azure.com", ":8000/v1", ":11434/v1", ":8080/v1"):
        assert provider in MODELS.read_text(encoding="utf-8"), f"models.md lost {provider}"
    assert "aidb_memory.create_model(" in sql and "aidb_memory.set_secret(" in sql
    for example in examples:
        run_example(db, example)


def anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's id in a document (outside code blocks), with GitHub's -1, -2 suffixes."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            base = anchor(line)
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_links_between_documents_resolve() -> None:
    broken = []
    for doc in LINKED:
        text = doc.read_text(encoding="utf-8")
        prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        for target in _LINK.findall(prose):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            path, _, fragment = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.is_file():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif (
                fragment
                and file.suffix == ".md"
                and fragment not in anchors(file.read_text(encoding="utf-8"))
            ):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_anchor_follows_github() -> None:
    assert anchor("### aidb_memory.model_calls (view)") == "aidb_memorymodel_calls-view"
    assert anchor("## Compaction, worked through") == "compaction-worked-through"
    assert anchor("## The server's Python packages") == "the-servers-python-packages"
    assert anchors("# A\n```\n# not a heading\n```\n# A\n") == {"a", "a-1"}


def test_every_function_and_view_is_documented(db: Database) -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    headings = [ln for ln in text.splitlines() if ln.startswith("#")]
    documented = {m.group(1) for ln in headings for m in re.finditer(rf"\b{SCHEMA}\.(\w+)", ln)}
    sql = "\n".join(e.sql for e in parse_examples(text))
    functions = {
        r[0]
        for r in db.sql(
            "SELECT proname FROM pg_catalog.pg_proc WHERE pronamespace = %s::regnamespace",
            (SCHEMA,),
        )
    }
    views = {
        r[0]
        for r in db.sql(
            "SELECT relname FROM pg_catalog.pg_class "
            "WHERE relnamespace = %s::regnamespace AND relkind IN ('v', 'm')",
            (SCHEMA,),
        )
    }
    assert functions, "no functions found in the schema: is aidb_memory installed?"
    # The PL/Python bodies behind the wrappers (codebundle.BODY_SUFFIX) share one section.
    bodies = {
        f for f in functions if f.endswith(BODY_SUFFIX) and f[: -len(BODY_SUFFIX)] in functions
    }
    assert bodies, "no <function>_py bodies: are the wrappers installed?"
    assert f"### `{SCHEMA}.<function>{BODY_SUFFIX}(...)` (internal)" in headings
    assert any(re.search(rf"\b{SCHEMA}\.{f}\s*\(", sql) for f in bodies)
    functions -= bodies
    undocumented = sorted((functions | views) - documented)
    assert not undocumented, f"docs/reference.md has no heading for: {undocumented}"
    stale = sorted(documented - functions - views)
    assert not stale, f"docs/reference.md documents what does not exist: {stale}"
    untried = sorted(f for f in functions if not re.search(rf"\b{SCHEMA}\.{f}\s*\(", sql))
    untried += sorted(v for v in views if not re.search(rf"\b{SCHEMA}\.{v}\b", sql))
    assert not untried, f"docs/reference.md has no example for: {untried}"


# The checker itself must be able to fail.


def test_a_wrong_expectation_fails(db: Database) -> None:
    good = Example(1, "SELECT 1 + 1, NULL, 'x';\n", None, ["2||x"])
    run_example(db, good)
    run_example(db, Example(1, "SELECT 'id ' || gen_random_uuid();\n", None, ["id <uuid>"]))
    wrong = [
        Example(1, "SELECT 1 + 1;\n", None, ["3"]),  # another value
        Example(1, "SELECT 2 UNION ALL SELECT 3;\n", None, ["2"]),  # a row too many
        Example(1, "SELECT 2;\n", None, ["..."] * 2),  # `...` never stands for a line
        Example(1, "SELECT 'id 1234';\n", None, ["id <uuid>"]),  # `<uuid>` is a UUID only
        Example(1, "SELECT 1 / 0;\n", None, None),  # an error where none is documented
        Example(1, "SELECT 1;\n", None, ["1", "ERROR:  22012: ..."]),  # no error where one is
        Example(1, "SELECT 1 / 0;\n", None, ["ERROR:  22023: ..."]),  # another SQLSTATE
        Example(1, f"SELECT {SCHEMA}.init('x');\n", "aidb_users", ["1"]),  # the role is applied
    ]
    for example in wrong:
        with pytest.raises(AssertionError):
            run_example(db, example)


def test_parser_pairs_blocks_and_refuses_stray_output() -> None:
    text = (
        "```sql\n-- role: aidb_users\nSELECT 1;\n```\n\n```text\n1\n```\n"
        "```sql\nSELECT 2;\n```\nprose\n```text\n2\n```\n"
    )
    with pytest.raises(ValueError, match="must directly follow"):
        parse_examples(text)
    examples = parse_examples(text.rsplit("prose", 1)[0])
    assert [(e.role, e.expected) for e in examples] == [("aidb_users", ["1"]), (None, None)]
    with pytest.raises(ValueError, match="never closed"):
        parse_examples("```sql\nSELECT 1;\n")
