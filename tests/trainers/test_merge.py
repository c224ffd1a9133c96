"""The merge stage: a LoRA adapter folded into its base with PEFT gives ordinary weights that load and generate like
the adapter did; model.json describes the artifact."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.core.jobdir import JobDir
from grpoflow.trainers.model import merge
from grpoflow.trainers.model.load import LORA_TARGETS
from grpoflow.trainers.model.tiny import build_tiny


@pytest.fixture
def lora_job(tmp_path) -> JobDir:
    """A job folder as a LoRA training leaves it: adapter/ (PEFT format, with the tokenizer), no merged/."""
    job = JobDir(tmp_path / "lora-job")
    base = AutoModelForCausalLM.from_pretrained(build_tiny())
    # Random B (PEFT's init_lora_weights=False), as after training: a fresh adapter's B is zero and merges to the base.
    config = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, init_lora_weights=False, task_type="CAUSAL_LM")
    torch.manual_seed(0)
    get_peft_model(base, config).save_pretrained(job.adapter)
    AutoTokenizer.from_pretrained(build_tiny()).save_pretrained(job.adapter)
    return job


def test_merged_weights_carry_the_adapter(lora_job):
    assert merge.main(str(lora_job.root)) == 0

    base, merged = load_file(build_tiny() / "model.safetensors"), load_file(lora_job.merged / "model.safetensors")
    assert merged.keys() == base.keys()  # ordinary weights: no lora_A/lora_B, no base_model.model prefix
    adapted = [k for k in base if k.endswith(".weight") and k.rsplit(".", 2)[-2] in LORA_TARGETS]
    assert len(adapted) == 3 * len(LORA_TARGETS)  # every projection of the tiny model's 3 layers
    assert all(not torch.equal(base[k], merged[k]) for k in adapted)  # each one changed by the merge
    assert all(
        torch.equal(base[k], merged[k]) for k in base.keys() - set(adapted)
    )  # the rest (biases too) is the base's


def test_merged_model_loads_and_generates_like_the_adapter(lora_job):
    merge.main(str(lora_job.root))
    tokenizer = AutoTokenizer.from_pretrained(lora_job.merged)  # saved with its tokenizer
    merged = AutoModelForCausalLM.from_pretrained(lora_job.merged).eval()
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(build_tiny()), lora_job.adapter).eval()
    enc = tokenizer("What is 2+3?", return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(merged(**enc).logits, adapter(**enc).logits, atol=1e-4)
        a = merged.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        b = adapter.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert a.shape[1] > enc["input_ids"].shape[1] and torch.equal(a, b)


def test_model_json_of_a_lora_job(lora_job):
    merge.main(str(lora_job.root))
    info = json.loads(lora_job.model_json.read_text())
    assert info["artifact_type"] == "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(info["files"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(info["merged_files"])
    assert "adapter_config.json" not in info["merged_files"]


def test_a_second_merge_replaces_merged(lora_job):
    merge.main(str(lora_job.root))
    (lora_job.merged / "stale.bin").write_text("from an earlier merge")
    merge.main(str(lora_job.root))
    assert not (lora_job.merged / "stale.bin").exists()
    assert sorted(p.name for p in lora_job.root.iterdir()) == ["adapter", "merged", "model.json"]  # no staging left


def test_a_full_finetune_only_gets_model_json(tmp_path):
    job = JobDir(tmp_path / "full-job")
    shutil.copytree(build_tiny(), job.merged)
    before = {p.name: p.stat().st_mtime_ns for p in job.merged.iterdir()}
    assert merge.main(str(job.root)) == 0
    assert {p.name: p.stat().st_mtime_ns for p in job.merged.iterdir()} == before  # merged/ left as training saved it
    info = json.loads(job.model_json.read_text())
    assert info["artifact_type"] == "full" and info["files"] == info["merged_files"]
    assert "model.safetensors" in info["files"]


# What a merge printed into a log before grpoflow silenced it, each on its own: bitsandbytes' warning about an optional
# kernel package (on CPUs with AVX512-BF16), PEFT's read of a deprecated transformers property, and two progress bars.
MERGE_NOISE = (
    "No module named 'kernels'",
    "FutureWarning",
    "is_gradient_checkpointing",
    "Loading weights",
    "Writing model shards",
    "it/s]",
)


def test_a_merge_logs_nothing_but_its_work(lora_job):
    # The merge stage as a log receives it: its output to a pipe, not a terminal.
    done = subprocess.run(
        [sys.executable, "-m", "grpoflow.trainers.model.merge", str(lora_job.root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (lora_job.merged / "model.safetensors").exists()
    output = done.stdout + done.stderr
    assert [noise for noise in MERGE_NOISE if noise in output] == [], output[-2000:]


def test_model_json_names_the_job_a_warm_start_came_from(tmp_path):
    """A job whose base_model is an earlier job's merged model (a warm start) records that job as its parent."""
    first = JobDir(tmp_path / "first-20261206-000000-000000")
    shutil.copytree(build_tiny(), first.merged)
    assert merge.main(str(first.root)) == 0
    second = JobDir(tmp_path / "second-20261206-000001-000000")
    shutil.copytree(build_tiny(), second.merged)
    second.spec.write_text(yaml.safe_dump({"name": "second", "base_model": str(first.merged)}))
    assert merge.main(str(second.root)) == 0
    assert json.loads(second.model_json.read_text())["parent"] == first.job_id
    assert "parent" not in json.loads(first.model_json.read_text())
