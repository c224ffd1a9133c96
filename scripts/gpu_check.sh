#!/usr/bin/env bash
# The GPU check, in one command on a bare machine with one CUDA GPU and no network (an H200 box: Python 3.12, torch,
# transformers, peft, accelerate, pytest; no trl, datasets, pydantic, bitsandbytes or prefect):
#
#     scripts/gpu_check.sh [OUT_DIR]        # OUT_DIR defaults to $OUT, else gpu-check-out/
#
# Run it from a copy of the repository holding gpu-wheels/ (made here by scripts/prepare_gpu_wheels.sh). It installs
# the wheels into /tmp/gpu-site (nothing is fetched), runs the `gpu`-marked tests, then the canary (`grpoflow canary
# SPEC --json`: one full-length step, its peak memory, the projection) for each configuration the benchmark tries, then
# `benchmarks.gpu` (grpoflow vs a TRL script, full/LoRA/QLoRA peak memory, transformers vs paged generation), each
# under its own time limit so the whole check ends within 9 minutes; writes OUT_DIR/{versions.txt,pytest.log,
# canary.log,canary.json,benchmark.log,gpu.json,gpu.md} and prints the tables. Nothing here imports prefect: the tests
# it runs, the canary command and the benchmark use grpoflow.trainers, grpoflow.jobs and benchmarks/ only.
# Exit code: 0 when the tests, the canaries and the benchmark passed, else 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu-check-out}}
PYTHON=${PYTHON:-python3}
TESTS_S=${TESTS_S:-120}       # the gpu-marked tests
CANARY_S=${CANARY_S:-120}     # the canaries of every configuration together (their specs and model included)
BENCH_S=${BENCH_S:-270}       # the benchmark's hard limit; it plans its parts within BENCH_S - 40 (--budget-s)
mkdir -p "$OUT_DIR"
started=$SECONDS

# --- the wheels the machine lacks (into their own folder, first on the path; the machine's packages stay as they are)
ls gpu-wheels/*.whl >/dev/null 2>&1 || { echo "no gpu-wheels/: run scripts/prepare_gpu_wheels.sh first" >&2; exit 1; }
timeout 120 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu-site gpu-wheels/*.whl || { echo "installing gpu-wheels/ failed" >&2; exit 1; }
# grpoflow's one import root without installing it: /tmp/gpu-src/grpoflow/ links each layer folder under the name
# pyproject.toml's package-dir installs it as (grpoflow.trainers -> trainers/, ...); the checkout itself stays on the
# path for tests/ and benchmarks/.
rm -rf /tmp/gpu-src && "$PYTHON" - <<'PY' || { echo "linking grpoflow's layers failed" >&2; exit 1; }
import os, tomllib
for package, folder in tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].items():
    path = os.path.join("/tmp/gpu-src", *package.split("."))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if "." in package:  # a layer: its folder, linked
        os.symlink(os.path.abspath(folder), path)
    else:  # grpoflow itself: a folder of its own, its files linked (the layers' links go beside them)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(folder):
            os.symlink(os.path.abspath(os.path.join(folder, name)), os.path.join(path, name))
PY
export PYTHONPATH="/tmp/gpu-src:$PWD:/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
"$PYTHON" - <<'PY' 2>&1 | tee "$OUT_DIR/versions.txt"
import importlib.metadata as md
import torch
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible")
for name in ("torch", "transformers", "trl", "datasets", "peft", "accelerate", "bitsandbytes", "pyarrow", "pydantic",
             "huggingface_hub", "fsspec", "pytest"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY

# --- the gpu-marked tests (every test file that marks one; conftest skips them without CUDA)
status=0
mapfile -t files < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
if ((${#files[@]} == 0)); then
    echo "no test file marks a test gpu" | tee "$OUT_DIR/pytest.log"
    status=1
else
    echo "--- pytest -m gpu ${files[*]}"
    timeout "$TESTS_S" "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors "${files[@]}" \
        2>&1 | tee "$OUT_DIR/pytest.log" || status=1
fi

# --- the canary first, for each configuration the benchmark tries: canary.json {configuration: canary's object}
echo "--- grpoflow canary per configuration  (after $((SECONDS - started)) s)"
canary_started=$SECONDS
mapfile -t specs < <(timeout "$CANARY_S" "$PYTHON" -m benchmarks.canary --gpu-specs /tmp/gpu-canary 2>"$OUT_DIR/canary.log")
((${#specs[@]} > 0)) || { status=1; echo "writing the canaries' specs failed" >>"$OUT_DIR/canary.log"; }
for spec in "${specs[@]}"; do
    left=$((CANARY_S - (SECONDS - canary_started)))
    name=$(basename "$spec" .yaml)
    if ((left < 10)); then
        echo "$name: not run (CANARY_S spent)" | tee -a "$OUT_DIR/canary.log"; status=1; continue
    fi
    timeout "$left" "$PYTHON" -m grpoflow.flows.cli canary "$spec" --json >"/tmp/gpu-canary/$name.json" \
        2>>"$OUT_DIR/canary.log" || status=1
done
"$PYTHON" - "$OUT_DIR/canary.json" "${specs[@]}" <<'PY' || status=1
import json, pathlib, sys
found = {}
for spec in map(pathlib.Path, sys.argv[2:]):
    answer = spec.with_suffix(".json")
    found[spec.stem] = json.loads(answer.read_text()) if answer.exists() and answer.read_text().strip() else None
pathlib.Path(sys.argv[1]).write_text(json.dumps(found, indent=2) + "\n")
for name, c in found.items():
    print(f"canary {name}: " + ("no answer (see canary.log)" if c is None else f"{c['status']}, peak {c['peak_memory_gb']}"
          f" GB of {c['device_memory_gb']} GB, step {c['step_seconds']} s, {c['tokens_per_second']} tokens/s, "
          f"{c['canary_seconds']} s in all" + (f"; {c['reason']}" if c["reason"] else "")))
PY

# --- the benchmark (it rewrites its JSON after each part: a run cut short keeps what it measured)
echo "--- python -m benchmarks.gpu  (after $((SECONDS - started)) s)"
timeout "$BENCH_S" "$PYTHON" -m benchmarks.gpu --json "$OUT_DIR/gpu.json" --budget-s $((BENCH_S - 40)) \
    >"$OUT_DIR/benchmark.log" 2>&1 || { status=1; tail -40 "$OUT_DIR/benchmark.log"; }
if [[ -f "$OUT_DIR/gpu.md" ]]; then
    cat "$OUT_DIR/gpu.md"
elif [[ -f "$OUT_DIR/gpu.json" ]]; then
    "$PYTHON" -c "import json, sys; print(json.load(open(sys.argv[1]))['table'])" "$OUT_DIR/gpu.json"
fi
echo "--- gpu check: $([[ $status == 0 ]] && echo passed || echo FAILED) in $((SECONDS - started)) s; files in $OUT_DIR"
exit $status
