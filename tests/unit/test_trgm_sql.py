"""SQL naming pg_trgm by the schema it is in (extensions.py; issue 10, item 9)."""

from __future__ import annotations

import ast
from pathlib import Path

import pglast
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server.extensions import PLACEHOLDER, qualify, quote_ident


def test_public_and_odd_names() -> None:
    template = 'SELECT "@trgm@".similarity(a, b) WHERE a OPERATOR("@trgm@".%) b'
    assert qualify(template, "public") == (
        'SELECT "public".similarity(a, b) WHERE a OPERATOR("public".%) b'
    )
    assert qualify(template, 'we"ird') == (
        'SELECT "we""ird".similarity(a, b) WHERE a OPERATOR("we""ird".%) b'
    )


@given(st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s and len(s.encode()) < 64))
def test_any_schema_name_is_one_identifier(name: str) -> None:
    (stmt,) = pglast.parse_sql(f"SELECT {quote_ident(name)}.similarity('a', 'b')")
    funcname = stmt.stmt.targetList[0].val.funcname
    assert [p.sval for p in funcname] == [name, "similarity"]


def test_nul_is_refused() -> None:
    with pytest.raises(ValueError):
        quote_ident("a\x00b")


SERVER = Path(__file__).resolve().parents[2] / "plpython" / "aidb_memory_server"


def constant(module: str, name: str) -> str:
    """A string constant of a server module (they import plpy, so they are read, not imported)."""
    tree = ast.parse((SERVER / module).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            return node.value.value
    raise AssertionError(f"{module} has no {name}")


@pytest.mark.parametrize(
    ("module", "name"), [("memories.py", "_NEAR_WORDS"), ("reconciliation.py", "_SAME")]
)
def test_our_statements_name_pg_trgm_only_through_the_placeholder(module: str, name: str) -> None:
    template = constant(module, name)
    assert PLACEHOLDER in template
    qualified = qualify(template, "public")
    pglast.parse_sql(qualified)
    assert template.count("similarity(") == template.count(PLACEHOLDER + ".similarity(") > 0
    assert template.count("%") == template.count(f"OPERATOR({PLACEHOLDER}.%)")
