# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test validate bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,dist]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/commtax demo

test: $(STAMP)
	$(BIN)/python -m pytest

validate: $(STAMP)
	$(BIN)/commtax validate ../shared/validation/public_runs.csv
	$(BIN)/commtax validate ../shared/validation/public_collectives.csv

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_estimate.py
	$(BIN)/python benchmarks/bench_simulate.py
	$(BIN)/python benchmarks/bench_search.py

clean:
	rm -rf $(VENV) build src/*.egg-info
