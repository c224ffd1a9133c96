"""The SFT format warm-up: the rows it trains on, its TRL config, and a real run on builtin:tiny that writes sft/ as
an ordinary model folder (LoRA adapters merged in)."""

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpoflow.core.spec import load_spec
from grpoflow.trainers import sft
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.tiny import build_tiny
from grpoflow.trainers.sft import sft_config, sft_dataset


def spec_with(**changes):
    data = {
        "name": "s",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "d.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "sft": {"enabled": True},
    }
    for key, value in changes.items():
        data[key] = {**data.get(key, {}), **value}
    return load_spec(data)[0]


USER = {"role": "user", "content": "2+3?"}
SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize(
    "row, changes, expected",
    [
        # A string prompt imitates a string completion.
        ({"prompt": "2+3?", "completion": "5", "answer": "5"}, {}, {"prompt": "2+3?", "completion": "5"}),
        # A chat prompt gets an assistant message as its completion.
        (
            {"prompt": [USER], "completion": "5"},
            {},
            {"prompt": [USER], "completion": [{"role": "assistant", "content": "5"}]},
        ),
        # A system prompt makes a string prompt a chat, so the completion is a message too.
        (
            {"prompt": "2+3?", "completion": "5"},
            {"hyperparameters": {"system_prompt": "Be brief."}},
            {"prompt": [SYSTEM, USER], "completion": [{"role": "assistant", "content": "5"}]},
        ),
        # Another completion column: its values, as text, replace a `completion` column the data also has.
        (
            {"prompt": "2+3?", "completion": "stale", "answer": 5},
            {"sft": {"completion_column": "answer"}},
            {"prompt": "2+3?", "completion": "5"},
        ),
        # The spec's prompt column becomes TRL's `prompt`.
        (
            {"question": "2+3?", "completion": "5"},
            {"dataset": {"prompt_column": "question"}},
            {"prompt": "2+3?", "completion": "5"},
        ),
    ],
)
def test_sft_dataset(row, changes, expected):
    rows = sft_dataset(Dataset.from_list([row]), spec_with(**changes))
    assert rows.column_names == ["prompt", "completion"]  # nothing else reaches SFTTrainer
    assert rows[0] == expected


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {"sft": {"max_steps": 200, "learning_rate": 3e-3, "batch_size": 4}},
            {"max_steps": 200, "learning_rate": 3e-3, "per_device_train_batch_size": 4, "warmup_steps": 20},
        ),
        ({"sft": {"max_steps": 30}}, {"warmup_steps": 3, "logging_steps": 1}),  # warm-up a tenth of the steps
        ({"sft": {"max_steps": 1000}}, {"warmup_steps": 20, "logging_steps": 20}),  # at most 20; ~50 log lines
        ({"hyperparameters": {"seed": 7}}, {"seed": 7, "data_seed": 7}),  # the job's seed
        ({}, {"save_strategy": "no", "report_to": [], "lr_scheduler_type": "cosine"}),  # sft/ is the only output
    ],
)
def test_sft_config(tmp_path, changes, expected):
    config = sft_config(spec_with(**changes), tmp_path / "work")
    assert {k: getattr(config, k) for k in expected} == expected


def differs(folder) -> bool:
    base, trained = load_file(build_tiny() / "model.safetensors"), load_file(folder / "model.safetensors")
    assert trained.keys() == base.keys()  # an ordinary model folder, whatever was trained
    return any(not torch.equal(base[k], trained[k]) for k in base)


@pytest.mark.parametrize(
    "hyperparameters",
    [
        {},  # full fine-tune
        {"lora_rank": 4},  # LoRA adapters, merged in before saving
    ],
)
def test_warm_up_writes_a_trained_model_folder(make_job, hyperparameters):
    job, _ = make_job(
        "sft",
        sft={"enabled": True, "max_steps": 2, "learning_rate": 3e-3, "batch_size": 4},
        hyperparameters=hyperparameters,
    )
    assert sft.main(str(job.root)) == 0
    assert differs(job.sft)  # trained
    assert not (job.sft / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(job.sft)
    assert model.config.model_type == "qwen2" and (job.sft / "tokenizer.json").exists()
    assert [r["step"] for r in read_metrics(job.root / "sft_metrics.jsonl")] == [1, 2]
    assert not (job.root / ".sft-work").exists() and not (job.root / ".sft-staging").exists()
