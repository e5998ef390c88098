# The two commands: `make demo` and `make test`. Each creates the virtual environment .venv and installs the
# project into it on first use (again when pyproject.toml changes); nothing else needs installing but make and
# Python 3.11 or newer.
#
#   make demo                         hetswarm demo (extra options: make demo DEMO_ARGS="--steps 20")
#   make test                         ruff check, then the test suite (extra args: make test PYTEST_ARGS=-x)
#   make test-quick                   the tests that start no process and time nothing: 90 s, for the inner loop
#   make lint                         ruff check only
#   make clean                        remove .venv and the caches

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# python3.11 where there is one (as CI uses), else python3; `make PYTHON=python3.12` picks another.
PYTHON ?= $(shell python3.11 -c "" >/dev/null 2>&1 && echo python3.11 || echo python3)
# Pinned: an unpinned torch pulls gigabytes of CUDA libraries.
TORCH := torch==2.13.0
PYTEST_ARGS ?=
DEMO_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help demo test test-quick lint clean

help:
	@sed -n 's/^#   //p' Makefile

demo: $(STAMP)
	$(BIN)/hetswarm demo $(DEMO_ARGS)

# Two passes: everything but the `timing` tests on two xdist workers (each swarm module a group of its own), then the
# `timing` tests alone, so that no load skews what they measure. A pass that selects no test (exit 5) is no failure.
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "not timing" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	$(BIN)/python -m pytest -p no:xdist -m timing $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-quick: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not swarm and not timing" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

$(BIN)/python:
	@$(PYTHON) -c "import sys; sys.exit(sys.version_info < (3, 11))" || \
		{ echo "hetswarm needs Python 3.11 or newer; $(PYTHON) is older (try: make PYTHON=python3.11)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The stamp is touched only after a successful install, so a failed or interrupted one runs again next time.
# Bytecode is compiled once after the install, on every core: pip compiles file by file (69 s of the install on
# 2 cores, against 21 s + 16 s this way). It must exist before the tests: with PYTHONDONTWRITEBYTECODE set, every
# process would compile torch again. compileall's errors are ignored, as pip ignores them (torch ships a
# Python 3.12-only file).
$(STAMP): pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install --no-compile "$(TORCH)" -e ".[test]"
	-$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
