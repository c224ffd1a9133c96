#!/usr/bin/env bash
# Downloads, here (where PyPI can be reached), the wheels the GPU check needs on a machine that has none of them and
# no network: an H200 box with Python 3.12, torch 2.11, transformers 5.17, peft, accelerate, pyarrow, pandas, pytest
# (its image's list: /work/.library/device/KINDS.md) but no trl, datasets, pydantic or bitsandbytes.
#
#     scripts/prepare_gpu_wheels.sh [DEST]        # DEST defaults to gpu-wheels/ (ignored by git)
#
# Then `scripts/gpu_check.sh` on that machine installs them with `pip install --no-index --no-deps`. The versions are
# the ones this repository's tests run on (the .venv), so the GPU box trains with the same TRL and datasets.
# pyarrow (55 MB for cp312) is left out: the box has one, and pyarrow with bitsandbytes (43 MB) would not fit the
# 60 MiB budget; bitsandbytes is worth more (QLoRA's peak memory is one of the figures).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-gpu-wheels}
BUDGET_MIB=60
WHEELS=(
    trl==1.16.0
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19   # datasets and the deps of it the box lacks
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0                            # pydantic 2.14 needs >= 4.16; the box's may be older
    bitsandbytes==0.50.2                                 # QLoRA (NF4); CUDA kernels inside the wheel
)
rm -rf "$DEST" && mkdir -p "$DEST"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$DEST" "${WHEELS[@]}"
ls -l "$DEST"
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "total: $((total / 1048576)) MiB in $(ls "$DEST"/*.whl | wc -l) wheels (budget ${BUDGET_MIB} MiB)"
if ((total > BUDGET_MIB * 1048576)); then
    echo "over the ${BUDGET_MIB} MiB budget" >&2
    exit 1
fi
