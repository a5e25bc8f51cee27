"""Where the SQL, the migrations and the server-side Python come from.

In a wheel they are package data under ``aidb_memory/_data``; in a checkout (or an editable
install) they are the repository's top-level ``sql/``, ``migrations/`` and ``plpython/``. A
developer can point at another tree with ``--source`` (the upgrade tests do).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The aidb_memory package: _data sits beside its modules in a wheel (pyproject.toml), one level
# above this subpackage.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SourceTree:
    """The three directories the installer reads."""

    root: Path

    @property
    def sql_dir(self) -> Path:
        return self.root / "sql"

    @property
    def migrations_dir(self) -> Path:
        return self.root / "migrations"

    @property
    def plpython_dir(self) -> Path:
        return self.root / "plpython"

    def check(self) -> SourceTree:
        missing = [
            d for d in (self.sql_dir, self.migrations_dir, self.plpython_dir) if not d.is_dir()
        ]
        if missing:
            raise FileNotFoundError(
                "aidb-memory: source tree is incomplete, missing " + ", ".join(map(str, missing))
            )
        return self


def default_tree() -> SourceTree:
    """The package's own tree: package data when installed from a wheel, else the checkout."""
    packaged = _PACKAGE_DIR / "_data"
    if packaged.is_dir():
        return SourceTree(packaged).check()
    return SourceTree(_PACKAGE_DIR.parent.parent).check()
