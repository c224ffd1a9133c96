"""The stand-in training child (tests/standin_child.py) writes what the real child writes, in its formats, and does
on request what the orchestration tests ask of it: compared here with the jobs the real pipeline trained."""

import json

import pytest

from grpoflow.core.errors import ChildEndedEarly, RewardFailed, TrainingSetupError, TrainingStopped
from grpoflow.jobs.launch import run_child
from grpoflow.trainers.metrics import read_metrics


def train(job, **kwargs) -> float:
    return run_child("grpoflow.trainers.grpo", job, 1, "train.log", result=job.training_result, **kwargs)


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_it_writes_what_the_real_child_writes(make_job, standin, trained_jobs, kind):
    from safetensors.numpy import load_file

    from grpoflow.core.jobdir import JobDir
    from grpoflow.trainers.model.merge import merge_adapter
    from grpoflow.trainers.model.tiny import build_tiny

    job, _ = make_job(kind, hyperparameters={"lora_rank": 4 if kind == "lora" else None})
    train(job)
    real = JobDir(trained_jobs[kind])

    summary, real_summary = (json.loads(j.training_result.read_text()) for j in (job, real))
    assert summary.keys() == real_summary.keys() - {"evaluated_in_training", "evaluation"}
    assert summary["artifact_dir"] == real_summary["artifact_dir"] and summary["global_step"] == 3
    # One line a step, with every key the real child logs for these rewards.
    records, real_records = read_metrics(job.metrics), read_metrics(real.metrics)
    assert [r["step"] for r in records] == [r["step"] for r in real_records] == [1, 2, 3]
    assert {"reward", "reward_std", "loss", "rewards/exact_answer/mean"} <= records[0]["values"].keys()
    assert records[0]["values"].keys() <= real_records[0]["values"].keys()
    saved = [sorted(p.name for p in j.checkpoints.glob("checkpoint-*")) for j in (job, real)]
    assert saved[0] == saved[1] == ["checkpoint-2", "checkpoint-3"]  # every step, the newest 2 kept

    base = load_file(str(build_tiny() / "model.safetensors"))
    if kind == "lora":  # an adapter PEFT loads and merges: PEFT's initialisation, so the merged model is the base
        adapter = json.loads((job.adapter / "adapter_config.json").read_text())
        assert adapter["r"] == 4 and adapter["target_modules"] == summary["lora_target_modules"]
        merge_adapter(job.adapter, job.merged)
    merged = load_file(str(job.merged / "model.safetensors"))
    assert merged.keys() == base.keys() and all((merged[k] == base[k]).all() for k in base)


def test_it_crashes_as_asked_then_resumes_each_step_once(make_job, standin):
    job, spec = make_job("crash", hyperparameters={"max_steps": 4}, checkpoint_every=2)
    standin(crash_at=3, crashes=1)
    with pytest.raises(RuntimeError, match="exited with code -9"):
        train(job)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3]
    train(job)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3, 4]  # step 3 dropped and trained again
    assert json.loads(job.training_result.read_text())["resumed_from"] == "checkpoint-2"


@pytest.mark.parametrize(
    "request_, raised, message",
    [
        ({"exit_at": 1, "exit_code": 2, "message": "no GPU here"}, TrainingSetupError, "no GPU here"),
        ({"exit_at": 2, "exit_code": 3, "message": "reward 'r' raised"}, RewardFailed, "reward 'r' raised"),
        ({"no_result": True}, ChildEndedEarly, "exited 0 without writing training.json"),
    ],
    ids=["setup-error", "reward-failed", "no-result"],
)
def test_it_stops_as_the_real_child_stops(make_job, standin, request_, raised, message):
    job, _ = make_job("stop")
    standin(**request_)
    with pytest.raises(raised, match=message):
        train(job)


def test_a_reward_that_raises_in_training_ends_it_with_exit_3(make_job, standin):
    rewards = [{"name": "mine", "function": "tests.bad_inputs.rewards.from_step3:raises_reward"}]
    job, _ = make_job("reward", rewards=rewards, hyperparameters={"max_steps": 4})
    with pytest.raises(RewardFailed, match="reward 'mine' raised KeyError: 'solution' at training step 3"):
        train(job)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]


def test_a_hang_is_stopped_by_the_poll(make_job, standin):
    job, _ = make_job("hang", hyperparameters={"max_steps": 4})
    standin(hang_at=1, values={"loss": 0.5})

    def poll():
        records = read_metrics(job.metrics)
        return "hung" if records and records[-1]["values"]["loss"] == 0.5 else None

    with pytest.raises(TrainingStopped, match="hung"):
        train(job, poll=poll)
    assert [r["step"] for r in read_metrics(job.metrics)] == [1]


def test_the_sft_stand_in_writes_a_model_that_differs_from_the_base(make_job, standin):
    from safetensors.numpy import load_file

    from grpoflow.trainers.model.tiny import build_tiny

    job, _ = make_job("sft", sft={"enabled": True, "max_steps": 3, "batch_size": 4})
    run_child("grpoflow.trainers.sft", job, 1, "sft.log")
    assert [r["step"] for r in read_metrics(job.root / "sft_metrics.jsonl")] == [1, 2, 3]
    base, sft = (load_file(str(p / "model.safetensors")) for p in (build_tiny(), job.sft))
    assert sft.keys() == base.keys() and all(not (sft[k] == base[k]).all() for k in base if base[k].dtype.kind == "f")


def test_a_request_for_one_job_leaves_the_others_alone(monkeypatch):
    """A worker started once runs several tests' jobs: `{"jobs": {NAME: ...}}` asks only of the job named NAME,
    over what is asked of every job, per stage as at the top level."""
    from tests.standin_child import REQUEST_ENV, request

    asked = {"step_seconds": 0.1, "jobs": {"slow": {"step_seconds": 0.5, "sft": {"step_seconds": 0.3}}}}
    monkeypatch.setenv(REQUEST_ENV, json.dumps(asked))
    assert request("grpo", "other") == {"step_seconds": 0.1}
    assert request("grpo", "slow") == {"step_seconds": 0.5}
    assert request("sft", "slow") == {"step_seconds": 0.3}
