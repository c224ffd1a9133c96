#!/usr/bin/env bash
# Installs grpoflow and everything it needs into PYTHON's environment, at the versions the test suite ran on: the one
# install command of CI (`make install`, which `.ci/run`'s `make test` runs first) and of the image (Dockerfile).
# Run it from the project folder:
#
#   scripts/install.sh .venv/bin/python dev,qlora,math,graders    # make install, in grpoflow's checkout
#   scripts/install.sh python qlora,math                   # the Dockerfile
#
# In grpoflow's checkout it installs the checkout (editable); in a project of `grpoflow init`, grpoflow at
# GRPOFLOW_VERSION from the package index pip is set up with, or from a wheel in the project's wheels/ folder.
# TORCH_VERSION (default 2.13.0) pins torch, installed first and on its own: an unpinned torch (asked for by
# trl/peft) would pull another build; where the environment holds that version already (the image's CUDA build), pip
# keeps it. Every other package is held to constraints.txt.
set -euo pipefail

python=$1
extras=$2
torch_version=${TORCH_VERSION:-2.13.0}

"$python" -m pip install --quiet --upgrade pip
"$python" -m pip install --quiet -c constraints.txt "torch==$torch_version"
if grep -q '^name = "grpoflow"$' pyproject.toml 2>/dev/null; then
    "$python" -m pip install --quiet -c constraints.txt -e ".[$extras]"
else
    "$python" -m pip install --quiet -c constraints.txt --find-links wheels \
        "grpoflow[$extras]==${GRPOFLOW_VERSION:?set GRPOFLOW_VERSION: the grpoflow this project runs on}"
fi
if [[ ",$extras," == *",dev,"* ]]; then
    # trackio, the local tracker the tests read TRL's completion tables back from, without its dependencies: they
    # would add uvicorn[standard] (uvloop under every Prefect server of the suite) and hold pillow below 13
    "$python" -m pip install --quiet --no-deps -c constraints.txt trackio gradio_client brotli python-multipart
fi
