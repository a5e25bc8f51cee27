"""A wheel built from the repository installs the schema with no repository around it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from aidb_memory import __version__
from conftest import REPO, Database


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_wheel_in_a_fresh_venv_installs_the_schema(tmp_path: Path, empty_db: Database) -> None:
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        tmp_path,
    )
    wheels = list(dist.glob("aidb_memory-*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    _run([str(venv / "bin" / "pip"), "install", "-q", str(wheels[0])], tmp_path)

    # Run from a directory with no repository in sight, and nothing of ours on the path.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = _run(
        [str(venv / "bin" / "aidb-memory"), "install", "--dsn", empty_db.dsn()], elsewhere, env
    )
    assert "migration 0001_namespaces applied" in out
    assert empty_db.value("SELECT aidb_memory.version()") == __version__
    assert (
        empty_db.value("SELECT count(*) FROM aidb_memory.namespaces WHERE name = 'pg_agents'") == 1
    )
    location = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import aidb_memory, sys; print(aidb_memory.__file__)",
        ],
        elsewhere,
        env,
    )
    assert str(REPO) not in location

    # The client comes with the package, typed (py.typed), and the runtime dependencies leave
    # the demo's throwaway server (testing.postgresql) to the [demo] extra.
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    assert {"aidb_memory/py.typed", "aidb_memory/client/__init__.py"} <= names
    python = str(venv / "bin" / "python")
    probe = "import importlib.util as u, aidb_memory.client; print(u.find_spec('testing') is None)"
    assert _run([python, "-c", probe], elsewhere, env).strip() == "True"
    demo = subprocess.run(
        [str(venv / "bin" / "aidb-memory"), "demo"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert demo.returncode == 1
    assert "pip install 'aidb-memory[demo]'" in demo.stderr, demo.stderr
