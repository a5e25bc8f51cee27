"""``aidb-memory doctor`` and ``aidb-memory deps``: the server's Python and its packages."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from aidb_memory import cli, connection
from aidb_memory.ops import deps
from aidb_memory.ops.doctor import probe_server_python
from conftest import ADMIN_USER, APP_USER, Database, run_cli
from fake_openai import FakeOpenAI, Reply, refused_port

TESTPKG = "aidb_memory_testpkg"


def server_python(db: Database) -> str:
    """The server's Python version (major.minor.micro), asked through the installed runtime."""
    return str(db.value("SELECT aidb_memory.runtime_info()->>'python'"))


def recorded_path(db: Database) -> str | None:
    return db.value(  # type: ignore[no-any-return]
        "SELECT value FROM aidb_memory.runtime_settings WHERE key = 'server_pythonpath'"
    )


def openai_version_in(directory: Path) -> str:
    """The openai version ``deps`` installed into ``directory``, from its dist-info."""
    found = sorted(directory.glob("openai-*.dist-info"))
    assert len(found) == 1, found
    return found[0].name[len("openai-") : -len(".dist-info")]


def line_of(output: str, name: str) -> str:
    """The report line of one check."""
    lines = [ln for ln in output.splitlines() if re.match(rf"^\w+\s+{re.escape(name)}\s", ln)]
    assert len(lines) == 1, output
    return lines[0]


def fix_after(output: str, name: str) -> str:
    """The ``fix:`` line that follows a check's line."""
    lines = output.splitlines()
    index = lines.index(line_of(output, name))
    following = lines[index + 1].strip()
    assert following.startswith("fix: "), output
    return following


