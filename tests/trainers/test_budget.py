"""`budget.max_training_hours`: training stops at a checkpoint at the cap and the rest of the pipeline runs on that
model, saying so (state message, report, event, webhooks' payload); a resume gets only what is left; `validate`
prints an estimate of the training time from a job of the same base model that trained here."""

import doctest
import json

import pytest
import yaml

from grpoflow.core.spec import load_spec
from grpoflow.trainers import budget
from grpoflow.trainers.budget import estimate
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
    from grpoflow.core.jobdir import JobDir
    from grpoflow.jobs.launch import run_child

    run_child("grpoflow.trainers.grpo", JobDir(job), 1, "train.log", result=JobDir(job).training_result)
    again = json.loads((job / "training.json").read_text())
    assert again["global_step"] == 1 and again["stopped_by"] == "budget" and again["train_runtime"] == 0.0


# --- the books: budget.json and each checkpoint's own record ---------------------------------------------------------


def budget_job(make_spec, tmp_path, hours):
    from grpoflow.core.jobdir import JobDir

    spec, _ = load_spec(make_spec("b", budget={"max_training_hours": hours}, hyperparameters={"max_steps": 20}))
    job = JobDir(tmp_path / "job")
    job.root.mkdir(parents=True)
    return job, spec


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"seconds": NaN}', 'its "seconds" is NaN, not a number of seconds >= 0'),  # a NaN compares below any cap
        ('{"seconds": -1e12}', 'its "seconds" is -1000000000000.0, not a number'),  # credit of 31,000 years
        ('{"seconds": -Infinity}', 'its "seconds" is -Infinity, not a number'),
        ('{"seconds": "x"}', 'its "seconds" is "x", not a number'),
        ('{"seconds": true}', 'its "seconds" is true, not a number'),  # a bool is an int to Python
        ("[1]", "it holds [1], not an object"),
        ('{"step": 4}', 'it has no "seconds"'),
        ("{", "it cannot be read as JSON (Expecting property name"),  # not what write_json_atomic ever leaves
    ],
)
def test_a_corrupt_budget_file_is_refused_when_a_budget_is_set(make_spec, tmp_path, capsys, text, problem):
    from grpoflow.trainers.budget import BudgetRecordError, budget_callback, used_seconds
    from grpoflow.trainers.model.load import setup_problem

    job, spec = budget_job(make_spec, tmp_path, 0.5)
    (job.root / "budget.json").write_text(text)
    with pytest.raises(BudgetRecordError) as refused:
        budget_callback(job, spec)  # in the training child, before the model loads
    # The child's exit 2 (not retried); `grpoflow run` prints it after "cannot train: ".
    assert setup_problem(refused.value, job.root) == str(refused.value)
    assert str(refused.value).startswith(
        f"budget.max_training_hours (0.5 h) cannot be kept: {job.root}/budget.json is corrupt: {problem}"
    )
    assert str(refused.value).endswith(
        "so the training time already used is unknown; delete the file and resume the job: the count restarts from "
        "the newest checkpoint's own record (from 0 without a checkpoint)"
    )
    # Without a budget there is nothing to keep: ignored, with a warning.
    job, spec = budget_job(make_spec, tmp_path / "none", None)
    (job.root / "budget.json").write_text(text)
    assert used_seconds(job, spec) == 0.0
    assert f"grpoflow: warning: {job.root}/budget.json is corrupt ({problem}" in capsys.readouterr().err


def attempt(job, spec, state):
    """A training attempt's callback driven as the Trainer drives it: on_train_begin with the (resumed) state, one
    step, then a checkpoint's trainer_state.json saved with the callbacks' records (`stateful_callbacks`)."""
    from transformers import TrainerControl, TrainerState

    from grpoflow.trainers.budget import budget_callback

    callback, control = budget_callback(job, spec), TrainerControl()
    callback.on_train_begin(None, state, control)
    state.global_step += 1
    callback.on_step_end(None, state, control)
    checkpoint = job.checkpoints / f"checkpoint-{state.global_step}"
    checkpoint.mkdir(parents=True)
    saved = TrainerState(global_step=state.global_step, max_steps=state.max_steps, stateful_callbacks=[callback])
    saved.save_to_json(str(checkpoint / "trainer_state.json"))
    return callback, control, checkpoint


@pytest.mark.parametrize("tampering", ["deleted", "set to 0", "poisoned, no budget"])
def test_time_spent_up_to_a_checkpoint_stays_spent(make_spec, tmp_path, tampering):
    from transformers import TrainerState

    from grpoflow.trainers.budget import spent, used_seconds

    job, spec = budget_job(make_spec, tmp_path, 0.8)  # 2880 s
    (job.root / "budget.json").write_text('{"seconds": 3000, "step": 4}')  # four steps' worth, over the cap
    callback, control, checkpoint = attempt(job, spec, TrainerState(global_step=4, max_steps=20))
    assert callback.stopped_at == 5 and control.should_save and control.should_training_stop
    assert json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["BudgetCallback"] == {
        "args": {},
        "attributes": {"seconds": pytest.approx(3000, abs=1)},
    }

    # Between attempts budget.json loses the time (a grader, a person): the checkpoint's record keeps it.
    if tampering == "deleted":
        (job.root / "budget.json").unlink()
    elif tampering == "set to 0":
        (job.root / "budget.json").write_text('{"seconds": 0}')
    else:
        (job.root / "budget.json").write_text('{"seconds": NaN}')
        spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_training_hours": None})})
    assert used_seconds(job, spec, checkpoint) == pytest.approx(3000, abs=1)
    assert spent(job, spec, checkpoint) is (tampering != "poisoned, no budget")  # grpo.py: nothing more is trained
    # Resumed anyway (the Trainer loads the checkpoint's state before on_train_begin): the count goes on from 3000 s.
    resumed = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    callback, control, _ = attempt(job, spec, resumed)
    assert callback.seconds == pytest.approx(3000, abs=1)
    assert json.loads((job.root / "budget.json").read_text())["seconds"] == pytest.approx(3000, abs=1)
    assert control.should_training_stop is (tampering != "poisoned, no budget")


def test_a_checkpoint_without_a_record_resumes_and_saves_one(make_spec, tmp_path):
    from transformers import TrainerState

    job, spec = budget_job(make_spec, tmp_path, 1.0)
    old = TrainerState(global_step=3, max_steps=20, stateful_callbacks={"TrainerControl": {}})  # saved before
    callback, _, checkpoint = attempt(job, spec, old)
    assert old.stateful_callbacks["BudgetCallback"]["attributes"]["seconds"] == 0.0  # the key Trainer's save indexes
    assert callback.seconds < 1 and not callback.stopped_at
