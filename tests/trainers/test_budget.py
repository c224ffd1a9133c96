"""`budget.max_training_hours`: training stops at a checkpoint at the cap and the rest of the pipeline runs on that
model, saying so (state message, report, event, webhooks' payload); a resume gets only what is left; `validate`
prints an estimate of the training time from a job of the same base model that trained here."""

import doctest
import json

import pytest
import yaml

from grpoflow.trainers import budget
from grpoflow.trainers.budget import estimate
from grpoflow.trainers.spec import load_spec
from tests.conftest import cli


def test_doctests():
    assert doctest.testmod(budget).failed == 0


def fake_job(root, name: str, base_model: str, runtime: float, steps: int, resumed_from=None, **hp):
    folder = root / name
    folder.mkdir(parents=True)
    spec = {"base_model": base_model, "hyperparameters": {"rollouts_per_prompt": 8, "max_response_length": 64, **hp}}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    training = {"global_step": steps, "train_runtime": runtime, "resumed_from": resumed_from}
    (folder / "training.json").write_text(json.dumps(training))


def test_the_estimate_scales_the_newest_job_of_the_same_model(make_spec, tmp_path):
    root = tmp_path / "runs"
    fake_job(root, "other-model", "Qwen/Qwen2.5-0.5B", runtime=1000.0, steps=10)
    # 40 s for steps 11..20 (resumed from checkpoint-10): 4 s/step at 8 x 64 tokens per step
    fake_job(root, "same-model", "builtin:tiny", runtime=40.0, steps=20, resumed_from="checkpoint-10")
    spec, _ = load_spec(
        make_spec(
            "est",
            hyperparameters={"max_steps": 100, "rollouts_per_prompt": 16, "max_response_length": 64},
            budget={"max_training_hours": 0.1},
        )
    )
    text = estimate(spec, [str(root)])
    # twice the completions per step: 8 s/step, 800 s for 100 steps; the 0.1 h cap (360 s) stops it at step 45
    assert text.startswith("about 13 min of GRPO training (100 steps at 8.00 s/step: job same-model's 4.00 s/step")
    assert text.endswith("budget.max_training_hours (0.1 h) stops it at about step 45")
    assert (
        estimate(spec, [str(tmp_path / "empty")])
        == "no estimate: no job of builtin:tiny has trained on this machine yet"
    )


def test_validate_prints_the_estimate(make_spec, tmp_path):
    fake_job(
        tmp_path / "runs", "done", "builtin:tiny", runtime=6.0, steps=3, rollouts_per_prompt=4, max_response_length=6
    )
    code, _, err = cli("--output-uri", tmp_path / "runs", "validate", make_spec("v"))
    assert code == 0, err
    assert "training time: about 6 s of GRPO training (3 steps at 2.00 s/step: job done's" in err


@pytest.mark.slow
def test_at_the_cap_training_stops_at_a_checkpoint_and_the_job_says_so(make_spec, tmp_path, prefect_server):
    from grpoflow.flows.pipeline import grpo_pipeline

    # A cap far below one step's time: training stops after its first step.
    spec, _ = load_spec(make_spec("capped", budget={"max_training_hours": 1e-7}, hyperparameters={"max_steps": 20}))
    state = grpo_pipeline(spec, return_state=True)
    assert state.is_completed(), state.message
    assert "training stopped by budget.max_training_hours (1e-07 h) at step 1" in state.message
    job = next((tmp_path / "runs").iterdir())
    training = json.loads((job / "training.json").read_text())
    assert training["stopped_by"] == "budget" and training["global_step"] == 1
    assert (job / "checkpoints" / "checkpoint-1").is_dir() and (job / "merged" / "config.json").exists()
    assert "1 of max_steps 20 (training stopped by budget.max_training_hours" in (job / "report.md").read_text()
    events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    completed = [e for e in events if e["event"] == "grpoflow.training.completed"]
    assert completed[0]["payload"]["stopped_by"] == "budget"  # the webhooks' payload is the event's
    assert json.loads((job / "evaluation.json").read_text())["after"] is not None  # evaluated on that model

    # A resume of a job whose budget is spent trains nothing more: it restores the checkpoint.
    from grpoflow.trainers.jobdir import JobDir
    from grpoflow.trainers.launch import run_child

    run_child("grpoflow.trainers.grpo", JobDir(job), 1, "train.log", result=JobDir(job).training_result)
    again = json.loads((job / "training.json").read_text())
    assert again["global_step"] == 1 and again["stopped_by"] == "budget" and again["train_runtime"] == 0.0