def assert_one_line_failure(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- doctor ---------------------------------------------------------------------------------


def test_doctor_all_ok_on_an_installed_database(db: Database, server_pylib: Path) -> None:
    result = run_cli("doctor", dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert line_of(out, "plpython3u").startswith("ok ")
    python = server_python(db)
    assert re.fullmatch(r"\d+\.\d+\.\d+", python)
    assert line_of(out, "python") == f"ok       python      the server runs Python {python}"
    version = openai_version_in(server_pylib)
    assert line_of(out, "openai") == (
        f"ok       openai      imports in the server (version {version})"
    )
    assert line_of(out, "aidb_memory").startswith("ok ")
    assert "missing" not in out and "fix:" not in out


def test_doctor_on_an_empty_database(empty_db: Database) -> None:
    result = run_cli("doctor", dsn=empty_db.dsn())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    out = result.stdout
    assert line_of(out, "plpython3u").startswith("ok       plpython3u  available")
    assert line_of(out, "python").startswith("ok       python      the server runs Python 3.")
    openai = line_of(out, "openai")
    assert openai.startswith("missing  openai      does not import in the server")
    assert "package directory: none recorded" in openai
    assert fix_after(out, "openai").startswith("fix: aidb-memory deps")
    assert line_of(out, "aidb_memory").startswith("missing")
    assert fix_after(out, "aidb_memory") == "fix: aidb-memory install"
    # The probe ran PL/Python in a transaction that was rolled back: nothing was left behind.
    assert empty_db.value("SELECT count(*) FROM pg_extension WHERE extname = 'plpython3u'") == 0


def test_doctor_as_a_non_superuser(db: Database) -> None:
    result = run_cli("doctor", dsn=db.dsn(APP_USER))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    out = result.stdout
    assert line_of(out, "plpython3u").startswith("ok ")
    python = line_of(out, "python")
    assert "need a superuser" in python
    assert "run doctor as a superuser" in fix_after(out, "python")


def test_doctor_is_not_silenced_by_client_min_messages(db: Database) -> None:
    # The server's Python answers with a NOTICE; a database that hides notices must not turn
    # "ok" into "Python None" and "openai missing".
    db.sql(f"ALTER DATABASE {db.name} SET client_min_messages = warning")
    result = run_cli("doctor", dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    assert line_of(result.stdout, "python").endswith(f"Python {server_python(db)}")
    assert line_of(result.stdout, "openai").startswith("ok ")


def test_doctor_reports_drift(db: Database) -> None:
    db.sql("REVOKE EXECUTE ON FUNCTION aidb_memory.version() FROM aidb_users")
    result = run_cli("doctor", dsn=db.dsn())
    assert result.returncode == 1
    assert line_of(result.stdout, "aidb_memory").startswith("missing")
    assert "changed by hand" in line_of(result.stdout, "aidb_memory")


def test_doctor_on_a_server_without_plpython(
    empty_db: Database, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The cluster has plpython3u (Debian's package is installed server-wide) and a test cannot
    remove it: in-process, the extension doctor looks for is renamed to one no server has."""
    monkeypatch.setattr(connection, "PLPYTHON_EXTENSION", "plpython3u_not_in_this_server")
    major = int(empty_db.value("SHOW server_version_num")) // 10000
    code = cli.main(["doctor", "--dsn", empty_db.dsn()])
    out, err = capfd.readouterr()
    assert code == 1
    assert err == ""
    assert line_of(out, "plpython3u") == ("missing  plpython3u  not available in this server")
    assert fix_after(out, "plpython3u") == (
        f"fix: apt-get install postgresql-plpython3-{major} (on the database host)"
    )
    assert not re.search(r"^\w+\s+python\s", out, re.M)  # nothing more is tried without it


# --- doctor: models reachable ----------------------------------------------------------------

KEY = "sk-doctor-never-shown-41c9"


def register(db: Database, name: str, base_url: str, **options: Any) -> None:
    """An openai model at ``base_url``, its key stored with set_secret."""
    db.sql("SELECT aidb_memory.set_secret('doctor_key', %s, ARRAY[%s])", (KEY, base_url))
    opts = {
        "model": "fake-chat",
        "base_url": base_url,
        "api_key_secret": "doctor_key",
        "max_retries": 0,
        "timeout_s": 5,
        **options,
    }
    db.sql("SELECT aidb_memory.create_model(%s, 'openai', %s::jsonb)", (name, json.dumps(opts)))


def model_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if re.match(r"^\w+\s+model\s", ln)]


def test_doctor_calls_a_reachable_model(db: Database, fake: FakeOpenAI) -> None:
    register(db, "chat", fake.base_url)
    fake.queue(Reply(content="OK"))
    result = run_cli("doctor", dsn=db.dsn())
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    (line,) = model_lines(result.stdout)
    assert re.fullmatch(r"ok       model       chat \(openai fake-chat\): answered in \d+ ms", line)
    assert "fix:" not in out and KEY not in out
    # One call, with the stored key; recorded like any other (purpose check).
    (request,) = fake.calls()
    assert request.body["model"] == "fake-chat"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert db.sql("SELECT model_name, purpose, outcome FROM aidb_memory.model_calls") == [
        ("chat", "check", "ok")
    ]


def test_doctor_reports_a_model_it_cannot_reach(db: Database) -> None:
    port = refused_port()
    register(db, "down", f"http://127.0.0.1:{port}/v1")
    db.sql("SELECT aidb_memory.create_model('quotes', 'builtin', '{\"kind\": \"extractive\"}')")
    result = run_cli("doctor", dsn=db.dsn())
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out and KEY not in out
    down, quotes = model_lines(result.stdout)  # in name order
    assert down.startswith("failed   model       down (openai fake-chat): connection failed"), down
    assert str(port) in down or "onnect" in down
    lines = result.stdout.splitlines()
    following = lines[lines.index(down) + 1].strip()
    assert following.startswith("fix: check its base_url, key and network"), following
    assert "SELECT aidb_memory.model_check('down')" in following
    # The other model and the other checks are reported as usual.
    assert re.fullmatch(
        r"ok       model       quotes \(builtin extractive\): answered in \d+ ms", quotes
    )
    assert line_of(result.stdout, "aidb_memory").startswith("ok ")
    assert line_of(result.stdout, "python").startswith("ok ")


def test_doctor_without_models(db: Database) -> None:
    result = run_cli("doctor", dsn=db.dsn())
    assert result.returncode == 0, result.stdout + result.stderr
    assert line_of(result.stdout, "models") == (
        "ok       models      none registered (aidb_memory.create_model adds one)"
    )
    assert not model_lines(result.stdout)


def test_doctor_checks_models_as_an_admin_and_skips_them_for_an_app_role(
    db: Database, fake: FakeOpenAI
) -> None:
    register(db, "chat", fake.base_url)
    # An aidb_admins member (not a superuser) reads the models and calls them.
    as_admin = run_cli("doctor", dsn=db.dsn(ADMIN_USER))
    assert "Traceback" not in as_admin.stdout + as_admin.stderr
    (line,) = model_lines(as_admin.stdout)
    assert line.startswith("ok       model       chat (openai fake-chat): answered in ")
    assert len(fake.calls()) == 1
    # An application role may not read them: one skipped line, no call, no error.
    as_app = run_cli("doctor", dsn=db.dsn(APP_USER))
    assert as_app.returncode == 1
    assert "Traceback" not in as_app.stdout + as_app.stderr and as_app.stderr == ""
    assert line_of(as_app.stdout, "models") == (
        f"skipped  models      not checked: {APP_USER} may not read aidb_memory.models"
    )
    assert fix_after(as_app.stdout, "models") == (
        "fix: run doctor as a member of aidb_admins or a superuser"
    )
    assert len(fake.calls()) == 1


# --- deps -----------------------------------------------------------------------------------


def test_the_session_deps_run_recorded_its_directory(db: Database, server_pylib: Path) -> None:
    assert recorded_path(db) == str(server_pylib.resolve())
    assert openai_version_in(server_pylib)
    # The server's own OS user reads every file: the directory is world-readable.
    mode = (server_pylib / "openai" / "__init__.py").stat().st_mode
    assert mode & stat.S_IROTH


def test_deps_refuses_a_non_superuser(db: Database) -> None:
    line = assert_one_line_failure(run_cli("deps", dsn=db.dsn(APP_USER)))
    assert "deps needs a superuser" in line
    assert f"connected as {APP_USER}" in line


def test_deps_needs_an_installed_database(empty_db: Database) -> None:
    line = assert_one_line_failure(run_cli("deps", dsn=empty_db.dsn()))
    assert "not installed" in line and "aidb-memory install" in line


def fake_python(directory: Path, version: str, *, pip: bool) -> Path:
    """A stand-in interpreter: answers the version question with ``version``; has pip or not."""
    script = directory / f"python{version}"
    pip_answer = (
        'echo "pip 23.0 from /nowhere"; exit 0'
        if pip
        else 'echo "$0: No module named pip" >&2; exit 1'
    )
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then {pip_answer}; fi\n'
        f'if [ "$1" = "-c" ]; then echo {version}; exit 0; fi\n'
        "echo unexpected >&2; exit 3\n"
    )
    script.chmod(0o755)
    return script


def test_deps_refuses_an_interpreter_of_another_version(db: Database, tmp_path: Path) -> None:
    before = recorded_path(db)
    python = fake_python(tmp_path, "3.9", pip=True)
    result = run_cli("deps", "--python", str(python), "--target", str(tmp_path / "t"), dsn=db.dsn())
    line = assert_one_line_failure(result)
    major_minor = ".".join(server_python(db).split(".")[:2])
    assert f"is Python 3.9 but the server runs Python {major_minor}" in line
    assert "/usr/bin/python3" in line
    assert recorded_path(db) == before
    assert not (tmp_path / "t").exists()


def test_deps_refuses_an_interpreter_without_pip(db: Database, tmp_path: Path) -> None:
    before = recorded_path(db)
    major_minor = ".".join(server_python(db).split(".")[:2])
    python = fake_python(tmp_path, major_minor, pip=False)
    result = run_cli("deps", "--python", str(python), "--target", str(tmp_path / "t"), dsn=db.dsn())
    line = assert_one_line_failure(result)
    assert f"{python} has no pip" in line
    assert "apt-get install python3-pip" in line
    assert "omit --python" in line
    assert recorded_path(db) == before


def test_deps_refuses_a_python_that_does_not_exist(db: Database) -> None:
    result = run_cli("deps", "--python", "/no/such/python3", dsn=db.dsn())
    line = assert_one_line_failure(result)
    assert "cannot run --python /no/such/python3" in line


# A tiny wheel stands in for openai, so that deps --python runs pip for real, offline and fast,
# without a second full openai install (the session fixture already did one).


def build_wheel(directory: Path) -> Path:
    wheel = directory / f"{TESTPKG}-1.0-py3-none-any.whl"
    info = f"{TESTPKG}-1.0.dist-info"
    files = {
        f"{TESTPKG}/__init__.py": '__version__ = "1.0"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: aidb-memory-testpkg\nVersion: 1.0\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", record)
    return wheel


@pytest.fixture
def tiny_requirements(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """deps installs the tiny wheel (from a local directory, no index) instead of openai."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    monkeypatch.setattr(deps, "SERVER_REQUIREMENTS", ("aidb-memory-testpkg",))
    monkeypatch.setattr(deps, "SERVER_MODULE", TESTPKG)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    yield


@pytest.fixture
def readable_dir() -> Iterator[Path]:
    """A directory the server's OS user can reach (mkdtemp makes 0700 ones)."""
    directory = Path(tempfile.mkdtemp(prefix="aidb-memory-deps-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def test_system_python_has_pip() -> None:
    # The next test runs deps --python /usr/bin/python3 for real; it needs pip there.
    result = subprocess.run(
        ["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_deps_with_the_server_interpreter_installs_and_records(
    db: Database,
    tiny_requirements: None,
    readable_dir: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    target = readable_dir / "site-packages"
    code = cli.main(
        ["deps", "--dsn", db.dsn(), "--python", "/usr/bin/python3", "--target", str(target)]
    )
    out, err = capfd.readouterr()
    assert code == 0, out + err
    assert "Running pip as the 'root' user" not in err
    assert f"{TESTPKG} 1.0 imports in the server from {target}" in out
    assert recorded_path(db) == str(target)
    installed = target / TESTPKG / "__init__.py"
    assert installed.stat().st_mode & stat.S_IROTH
    # A new connection's server-side Python finds it through the recorded directory.
    with psycopg.connect(db.dsn(), autocommit=True) as conn:
        info = probe_server_python(conn, TESTPKG)
    assert info["module_version"] == "1.0"
    assert info["module_file"] == str(installed)


def test_deps_into_a_directory_the_server_cannot_read(
    db: Database, tiny_requirements: None, capfd: pytest.CaptureFixture[str]
) -> None:
    # The server runs as the postgres OS user when the tests run as root (conftest), so a 0700
    # directory of ours is out of its reach.
    assert os.geteuid() == 0, "this test needs the server to run as another OS user"
    before = recorded_path(db)
    hidden = Path(tempfile.mkdtemp(prefix="aidb-memory-deps-hidden-"))  # 0700, owned by us
    try:
        assert not os.stat(hidden).st_mode & stat.S_IXOTH
        target = hidden / "site-packages"
        code = cli.main(
            ["deps", "--dsn", db.dsn(), "--python", "/usr/bin/python3", "--target", str(target)]
        )
        out, err = capfd.readouterr()
        assert code == 1, out + err
        assert "Traceback" not in out + err
        # pip may have said things on stderr before; ours is one line, the last.
        lines = [ln for ln in err.splitlines() if ln.startswith("aidb-memory:")]
        assert len(lines) == 1 and err.splitlines()[-1] == lines[0], err
        assert f"the server's Python cannot import {TESTPKG}" in lines[0]
        assert "readable by the server's OS user" in lines[0]
        assert "nothing was recorded" in lines[0]
        assert recorded_path(db) == before
    finally:
        subprocess.run(["rm", "-rf", str(hidden)], check=False)
