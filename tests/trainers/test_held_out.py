"""Held-out scores during training (`evaluation.every`) and the best checkpoint (`evaluation.select: best`), on real
short GRPO runs of builtin:tiny in this process: the score on each evaluated step's line of metrics.jsonl, the step
the Trainer kept and the model saved from it, evaluation.json's series, the report. The kill-and-resume exactness of
both is tests/trainers/test_grpo.py::test_killed_and_resumed_matches_uninterrupted."""

import json

import pytest
import torch
from safetensors.torch import load_file

from grpoflow.jobs.report import write_report
from grpoflow.trainers import grpo
from grpoflow.trainers.metrics import read_metrics

VARIETY = {"name": "variety", "function": "tests.trainers.held_out_metric:variety"}


def held_out_job(make_job, lora_rank=None, select="best"):
    return make_job(
        "ho",
        hyperparameters={"max_steps": 6, "lora_rank": lora_rank, "learning_rate": 5e-3},
        evaluation={"holdout": 4, "every": 2, "select": select, "metric": VARIETY},
    )


def scores(job) -> dict[int, float]:
    return {r["step"]: r["values"]["eval/variety"] for r in read_metrics(job.metrics) if "eval/variety" in r["values"]}


@pytest.mark.parametrize("lora_rank", [None, 4], ids=["full", "lora"])
def test_the_best_checkpoint_is_the_model_saved(make_job, lora_rank):
    job, _ = held_out_job(make_job, lora_rank)
    assert grpo.main(str(job.root)) == 0

    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # one line per step, evaluated or not
    assert all("reward" in r["values"] for r in records)
    scored = scores(job)
    assert list(scored) == [2, 4, 6] and all(0 < v <= 1 for v in scored.values())
    best = max(scored, key=lambda step: (scored[step], -step))  # the earliest of equal scores
    result = json.loads(job.training_result.read_text())
    assert (result["global_step"], result["selected_step"]) == (6, best)

    checkpoint = job.checkpoints / f"checkpoint-{best}"
    assert checkpoint.is_dir()  # the rotation (two checkpoints kept) keeps the best
    name = "adapter_model.safetensors" if lora_rank else "model.safetensors"
    saved, kept = load_file((job.adapter if lora_rank else job.merged) / name), load_file(checkpoint / name)
    assert saved.keys() == kept.keys() and all(torch.equal(saved[k], kept[k]) for k in saved)


def test_the_series_and_after_are_the_kept_models(make_job):
    job, spec = held_out_job(make_job)
    assert grpo.main(str(job.root)) == 0  # a full fine-tune: its child scores before and after itself
    scored, evaluation = scores(job), json.loads(job.evaluation.read_text())
    best = json.loads(job.training_result.read_text())["selected_step"]
    assert evaluation["metric"] == "variety" and evaluation["select"] == "best"
    assert evaluation["selected_step"] == best
    assert evaluation["series"] == [{"step": 0, "score": evaluation["before"]}] + [
        {"step": step, "score": score} for step, score in scored.items()
    ]
    assert evaluation["after"] == pytest.approx(scored[best])  # "after" is the kept checkpoint's model, greedy again

    report = write_report(job, spec, evaluation, []).read_text()
    assert f"**Model kept:** step {best}, the best held-out score during training" in report
    assert "![held_out](held_out.png)" in report and (job.root / "held_out.png").stat().st_size > 0
    assert "| step | held-out variety | training reward (mean since the row before) |" in report


def test_select_last_keeps_the_last_step(make_job):
    job, _ = held_out_job(make_job, select="last")
    assert grpo.main(str(job.root)) == 0
    assert list(scores(job)) == [2, 4, 6]
    evaluation = json.loads(job.evaluation.read_text())
    assert evaluation["selected_step"] == 6 and evaluation["after"] == pytest.approx(scores(job)[6])
