# The two commands a new user types: `make up` runs Warmplane on its embedded defaults, `make test` passes
# the tests. Both build the virtual environment from the project's own files first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: up test lint unit integration bench clean

$(BIN)/warmplane: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/warmplane

up: $(BIN)/warmplane
	$(BIN)/warmplane up

lint: $(BIN)/warmplane
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q

unit: $(BIN)/warmplane
	$(BIN)/pytest -q tests/unit

integration: $(BIN)/warmplane
	$(BIN)/pytest -q tests/integration

bench: $(BIN)/warmplane
	$(BIN)/python -m bench.ingest_bench
	$(BIN)/python -m bench.emitter_bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
