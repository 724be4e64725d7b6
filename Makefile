# Two commands do all set-up on a fresh machine (Python 3.11 + pip):
#   make dev    build .venv, then run the main job
#   make test   build .venv, then run ruff, mypy and the fast test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev test test-long chaos bench lint clean proto

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/raftmq dev

proto: $(STAMP)
	$(BIN)/python -m raftmq.api.codegen

# The suite runs on xdist workers (pyproject's addopts), except the tests marked serial,
# which run after it on their own: their verdict rests on a fixed deadline that a machine
# busy with other workers' brokers can miss (Spark gives a Python worker 10 s to connect
# back; a move's CLI must finish within a dead broker's 6 s session; the toxiproxy tests
# bound latencies in milliseconds).
#
# Property tests run with a fixed seed here, so a verdict is the code's and not the draw's
# (a random draw found a wrong oracle in CI once, for code that had not changed); run
# pytest without it to explore new examples. Failures print native tracebacks: pytest's
# own formatting parses the test's source, and CPython 3.11.7's parser (gh-106905) then
# raised SystemError and took the whole xdist session down with the failure unreported.
FAST := not long and not chaos
SEEDED := --hypothesis-seed=0 --tb=native
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q $(SEEDED) -m '$(FAST) and not serial'
	$(BIN)/pytest -q $(SEEDED) -n 0 -m '$(FAST) and serial'

test-long: $(STAMP)
	$(BIN)/pytest -q -m long

chaos: $(STAMP)
	$(BIN)/pytest -q -m chaos

bench: $(STAMP)
	$(BIN)/python -m benchmarks.log_bench --quick

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) raftmq-data .pytest_cache .hypothesis
