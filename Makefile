# grpoflow: `make demo` and `make test` work on a fresh machine (they create .venv and install into it).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0

.PHONY: install demo test test-fast lint format bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch (asked for by trl/peft) would pull a multi-GB CUDA build.
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	$(PIP) install --quiet -e ".[dev,qlora]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/grpoflow demo

test: $(STAMP)
	$(VENV)/bin/pytest -q

test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow"

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
