"""The merge task: a LoRA job's adapter merged into merged/ and announced; a full fine-tune only described."""

import json
import logging
import shutil

import pytest
import torch
from peft import LoraConfig, get_peft_model
from prefect import flow
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.tasks.merge import merge_task
from grpoflow.trainers.metrics import read_events
from grpoflow.trainers.model.load import LORA_TARGETS, weights_size
from grpoflow.trainers.model.tiny import build_tiny

pytestmark = pytest.mark.usefixtures("prefect_server")


def merge(job, spec):
    return flow(lambda: merge_task(job, spec))()


def save_adapter(folder) -> None:
    """A LoRA adapter as training leaves it (B not zero, so the merge changes the weights), with the tokenizer."""
    config = LoraConfig(r=4, target_modules=LORA_TARGETS, init_lora_weights=False, task_type="CAUSAL_LM")
    torch.manual_seed(0)
    get_peft_model(AutoModelForCausalLM.from_pretrained(build_tiny()), config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(build_tiny()).save_pretrained(folder)


def test_a_lora_job_is_merged_and_announced(make_job, caplog):
    job, spec = make_job("lora", hyperparameters={"lora_rank": 4})
    save_adapter(job.adapter)
    with caplog.at_level(logging.INFO, logger="prefect.task_runs"):
        info = merge(job, spec)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("merge: ")]
    assert said[:3] == [
        f"merge: loading the base model {build_tiny()} ({weights_size(str(build_tiny()))}) with adapter/",
        "merge: folding the adapter into the weights",
        "merge: writing merged/",
    ]
    assert said[3].startswith("merge: merged/ written in ") and len(said) == 4  # each phase as it starts
    assert info["artifact_type"] == "adapter" and info == json.loads(job.model_json.read_text())
    merged = AutoModelForCausalLM.from_pretrained(job.merged)  # ordinary weights
    base = AutoModelForCausalLM.from_pretrained(build_tiny())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[q], base.state_dict()[q])
    [event] = read_events(job.events)
    assert event["event"] == "grpoflow.adapter.merged"
    assert event["payload"] == {"artifact_type": "adapter", "merged_files": info["merged_files"]}

    assert merge(job, spec) == info  # a resumed job does not merge again
    assert len(read_events(job.events)) == 1


def test_a_full_finetune_is_described_not_announced(make_job):
    job, spec = make_job("full")
    shutil.copytree(build_tiny(), job.merged)
    info = merge(job, spec)
    assert info["artifact_type"] == "full" and "model.safetensors" in info["files"]
    assert not job.events.exists()  # nothing was merged
