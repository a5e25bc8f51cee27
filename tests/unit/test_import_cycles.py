"""No import cycles among our modules: each package's dependencies run one way (issue 28).

The graph is read from the source with ``ast``, so it counts every import, also one inside a
function or under ``if TYPE_CHECKING:``: a cycle hidden in a function (as ``script`` and
``trust`` had) still means two modules that cannot be understood one without the other.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = [REPO / "src" / "aidb_memory", REPO / "plpython" / "aidb_memory_server"]


def _module_name(package_dir: Path, path: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` (at ``path``) imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative to the package the module is in (a package's __init__ is its own).
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                # `from package import module` imports the module; `from module import name`
                # imports the module that defines the name.
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif source in modules:
                    found.add(source)
    found.discard(name)
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of the package (dotted name) -> the modules of the package it imports."""
    paths = {_module_name(package_dir, p): p for p in sorted(package_dir.rglob("*.py"))}
    return {name: _imported(name, path, set(paths)) for name, path in paths.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (its first module repeated at the end), or None."""
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


@pytest.mark.parametrize("package_dir", PACKAGES, ids=lambda p: p.name)
def test_no_import_cycle(package_dir: Path) -> None:
    graph = import_graph(package_dir)
    assert len(graph) > 10, graph  # the package was found and read
    found = cycle(graph)
    assert found is None, " -> ".join(found or [])


def test_a_cycle_through_a_function_level_relative_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (package / "c.py").write_text("X = 1\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert set(cycle(graph) or []) == {"pkg.a", "pkg.sub.b"}
    # The same dependency, one way: b uses what a and b share, moved to c.
    (package / "sub" / "b.py").write_text("from pkg.c import X\n")
    graph = import_graph(package)
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert cycle(graph) is None
