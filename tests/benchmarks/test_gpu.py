"""What `scripts/gpu_check.sh` runs with `pytest -m gpu`: grpoflow's training stage on a CUDA GPU (bf16 full
fine-tune, QLoRA) and TRL's paged generation engine, each on builtin:tiny in this process, so they fit in the check's
two minutes. They import trainers/ and benchmarks/ only (the GPU box has no prefect); without CUDA they are skipped.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.trainer_vs_trl import NO_CHECKPOINTS, Workload, prepare_job
from benchmarks.workloads import write_dataset
from grpoflow.core.jobdir import JobDir
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.tiny import resolve_model_path

pytestmark = pytest.mark.gpu


def train(tmp_path, **hyperparameters) -> JobDir:
    """Two GRPO steps of the training stage (`grpoflow.trainers.grpo.main`) on a job folder made without Prefect."""
    from grpoflow.trainers.grpo import main

    dataset = write_dataset(tmp_path / "prompts.jsonl", "demo-shaped", 2, zero_variance_share=0.0)
    w = Workload("gpu-test", dataset, max_steps=2, max_response_length=16, **hyperparameters, **NO_CHECKPOINTS)
    job = prepare_job(w, tmp_path)
    assert main(str(job.root)) == 0
    return job


def test_full_fine_tune_trains_in_bf16_on_cuda(tmp_path):
    job = train(tmp_path, learning_rate=1e-3)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]
    result = json.loads(job.training_result.read_text())
    trained = load_file(next((job.root / result["artifact_dir"]).glob("*.safetensors")))
    start = load_file(Path(resolve_model_path("builtin:tiny")) / "model.safetensors")
    name = next(n for n in trained if n.endswith("q_proj.weight"))
    assert trained[name].dtype == torch.bfloat16  # the GPU supports bf16: the job trains and saves in it
    assert not torch.equal(trained[name].float(), start[name].float())


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="QLoRA needs bitsandbytes")
def test_qlora_trains_an_adapter_on_a_4bit_base(tmp_path):
    job = train(tmp_path, learning_rate=1e-2, lora_rank=8, load_in_4bit=True)
    result = json.loads(job.training_result.read_text())
    adapter = load_file(job.root / result["artifact_dir"] / "adapter_model.safetensors")
    lora_b = [t for n, t in adapter.items() if "lora_B" in n]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # PEFT starts lora_B at zero: it moved


@pytest.mark.parametrize("paged", [False, True], ids=["transformers-engine", "paged-engine"])
def test_trl_generation_engines_generate_on_cuda(tmp_path, paged):
    from benchmarks.gpu import generation_speed

    dataset = write_dataset(tmp_path / "prompts.jsonl", "demo-shaped", 3, zero_variance_share=0.0)
    model = resolve_model_path("builtin:tiny")
    speed = generation_speed(model, dataset, tmp_path / "out", paged=paged, steps=3, length=16)
    assert speed["calls_timed"] == 2 and speed["tokens"] > 0 and speed["tokens_per_s"] > 0
