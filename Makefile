# The two commands of the README: `make demo` and `make test`. Both bootstrap what they need.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: bootstrap test lint typecheck unit demo bench bench-compare bench-quality clean

bootstrap:
	@scripts/bootstrap.sh

lint: bootstrap
	$(VENV)/bin/ruff check src plpython tests bench
	$(VENV)/bin/ruff format --check src plpython tests bench

typecheck: bootstrap
	$(VENV)/bin/mypy

test: bootstrap lint typecheck
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: bootstrap
	$(VENV)/bin/aidb-memory demo

# The benchmark (bench/README.md): bootstraps with the [bench] extra, runs on one throwaway server.
bench:
	@BOOTSTRAP_BENCH=1 scripts/bootstrap.sh
	$(PY) bench/run.py $(BENCH_ARGS)

# Search quality on real conversations (bench/quality.py, bench/README.md): bootstraps with the
# [quality] extra (the baselines and the embedding model), runs on one throwaway server.
# DATA=<dir of LoCoMo *.json>, default the development half in ../shared/data.
DATA ?= ../shared/data/locomo-dev
bench-quality:
	@BOOTSTRAP_QUALITY=1 scripts/bootstrap.sh
	$(PY) bench/quality.py "$(DATA)" $(QUALITY_ARGS)

# This checkout against another revision, side by side in one server (bench/compare.py).
bench-compare: bootstrap
	@test -n "$(BASE)" || { echo "usage: make bench-compare BASE=<git revision>" >&2; exit 2; }
	@dir=$$(mktemp -d) && trap 'git worktree remove --force "$$dir/base"; rm -rf "$$dir"' EXIT && \
	git worktree add -q --detach "$$dir/base" "$(BASE)" && \
	$(PY) bench/compare.py "$(BASE)=$$dir/base" "HEAD=." $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis dist build
