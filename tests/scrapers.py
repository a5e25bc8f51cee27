"""Real scrapers for the monitoring tests (issue 36): Debian's Prometheus server and
postgres_exporter, each on a free loopback port in a temporary directory of its own, stopped and
removed whatever happens (context managers).

As root they run as the unprivileged server user, which owns their directory (Prometheus' TSDB),
through :mod:`deployments`' helpers, as PgBouncer and the standby do. scripts/bootstrap.sh
installs both packages (``prometheus``, which brings promtool, and
``prometheus-postgres-exporter``) and stops the services Debian starts with them.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from deployments import STARTUP_S, _command, _env, _log_tail, _stop, _workdir, free_port

PROMETHEUS = Path(shutil.which("prometheus") or "/usr/bin/prometheus")
POSTGRES_EXPORTER = Path(
    shutil.which("prometheus-postgres-exporter") or "/usr/bin/prometheus-postgres-exporter"
)
HTTP_TIMEOUT_S = 5.0


def http_get(url: str) -> tuple[int, str]:
    """GET ``url``: the status and the body (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


class _Server:
    """A program listening on a loopback port, run as the server user when we are root."""

    name = "server"

    def __init__(self, prefix: str) -> None:
        self.workdir = _workdir(prefix)
        self.port = free_port()
        self.log = self.workdir / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return _env()

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        self._log = self.log.open("wb")
        self.process = subprocess.Popen(
            _command(*self.command()), env=self.env(), stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited: {_log_tail(self.log)}")
            try:
                if self.ready():
                    return
            except OSError:
                pass  # not listening yet: poll again
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start: {_log_tail(self.log)}")
            time.sleep(0.1)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        try:
            if self.process is not None:
                _stop(self.process, signal.SIGTERM)
        finally:
            if self._log is not None:
                self._log.close()
            shutil.rmtree(self.workdir, ignore_errors=True)


S = TypeVar("S", bound=_Server)


@contextmanager
def _running(server: S) -> Iterator[S]:
    """``server`` started, then stopped and its directory removed, whatever happens."""
    try:
        server.start()
        yield server
    finally:
        server.stop()


class Prometheus(_Server):
    """Prometheus scraping ``targets`` (job name -> list of host:port) every second and
    evaluating ``rule_files`` every second, with its TSDB in its own directory."""

    name = "prometheus"

    def __init__(self, targets: dict[str, list[str]], rule_files: list[Path]) -> None:
        if not PROMETHEUS.exists():
            raise AssertionError("prometheus is not installed: apt-get install -y prometheus")
        super().__init__("aidb-memory-prometheus-")
        rules = []
        for source in rule_files:
            copy = self.workdir / source.name  # readable by the server user, wherever we are
            copy.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
            copy.chmod(0o644)
            rules.append(str(copy))
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "evaluation_interval": "1s",
                    },
                    "rule_files": rules,
                    "scrape_configs": [
                        {"job_name": job, "static_configs": [{"targets": hosts}]}
                        for job, hosts in targets.items()
                    ],
                },
                indent=2,
            ),
            encoding="utf-8",
        )
        self.config.chmod(0o644)

    def command(self) -> list[str]:
        return [
            str(PROMETHEUS),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def ready(self) -> bool:
        return http_get(self.url("/-/ready"))[0] == 200

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>: its ``data``, after checking that the call succeeded."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = http_get(self.url(f"/api/v1/{path}{query}"))
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", body
        return answer["data"]

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: each sample's labels (with __name__ where kept) and value."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return [(sample["metric"], float(sample["value"][1])) for sample in data["result"]]


def prometheus(
    targets: dict[str, list[str]], rule_files: list[Path]
) -> AbstractContextManager[Prometheus]:
    """A running Prometheus, stopped and its directory removed on exit."""
    return _running(Prometheus(targets, rule_files))


class PostgresExporter(_Server):
    """Debian's postgres_exporter for database ``dsn`` with the custom queries of ``queries``,
    its own metrics and collectors off (a scrape shows what the file makes, and pg_up)."""

    name = "postgres_exporter"

    def __init__(self, dsn: str, queries: Path) -> None:
        if not POSTGRES_EXPORTER.exists():
            raise AssertionError(
                "postgres_exporter is not installed: "
                "apt-get install -y prometheus-postgres-exporter"
            )
        super().__init__("aidb-memory-postgres-exporter-")
        self.dsn = dsn
        self.queries = self.workdir / queries.name
        self.queries.write_text(queries.read_text(encoding="utf-8"), encoding="utf-8")
        self.queries.chmod(0o644)

    def command(self) -> list[str]:
        return [
            str(POSTGRES_EXPORTER),
            f"--extend.query-path={self.queries}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--disable-default-metrics",
            "--disable-settings-metrics",
            "--no-collector.database",
            "--no-collector.bgwriter",
            "--log.level=warn",
        ]

    def env(self) -> dict[str, str]:
        return {**_env(), "DATA_SOURCE_NAME": self.dsn}

    def ready(self) -> bool:
        return http_get(self.url("/"))[0] == 200

    def metrics(self) -> str:
        status, body = http_get(self.url("/metrics"))
        assert status == 200, body
        return body


def postgres_exporter(dsn: str, queries: Path) -> AbstractContextManager[PostgresExporter]:
    """A running postgres_exporter, stopped and its directory removed on exit."""
    return _running(PostgresExporter(dsn, queries))
