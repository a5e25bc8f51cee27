"""What the demo prints: its numbered steps, the narration, each statement exactly as it runs
and its result as psql would show it."""

from __future__ import annotations

import datetime
import json
import textwrap
from collections.abc import Sequence
from typing import Any

import psycopg

Connection = psycopg.Connection[tuple[Any, ...]]
WIDTH = 100
INDENT = "   "


def cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "{" + ",".join(value) + "}"  # a text[], as psql shows it
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def pretty_json(value: Any, indent: str = "", width: int = WIDTH) -> list[str]:
    """JSON as lines no wider than ``width`` where possible: compact if it fits, else one
    element per line, recursively (a long string cannot be wrapped and stays whole)."""
    compact = json.dumps(value, ensure_ascii=False)
    if len(indent) + len(compact) <= width or not isinstance(value, (dict, list)) or not value:
        return [indent + compact]
    inner = indent + "  "
    items: list[list[str]] = []
    if isinstance(value, dict):
        for key, v in value.items():
            label = json.dumps(key, ensure_ascii=False) + ": "
            lines = pretty_json(v, inner, width - len(label))
            first = lines[0][len(inner) :]
            items.append([inner + label + first, *lines[1:]])
        opening, closing = "{", "}"
    else:
        items = [pretty_json(v, inner, width) for v in value]
        opening, closing = "[", "]"
    out = [indent + opening]
    for n, lines in enumerate(items):
        out += [*lines[:-1], lines[-1] + ("," if n < len(items) - 1 else "")]
    out.append(indent + closing)
    return out


def table(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Rows as an aligned table; a table too wide for the page is shown one record at a time,
    with its JSON values pretty-printed."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    # Numbers align right, as psql prints them.
    numeric = [
        all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in rows)
        for i in range(len(names))
    ]
    if len(INDENT) + sum(widths) + 3 * (len(widths) - 1) <= WIDTH:
        print(INDENT + " | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
        print(INDENT + "-+-".join("-" * w for w in widths))
        for r in cells:
            line = " | ".join(
                c.rjust(w) if num else c.ljust(w)
                for c, w, num in zip(r, widths, numeric, strict=True)
            )
            print((INDENT + line).rstrip())
        print(f"{INDENT}({len(rows)} row{'' if len(rows) == 1 else 's'})")
        return
    label = max(len(n) for n in names)
    for number, row in enumerate(rows, 1):
        if len(rows) > 1:
            print(f"{INDENT}-[ row {number} ]")
        for name, value in zip(names, row, strict=True):
            head = f"{INDENT}{name.ljust(label)} | "
            text_array = isinstance(value, list) and all(isinstance(v, str) for v in value)
            if isinstance(value, (dict, list)) and value and not text_array:
                lines = pretty_json(value, " " * len(head))
                print(head + lines[0].lstrip())
                if lines[1:]:
                    print("\n".join(lines[1:]))
            elif isinstance(value, str) and len(head) + len(value) > WIDTH:
                print(head + f"\n{' ' * len(head)}".join(wrap(value, WIDTH - len(head))))
            else:
                print(head + cell(value))


def wrap(text: str, width: int) -> list[str]:
    """Long text as lines of at most ``width`` (its own line breaks kept)."""
    out: list[str] = []
    for line in text.splitlines() or [""]:
        out += textwrap.wrap(line, max(20, width), break_on_hyphens=False) or [""]
    return out


class Page:
    """The walkthrough as printed: numbered steps, each with its narration, statements and
    results, one blank line between the parts of a step."""

    def __init__(self) -> None:
        self.step = 0
        self._after_heading = False

    def gap(self) -> None:
        """One blank line between the parts of a step (none right after its heading)."""
        if not self._after_heading:
            print()
        self._after_heading = False

    def heading(self, title: str) -> None:
        self.step += 1
        print(f"\n== {self.step}. {title}")
        self._after_heading = True

    def say(self, text: str) -> None:
        """Narration, wrapped."""
        self.gap()
        for paragraph in textwrap.dedent(text).strip().split("\n\n"):
            print(textwrap.fill(" ".join(paragraph.split()), WIDTH))

    def show_turns(self, turns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        """Print turns as a person reads them; returns them as add takes them."""
        self.gap()
        for role, text in turns:
            lines = textwrap.wrap(text, WIDTH - len(INDENT) - 11)
            print(f"{INDENT}{role:10} {lines[0]}")
            for line in lines[1:]:
                print(f"{INDENT}{'':10} {line}")
        return [{"role": role, "content": text} for role, text in turns]

    def run(
        self,
        conn: Connection,
        query: str,
        params: Sequence[Any] | None = None,
        *,
        json_result: bool = False,
    ) -> list[tuple[Any, ...]] | None:
        """Show a statement, run it and show its result (or its error); returns the rows.

        A statement with ``params`` names them ``$1``, ``$2``... as the server sees them, and the
        narration says what they are: their values are never shown (a key is one of them)."""
        self.gap()
        text = textwrap.dedent(query).strip()
        print(textwrap.indent(text, INDENT + "  "))
        print()
        try:
            if params is None:
                cur = conn.execute(text.encode())
            else:
                for n in range(len(params), 0, -1):
                    text = text.replace(f"${n}", "%s")
                cur = conn.execute(text, params)
        except psycopg.Error as e:
            diag = e.diag
            print(f"{INDENT}ERROR:  {diag.sqlstate}: {diag.message_primary}")
            if diag.message_hint:
                print(f"{INDENT}HINT:  {diag.message_hint}")
            return None
        if cur.description is None:
            print(INDENT + cur.statusmessage if cur.statusmessage else INDENT + "OK")
            return []
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
        if json_result:
            print("\n".join(pretty_json(rows[0][0], INDENT)))
        else:
            table(names, rows)
        return rows
