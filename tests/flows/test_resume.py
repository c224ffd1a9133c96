"""Resumable jobs: `grpoflow run SPEC --resume JOB_ID` skips the stages a job already completed.

The training children are the stand-in (tests/standin_child.py): what is tested is which stages run again; a real
child resuming from its checkpoint step for step is tests/tasks/test_train.py::test_sigkill_resumes_each_step_once and
tests/trainers/test_grpo.py's resume test."""

import json
from pathlib import Path

import pytest

from grpoflow.core.jobdir import JobDir, locate
from grpoflow.trainers.metrics import read_events
from tests.conftest import cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "standin")]


def test_resume_skips_completed_stages(make_spec):
    spec = make_spec("resume", sft={"enabled": True, "max_steps": 2, "batch_size": 4})
    code, out, _ = cli("run", spec, "--json")
    assert code == 0
    job = JobDir(Path(json.loads(out)["output_dir"]))
    trained_at = job.training_result.stat().st_mtime_ns
    assert locate(job.job_id) == str(job.root)  # `grpoflow metrics JOB_ID` finds it from any folder

    # A late stage lost its output (as if the report failed): only that stage runs again.
    job.report.unlink()
    code, out, _ = cli("run", spec, "--json", "--resume", job.job_id)
    assert code == 0 and json.loads(out)["job_id"] == job.job_id

    names = [r["event"] for r in read_events(job.events)]
    assert names.count("grpoflow.job.started") == 2 and names.count("grpoflow.job.completed") == 2
    assert names.count("grpoflow.training.completed") == 1  # GRPO did not run again
    assert names.count("grpoflow.sft.completed") == 1
    assert job.training_result.stat().st_mtime_ns == trained_at
    assert job.report.exists()

    # Nothing left to redo: the resume says so, runs nothing and announces nothing again.
    events_before = job.events.read_text()
    code, out, err = cli("run", spec, "--json", "--resume", job.job_id)
    assert code == 0 and json.loads(out) == {"job_id": job.job_id, "output_dir": str(job.root), "status": "completed"}
    assert "already completed and up to date: nothing to resume" in err
    assert job.events.read_text() == events_before


def test_resume_rejects_a_changed_spec(trained_job, tmp_path):
    job = trained_job("lora")  # a finished job, with the spec it ran
    resume = ["run", job.spec, "--output-uri", tmp_path / "runs", "--resume"]
    code, _, err = cli(*resume, job.job_id, "--set", "hyperparameters.learning_rate=0.5")
    assert code == 2 and "the spec differs from job" in err and "hyperparameters" in err
    code, _, err = cli(*resume, "no-such-job")
    assert code == 2 and "unknown job" in err


def test_a_deployments_job_id_resumes_only_the_job_of_its_own_spec(make_spec):
    """The UI form's `job_id` (a deployment's parameter: anyone who may launch a run): another spec's job (other data,
    rewards or publish target) is not taken over and its spec.yaml not replaced; an unknown id is no new job."""
    from grpoflow.core.spec import load_spec
    from grpoflow.flows.pipeline import grpo_pipeline

    spec = load_spec(make_spec("taken"))[0]
    code, out, _ = cli("run", make_spec("taken"), "--json")
    assert code == 0
    job = JobDir(Path(json.loads(out)["output_dir"]))
    saved, events = job.spec.read_text(), job.events.read_text()
    other = load_spec(make_spec("taken", rewards=[{"name": "length_penalty", "kwargs": {"max_chars": 2}}]))[0]
    for job_id, message in (
        (
            job.job_id,
            f"job_id: the spec differs from job {job.job_id}'s spec.yaml in: evaluation, rewards; start a new job",
        ),
        ("taken-20991231-000000-abcdef", "job_id: unknown job 'taken-20991231-000000-abcdef' under "),
        ("../elsewhere", "job_id: not a job id: '../elsewhere'"),
    ):
        state = grpo_pipeline(other, job_id=job_id, return_state=True)
        assert state.name == "Rejected" and state.message.startswith(message), state.message
    assert job.spec.read_text() == saved and job.events.read_text() == events  # untouched, nothing announced
    assert sorted(p.name for p in job.root.parent.iterdir()) == [job.job_id]  # no new folder
    assert grpo_pipeline(spec, job_id=job.job_id, return_state=True).is_completed()  # its own spec: resumed
    job.spec.write_text(saved.replace("max_steps: 3", "max_steps: many"))  # edited since: a message, no traceback
    state = grpo_pipeline(spec, job_id=job.job_id, return_state=True)
    assert state.name == "Rejected" and state.message.startswith(
        f"job_id: job {job.job_id}'s spec.yaml no longer loads"
    )


def test_resume_after_sft_replaced_retrains_on_it(make_spec):
    spec = make_spec("resume3", sft={"enabled": True, "max_steps": 2, "batch_size": 4})
    code, out, _ = cli("run", spec, "--json")
    assert code == 0
    job = JobDir(Path(json.loads(out)["output_dir"]))
    stamps = {p: p.stat().st_mtime_ns for p in (job.training_result, job.model_json, job.evaluation, job.report)}

    # Other SFT weights in sft/ (a user's own warm-up, say): the base model, whose weights differ from the SFT's.
    from grpoflow.trainers.model.tiny import build_tiny

    weights = job.sft / "model.safetensors"
    before = weights.read_bytes()
    weights.write_bytes((build_tiny() / "model.safetensors").read_bytes())
    assert weights.read_bytes() != before
    code, out, _ = cli("run", spec, "--json", "--resume", job.job_id)
    assert code == 0

    names = [r["event"] for r in read_events(job.events)]
    assert names.count("grpoflow.sft.completed") == 1  # the SFT's own record still holds: it is not redone
    assert names.count("grpoflow.training.completed") == 2  # GRPO trained again, on the new sft/
    for path, stamp in stamps.items():
        assert path.stat().st_mtime_ns != stamp, f"{path.name} was not rewritten"
    assert json.loads(job.training_result.read_text())["start_model"] == str(job.sft)
