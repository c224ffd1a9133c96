"""benchmarks/gpu.py's own logic, fast and on any machine: the time budget, what it skips and why, the table. The
script's whole path runs on a CPU in tests/benchmarks/test_quick.py (`--smoke`) and on a GPU in scripts/gpu_check.sh.
"""

import importlib.util
import time

import pytest
import torch

from benchmarks.gpu import QWEN2_05B, Budget, model_shape, tables, unavailable


def test_budget_allows_a_part_only_when_its_runs_end_in_time():
    budget = Budget(0.5)
    assert budget.allows(100)  # nothing timed yet: no estimate, the first part always runs
    budget.timed(lambda: time.sleep(0.2))()
    assert budget.longest_run_s >= 0.2
    assert budget.allows(1) and not budget.allows(3)
    assert Budget(None).allows(10**6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given without CUDA")
def test_qlora_is_skipped_without_cuda_and_says_why():
    assert unavailable("qlora") == "needs CUDA (bitsandbytes' 4-bit kernels)"
    assert unavailable("full") is None and unavailable("lora") is None


def test_qlora_without_bitsandbytes_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    assert unavailable("qlora") == "bitsandbytes is not installed"


def test_model_shape_is_qwen2_05b_on_a_gpu():
    shape = model_shape(24, cpu_check=False)
    assert shape == QWEN2_05B
    assert (shape["hidden_size"], shape["num_key_value_heads"], shape["vocab_size"]) == (896, 2, 151936)
    assert model_shape(2, cpu_check=True)["hidden_size"] == 64


def test_table_names_what_was_skipped_and_the_memory_against_full():
    side = {"steps_per_s": 1.0, "tokens_per_s": 100.0, "peak_gpu_mb": 4000.0}
    modes = {
        "full": {"sides": {"trl": side, "grpoflow": {**side, "steps_per_s_ratio": 0.98, "same_weights_as_trl": True}}},
        "lora": {"sides": {"trl": {**side, "peak_gpu_mb": 2000.0}, "grpoflow": {**side, "peak_gpu_mb": 1000.0}}},
    }
    text = tables({"modes": modes, "skipped": {"qlora": "bitsandbytes is not installed"}})
    assert "| lora | grpoflow training stage | 1 | 100 | 1 | 1,000 | 0.25 |" in text
    assert "Skipped: qlora: bitsandbytes is not installed." in text


def test_gpu_wheels_are_the_versions_the_tests_run_on():
    """scripts/prepare_gpu_wheels.sh pins what the GPU box lacks to this environment's versions: a bump here that
    the script misses would test one TRL here and another there."""
    import importlib.metadata
    import re
    import subprocess

    from benchmarks.common import REPO_ROOT

    script = REPO_ROOT / "scripts" / "prepare_gpu_wheels.sh"
    pins = dict(re.findall(r"\b([a-z][a-z0-9-]*)==([0-9][0-9a-z.]*)", script.read_text()))
    assert {"trl", "datasets", "pydantic", "pydantic-core", "bitsandbytes"} <= pins.keys()
    for name, version in pins.items():
        try:
            assert importlib.metadata.version(name) == version, name
        except importlib.metadata.PackageNotFoundError:
            assert name == "bitsandbytes", f"{name} is pinned for the GPU box but not installed here"  # an extra
    for name in ("prepare_gpu_wheels.sh", "gpu_check.sh"):
        assert subprocess.run(["bash", "-n", str(REPO_ROOT / "scripts" / name)]).returncode == 0
