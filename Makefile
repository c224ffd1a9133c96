# grpoflow: `make demo` and `make test` work on a fresh machine (they create .venv and install into it).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0

.PHONY: install constraints demo test test-fast lint format bench clean

$(STAMP): pyproject.toml constraints.txt scripts/install.sh
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned (an unpinned torch, asked for by trl/peft, would pull a multi-GB CUDA build); then every
	# other package at the version the tests ran on (constraints.txt; `make constraints` rewrites it). The Dockerfile
	# installs with the same script.
	TORCH_VERSION=$(TORCH_VERSION) scripts/install.sh $(PY) dev,qlora,math,graders,gguf
	scripts/install_sandbox.sh
	touch $(STAMP)

install: $(STAMP)

# Rewrites constraints.txt from what .venv holds now: after `$(PIP) install -U <package>` or a new dependency in
# pyproject.toml, run this and `make test`, then commit both. torch stays pinned by TORCH_VERSION, grpoflow is ours.
constraints: $(STAMP)
	{ printf '%s\n' \
		'# The exact versions the test suite ran on: `make install` installs with `pip install -c constraints.txt`.' \
		'# Generated from .venv by `make constraints` (pip freeze, less grpoflow and torch, which the Makefile pins' \
		'# as TORCH_VERSION). To upgrade: `.venv/bin/pip install -U <package>`, `make constraints`, `make test`.'; \
	  $(PIP) freeze --exclude-editable | grep -viE '^(torch|grpoflow)[=@ ]'; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	cp constraints.txt flows/templates/project/constraints.txt  # what `grpoflow init` writes for a project's image
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/grpoflow demo

# pytest-xdist: one worker per core (at most 4), each test file on one worker (its module fixtures, such as a Prefect
# stack, start once); `pytest` alone runs in one process. The suite is mostly processes waiting on each other.
XDIST := -n auto --maxprocesses 4 --dist loadfile

test: $(STAMP)
	$(VENV)/bin/pytest -q $(XDIST)

test-fast: $(STAMP)
	$(VENV)/bin/pytest -q $(XDIST) -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) runs .pytest_cache
