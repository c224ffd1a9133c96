"""Held-out scores during training (`evaluation.every`) and the best checkpoint (`evaluation.select: best`), on real
short GRPO runs of builtin:tiny in this process: the score on each evaluated step's line of metrics.jsonl, the step
the Trainer kept and the model saved from it, evaluation.json's series, the report. The kill-and-resume exactness of
both is tests/trainers/test_grpo.py::test_killed_and_resumed_matches_uninterrupted."""

import doctest
import json

import pytest
import torch
from safetensors.torch import load_file

from grpoflow.core.scores import beats, change
from grpoflow.jobs.report import write_report
from grpoflow.trainers import grpo, held_out
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.tiny import build_tiny

VARIETY = {"name": "variety", "function": "tests.trainers.held_out_metric:variety"}


def held_out_job(make_job, lora_rank=None, select="best"):
    return make_job(
        "ho",
        hyperparameters={"max_steps": 6, "lora_rank": lora_rank, "learning_rate": 5e-3},
        evaluation={"holdout": 4, "every": 2, "select": select, "metric": VARIETY},
    )


def assert_same_weights(a, b) -> None:
    saved, kept = load_file(a), load_file(b)
    assert saved.keys() == kept.keys() and all(torch.equal(saved[k], kept[k]) for k in saved)


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
    if lora_rank is None and json.loads(job.evaluation.read_text())["selected_step"] == 0:
        # The one-process full fine-tune was scored in its child: no checkpoint beat the start (at this learning
        # rate, none does), so merged/ holds the start model, and the best checkpoint stays in checkpoints/.
        assert_same_weights(job.merged / name, build_tiny() / name)
    else:
        assert_same_weights((job.adapter if lora_rank else job.merged) / name, checkpoint / name)


def test_the_series_and_after_are_the_kept_models(make_job):
    job, spec = held_out_job(make_job)
    assert grpo.main(str(job.root)) == 0  # a full fine-tune: its child scores before and after itself
    scored, evaluation = scores(job), json.loads(job.evaluation.read_text())
    best = json.loads(job.training_result.read_text())["selected_step"]
    assert evaluation["metric"] == "variety" and evaluation["select"] == "best"
    assert evaluation["series"] == [{"step": 0, "score": evaluation["before"]}] + [
        {"step": step, "score": score} for step, score in scored.items()
    ]
    # select: best weighs step 0 too: the kept model never scores below the start.
    assert evaluation["after"] >= evaluation["before"]
    report = write_report(job, spec, evaluation, []).read_text()
    if evaluation["improved"]:
        assert evaluation["selected_step"] == best
        assert evaluation["after"] == pytest.approx(scored[best])  # the kept checkpoint's model, greedy again
        assert f"**Model kept:** step {best}, the best held-out score during training" in report
    else:  # at this learning rate every checkpoint scores below the start (was: "best at step 2", and kept)
        assert evaluation["selected_step"] == 0 and evaluation["after"] == evaluation["before"]
        assert evaluation["trained"] == {"step": best, "score": pytest.approx(scored[best])}
        assert "**Model kept:** the starting model (step 0): no checkpoint beat its held-out variety" in report
    assert "![held_out](held_out.png)" in report and (job.root / "held_out.png").stat().st_size > 0
    assert "| step | held-out variety | training reward (mean since the row before) |" in report


def test_select_last_keeps_the_last_step(make_job):
    job, _ = held_out_job(make_job, select="last")
    assert grpo.main(str(job.root)) == 0
    assert list(scores(job)) == [2, 4, 6]
    evaluation = json.loads(job.evaluation.read_text())
    assert evaluation["selected_step"] == 6 and evaluation["after"] == pytest.approx(scores(job)[6])


@pytest.mark.parametrize(
    "before, after, text, beat",
    [
        (0.33, 0.75, "+42.0 points", True),
        (0.5, 0.5, "no change", False),  # a tie beats nothing (was "+0.0 points")
        (0.6, 0.6 + 1e-15, "no change", False),  # float noise is no gain
        (0.05942, 0.05937, "-0.005 points", False),  # rounds to 0 at one decimal: its own digits (was "-0.0 points")
        (0.05937, 0.05942, "+0.005 points", True),
        (-2.0, 3.5, "+5.5", True),  # not in [0, 1]: the plain difference
        (None, 0.5, None, None),  # a score missing: no verdict
    ],
)
def test_how_two_scores_compare(before, after, text, beat):
    assert beats(after, before) is beat
    if text is not None:
        assert change(before, after) == text


def test_doctests():
    assert doctest.testmod(held_out).failed == 0
