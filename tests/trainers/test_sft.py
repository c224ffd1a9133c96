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
        ({}, {"save_strategy": "steps", "report_to": [], "lr_scheduler_type": "cosine"}),  # sft/ is the output
        ({"sft": {"max_steps": 30}}, {"save_steps": 3, "save_total_limit": 1}),  # the newest, every tenth of the run
        ({"sft": {"max_steps": 5}}, {"save_steps": 1}),  # a short one: at every step
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
    assert not job.sft_checkpoints.exists() and not (job.root / ".sft-staging").exists()


def test_a_stopped_warm_up_goes_on_from_its_checkpoint(make_job, monkeypatch, capsys):
    from trl import SFTTrainer

    job, _ = make_job("sft", sft={"enabled": True, "max_steps": 2, "learning_rate": 3e-3, "batch_size": 4})
    steps, step = [], SFTTrainer.training_step

    def stopped_at_step_2(self, *args, **kwargs):
        steps.append(self.state.global_step + 1)
        if len(steps) == 2:
            raise KeyboardInterrupt  # a cancel during step 2, after step 1's checkpoint (one every step here)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", stopped_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        sft.main(str(job.root))
    assert [p.name for p in job.sft_checkpoints.glob("checkpoint-*")] == ["checkpoint-1"] and not job.sft.exists()
    steps.clear()
    monkeypatch.setattr(SFTTrainer, "training_step", lambda self, *a, **k: steps.append(self.state.global_step + 1)
                        or step(self, *a, **k))  # fmt: skip
    assert sft.main(str(job.root)) == 0
    assert steps == [2]  # step 1 is not trained again
    assert "training 2 steps; resuming from checkpoint-1" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(job.root / "sft_metrics.jsonl")] == [1, 2] and differs(job.sft)
    assert not job.sft_checkpoints.exists()


def test_the_newest_intact_sft_checkpoint_is_resumed(tmp_path):
    from grpoflow.core.jobdir import JobDir

    job = JobDir(tmp_path)
    for n, state in ((2, '{"global_step": 2}'), (4, '{"global_step": 4}'), (6, '{"global_st')):  # 6: torn mid-save
        (job.sft_checkpoints / f"checkpoint-{n}").mkdir(parents=True)
        (job.sft_checkpoints / f"checkpoint-{n}" / "trainer_state.json").write_text(state)
    (tmp_path / "sft_metrics.jsonl").write_text("".join(f'{{"step": {n}, "values": {{}}}}\n' for n in range(1, 7)))
    assert sft.resume_sft_checkpoint(job, tidy=False) == str(job.sft_checkpoints / "checkpoint-4")
    assert (job.sft_checkpoints / "checkpoint-6").exists()  # another rank only looks
    assert sft.resume_sft_checkpoint(job) == str(job.sft_checkpoints / "checkpoint-4")
    assert not (job.sft_checkpoints / "checkpoint-6").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "sft_metrics.jsonl")] == [1, 2, 3, 4]
    (tmp_path / "new").mkdir()
    assert sft.resume_sft_checkpoint(JobDir(tmp_path / "new")) is None  # a first run: from step 0
