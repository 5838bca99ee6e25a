# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-model validate intervals bench readme clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,dist]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/commtax demo

LINTED := src tests benchmarks

# lint first (ruff: pyproject.toml [tool.ruff]), then the tests
test: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/python -m pytest

# the fast tier: spec -> schedule tests only (no torch, netns or CLI; tests/conftest.py marks them "model")
test-model: $(STAMP)
	$(BIN)/python -m pytest -m model

# shipped with the repo (a copy of ../shared/validation); no comment on the line: make keeps its spaces
VALIDATION := validation
DENSE_RUNS := $(VALIDATION)/public_runs.csv $(VALIDATION)/public_runs_more.csv

# every published set: the dense runs files each and together (by source), the MoE runs, the collectives
validate: $(STAMP)
	$(BIN)/commtax validate $(DENSE_RUNS) --loso
	$(BIN)/commtax validate $(VALIDATION)/public_moe_runs.csv
	$(BIN)/commtax validate $(VALIDATION)/public_collectives.csv

# the 80% interval's residual table (catalog/intervals.json) from the dense runs: after any change to the model
intervals: $(STAMP)
	$(BIN)/python -m commtax.decide.intervals $(DENSE_RUNS)

# every goal line ends in "met" or "MISSED"; the last line counts the misses (speed depends on the machine)
bench: $(STAMP)
	@set -o pipefail; log=$$(mktemp); status=0; \
	for b in estimate simulate search; do \
	  echo "== benchmarks/bench_$$b.py"; $(BIN)/python benchmarks/bench_$$b.py 2>&1 | tee -a $$log || status=1; \
	done; \
	missed=$$(grep -c "MISSED" $$log); rm -f $$log; \
	if [ "$$missed" -gt 0 ]; then echo "make bench: $$missed goal(s) MISSED (lines marked MISSED above)"; \
	else echo "make bench: every goal met"; fi; \
	exit $$status

# the README's worked example and accuracy tables and docs/catalog.md's tables come from the code
# (tests/test_readme.py fails when they drift)
readme: $(STAMP)
	$(BIN)/python -m commtax.report.readme README.md docs/catalog.md

clean:
	rm -rf $(VENV) build src/*.egg-info
