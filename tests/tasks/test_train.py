"""The training task: it runs the GRPO child, announces its progress and result, ends a setup problem without a
retry; and (slow) a SIGKILLed child is retried and resumes from its checkpoint, a cancelled run stops its child."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from grpoflow.core.errors import EXIT_RECORD, ChildEndedEarly, RewardFailed, TrainingSetupError, TrainingStopped
from grpoflow.core.jobdir import JobDir
from grpoflow.tasks.train import train_task
from grpoflow.trainers.grpo import checkpoint_step, intact_checkpoint
from grpoflow.trainers.metrics import read_events, read_metrics
from tests.integrations.test_artifacts import flow_run_artifacts, flow_run_logs


def training_child(job_root: Path) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "grpoflow.trainers.grpo" in cmdline and str(job_root) in cmdline:
            return proc
    return None


def last_step(job: JobDir) -> int:
    records = read_metrics(job.metrics)
    return records[-1]["step"] if records else 0


def events(job: JobDir) -> list[dict]:
    return read_events(job.events)  # the same JSON Lines form


@pytest.mark.usefixtures("prefect_server")
def test_train_task_runs_the_child_and_announces_each_step(make_job):
    from prefect import flow

    job, spec = make_job("fast", hyperparameters={"max_steps": 2}, evaluation={"holdout": 0})

    @flow
    def train():
        return train_task(job, spec)

    state = train(return_state=True)
    summary = state.result()
    assert summary["global_step"] == 2 and summary["resumed_from"] is None and summary["alerts"] == []
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]
    assert (job.merged / "model.safetensors").exists()
    names = [e["event"] for e in events(job)]
    assert names == ["grpoflow.training.progress"] * 2 + ["grpoflow.training.completed"]
    assert [e["payload"]["step"] for e in events(job)[:2]] == [1, 2]
    assert "reward" in events(job)[0]["payload"]
    assert events(job)[-1]["payload"]["global_step"] == 2
    assert (job.logs / "train.log").exists()  # the child's output
    # Every step is one line in the fixed format (tests/integrations/test_artifacts.py), and the UI's progress bar ends
    # full.
    flow_run_id = state.state_details.flow_run_id
    lines = [m for m in flow_run_logs(flow_run_id) if m.startswith("step ")]
    assert [m.split()[1] for m in lines] == ["1/2", "2/2"] and all(" reward_std " in m and " ETA " in m for m in lines)
    progress = flow_run_artifacts(flow_run_id)["fast-training-progress"]
    assert progress.data == 100 and progress.description == lines[-1]
    # The phases outside the steps, each in its place (a busy machine may add "...: 15 s so far" lines).
    told = [m for m in flow_run_logs(flow_run_id) if m.startswith(("training: ", "step ")) and "s so far" not in m]
    assert told[0] == "training: starting the child process (importing torch, transformers and TRL)"
    assert told[1].startswith("training: loading the model ") and told[1].endswith(" in 1 file)")
    assert told[2] == "training: model loaded in " + told[2].split(" in ", 1)[1]
    assert told[2].endswith(" s; step 1: generating 4 completions of up to 6 tokens")  # make_job's spec
    assert told[3:5] == lines and told[5] == "training: saving the weights to merged/"


@pytest.mark.usefixtures("prefect_server")
def test_no_phase_line_repeats_between_steps(make_job, standin, monkeypatch):
    # "training: model loaded in 0.4 s; step 1: generating ...: 153 s so far" came every 15 s between the step lines
    # of a whole run. Here a beat every 0.3 s, a model load of 1.5 s and steps of 0.6 s (the task polls every 0.5 s).
    from prefect import flow

    from grpoflow.integrations import heartbeat

    monkeypatch.setattr(heartbeat, "EVERY_S", 0.3)
    standin(load_seconds=1.5, step_seconds=0.6)
    job, spec = make_job("beats", hyperparameters={"max_steps": 5}, evaluation={"holdout": 0})
    state = flow(lambda: train_task(job, spec))(return_state=True)
    assert state.is_completed()
    told = [m for m in flow_run_logs(state.state_details.flow_run_id) if m.startswith(("training: ", "step "))]
    steps = [i for i, m in enumerate(told) if m.startswith("step ")]
    assert [told[i].split()[1] for i in steps] == [f"{s}/5" for s in range(1, 6)]
    assert not [m for m in told[steps[0] : steps[-1]] if not m.startswith("step ")], told  # only the steps' lines
    # The model load still says how long it lasts: the beat is held back between steps only.
    load = "training: loading the model builtin:tiny (the stand-in's)"
    assert any(m.startswith(f"{load}: ") and m.endswith(" s so far") for m in told[: steps[0]]), told
    # After the last step, the phase before step 1 is over: a beat before the save's line (a poll can come between
    # them) counts from the last step.
    after = told[steps[-1] + 1 :]
    save = after.index("training: saving the weights to merged/")
    assert all(m.startswith("training: after step 5/5: ") and m.endswith(" s so far") for m in after[:save]), told


def test_train_task_is_a_retried_prefect_task():
    from prefect import Task

    from grpoflow.integrations.stages import retry_unless_final

    assert isinstance(train_task, Task) and train_task.name == "train"
    assert train_task.retries == 2 and train_task.retry_condition_fn is retry_unless_final


@pytest.mark.skipif(torch.cuda.is_available(), reason="use_liger can run where CUDA is")
@pytest.mark.usefixtures("prefect_server")
def test_a_setup_problem_is_not_retried(make_job):
    from prefect import flow

    job, spec = make_job("liger", hyperparameters={"use_liger": True})

    @flow
    def train():
        with pytest.raises(TrainingSetupError, match="use_liger=true needs a CUDA GPU"):
            train_task(job, spec)

    train()
    # The task allows 2 retries; a setup problem takes none: one child started, one line of it in the log.
    assert (job.logs / "train.log").read_text().count("use_liger=true needs a CUDA GPU") == 1
    assert not any(e["event"] == "grpoflow.training.completed" for e in events(job))


FAULTY = "tests.bad_inputs.rewards.from_step3"  # rewards that misbehave from training step 3
FAST = {"max_steps": 4, "rollouts_per_prompt": 2, "max_response_length": 4}


def child_starts(job: JobDir) -> int:
    return (job.logs / "train.log").read_text().count("grpoflow: grpoflow.trainers.grpo started")


def run_train(job: JobDir, spec, expected: type[Exception]) -> Exception:
    from prefect import flow

    @flow
    def train():
        with pytest.raises(expected) as failed:
            train_task(job, spec)
        return failed.value

    return train()


@pytest.fixture
def small_disk(tmp_path):
    """A 7 MB tmpfs mounted as the jobs' output folder (tmp_path/runs): room for the dataset and one checkpoint of
    builtin:tiny's full fine-tune (weights and optimizer state, about 4 MB), not two."""
    runs = tmp_path / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(runs)], check=True)
    try:
        yield runs
    finally:
        subprocess.run(["umount", "--lazy", str(runs)], check=True)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_full_disk_at_a_checkpoint_leaves_no_torn_checkpoint_and_fails_once(make_job, small_disk):
    """The disk fills while the real child saves its second checkpoint: the child removes that torn checkpoint before
    it writes anything else, saying its whole name (the log said "removing torn checkpoint checkpoint", and
    checkpoint-10 stayed), and the task fails once with the setup problem, no retry (it was retried twice, each
    failing in seconds). What is left is the intact checkpoint a resume goes on from."""
    job, spec = make_job("full-disk", hyperparameters={**FAST, "max_steps": 6}, checkpoint_every=1,
                         evaluation={"holdout": 0})  # fmt: skip
    assert job.root.is_relative_to(small_disk)
    failure = run_train(job, spec, TrainingSetupError)
    assert "output_uri: cannot write into " in str(failure) and "the disk is full" in str(failure), failure
    log = (job.logs / "train.log").read_text()
    assert child_starts(job) == 1, log
    checkpoints = sorted(job.checkpoints.glob("checkpoint-*"), key=checkpoint_step)
    assert checkpoints and all(intact_checkpoint(p) for p in checkpoints), [list(p.iterdir()) for p in checkpoints]
    torn = checkpoint_step(checkpoints[-1]) + 1
    assert f"grpoflow: removing torn checkpoint checkpoint-{torn}\n" in log, log[-3000:]
    record = json.loads((job.root / EXIT_RECORD).read_text())  # written after the removal, on the freed space
    assert (
        record["code"] == 2
        and record["message"].startswith("output_uri: cannot write into ")
        and record["message"] in str(failure)
    )


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize(
    "reward, health, expected, message",
    [
        # a reward that raises at step 3: its traceback in the log, one line in the failure, no retry
        ("raises_reward", {}, RewardFailed, "reward 'mine' raised KeyError: 'solution' at training step 3"),
        # a hang at step 3 meets the per-call timeout
        (
            "hang_reward",
            {"reward_timeout_s": 2},
            RewardFailed,
            "reward 'mine' did not return within 2 s at training step 3",
        ),
        # a hang the timeout does not catch (300 s) meets the stall watchdog: an alert, then a stop
        ("hang_reward", {"stall_factor": 2, "stall_min_seconds": 4}, TrainingStopped, "stopped by the stall watchdog"),
        # os._exit(0) in a reward: named as such, not "training.json missing"
        ("exit_reward", {}, ChildEndedEarly, "exited 0 without writing training.json"),
    ],
)
def test_a_fault_in_a_reward_ends_training_once(make_job, standin, reward, health, expected, message):
    # The task's side of each fault, on the stand-in child (it calls the job's rewards through the real child's
    # guard); the real child's own exit on a reward that raises: tests/trainers/test_reward_faults.py.
    rewards = [{"name": "mine", "function": f"{FAULTY}:{reward}"}]
    job, spec = make_job("fault", rewards=rewards, hyperparameters=FAST, evaluation={"holdout": 0}, health=health)
    started = time.monotonic()
    failure = run_train(job, spec, expected)
    assert message in str(failure)
    assert child_starts(job) == 1  # the task allows 2 retries: none taken
    assert time.monotonic() - started < 120
    alerts = [e["payload"]["kind"] for e in events(job) if e["event"] == "grpoflow.training.alert"]
    assert alerts == (["stall"] if expected is TrainingStopped else [])
    if reward == "raises_reward":
        assert "raised KeyError: 'solution' at training step 3" in (job.logs / "train.log").read_text()


@pytest.mark.usefixtures("prefect_server")
def test_slow_steps_complete_the_stall_watchdog_counts_the_first_step(make_job, standin):
    """The issue's run of 70-second steps with stall_min_seconds 30 (the default stall_factor, 10), scaled by 1/20:
    3.5 s steps and a 1.5 s floor. After step 1 the limit is 10 x step 1's own 3.5 s (from the child's "step 1:
    generating" line), not the floor: the old rule raised a stall alert 1.5 s into step 2 and stopped the run as hung
    at twice that (3 s here, 60 s unscaled; on a busy machine a step 1 of 328 s met the 120 s floor). With the old
    rule this test fails on the alert, if not on the stop. The model load before step 1 (2 s, over the floor too) is
    not a step: it trips nothing."""
    standin(grpo={"step_seconds": 3.5, "load_seconds": 2})
    health = {"stall_min_seconds": 1.5}
    job, spec = make_job("slow-steps", hyperparameters={**FAST, "max_steps": 2}, evaluation={"holdout": 0},
                         health=health)  # fmt: skip
    assert spec.health.stall_factor == 10  # the default, as in the run
    from prefect import flow

    @flow
    def train():
        return train_task(job, spec)

    summary = train()
    assert summary["global_step"] == 2 and summary["alerts"] == []
    assert [e["event"] for e in events(job) if e["event"] == "grpoflow.training.alert"] == []
    assert child_starts(job) == 1


@pytest.mark.usefixtures("prefect_server")
def test_a_diverged_run_stops_on_the_non_finite_alert(make_job):
    """learning_rate 1e300: step 1's loss and gradient norm are finite, its update makes the weights inf, and step 2's
    generation failed on them in torch's sampler, a crash retried twice that never named the rate. The child now stops
    itself after step 1 (its finite check), and the task stops the run on the non_finite alert without stop_on_alert
    (a NaN run cannot recover), naming the learning rate, once."""
    # make_spec's rewards and rollouts (a length penalty the tiny model's completions vary on): gradients from step 1
    hyperparameters = {"max_steps": 4, "learning_rate": 1e300}
    job, spec = make_job("diverge", hyperparameters=hyperparameters, evaluation={"holdout": 0})
    assert not spec.stop_on_alert
    failure = run_train(job, spec, TrainingStopped)
    assert str(failure).startswith(
        "stopped by the health monitor: hyperparameters.learning_rate: training diverged at step 1: the weights "
        "became NaN or inf with learning_rate 1e+300; lower it"
    )
    assert child_starts(job) == 1
    alerts = [e["payload"] for e in events(job) if e["event"] == "grpoflow.training.alert"]
    assert [a["kind"] for a in alerts] == ["non_finite"], [r["values"] for r in read_metrics(job.metrics)]
    assert not job.checkpoints.exists() or not list(job.checkpoints.iterdir())  # no checkpoint of inf weights


@pytest.mark.usefixtures("prefect_server")
def test_a_child_that_stopped_on_nan_is_not_retried(make_job, standin):
    # The task's side of the child's exit code 4, on the stand-in: the same alert and stop, no second child.
    message = "hyperparameters.learning_rate: training diverged at step 2: the weights became NaN or inf"
    standin(exit_at=2, exit_code=4, message=message)
    job, spec = make_job("nan", hyperparameters=FAST, evaluation={"holdout": 0})
    failure = run_train(job, spec, TrainingStopped)
    assert str(failure) == f"stopped by the health monitor: {message}"
    assert child_starts(job) == 1
    [alert] = [e["payload"] for e in events(job) if e["event"] == "grpoflow.training.alert"]
    assert (alert["kind"], alert["step"], alert["message"]) == ("non_finite", 2, message)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
# Kill points: before the first checkpoint (resumes from scratch), between checkpoints, and near the end; the real
# child at one of them (its checkpoints are TRL's), the stand-in at the others (what is tested there is the task's
# retry and its events, around the child's `resume_checkpoint`).
# The real child trains 10 steps (each is real time in the suite), killed between checkpoint-5 and checkpoint-10; the
# stand-in 30.
@pytest.mark.parametrize("kill_at, child, steps", [(3, "stand-in", 30), (7, "real", 10), (27, "stand-in", 30)])
def test_sigkill_resumes_each_step_once(tmp_path, make_spec, request, kill_at, child, steps):
    from prefect.settings import PREFECT_API_URL

    if child == "stand-in":
        request.getfixturevalue("standin")(step_seconds=0.1)

    spec = make_spec(
        f"kill{kill_at}",
        hyperparameters={"max_steps": steps, "rollouts_per_prompt": 2, "max_response_length": 4},
        checkpoint_every=5,
        evaluation={"holdout": 0},
    )
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    run = subprocess.Popen(
        [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--json"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        deadline = time.monotonic() + 900  # reached in ~30 s; far more only on a machine that is very busy
        job = None
        while time.monotonic() < deadline and (job is None or last_step(job) < kill_at):
            jobs = list((tmp_path / "runs").glob("*/metrics.jsonl"))
            job = JobDir(jobs[0].parent) if jobs else None
            time.sleep(0.05)
        assert job is not None and last_step(job) >= kill_at, "training never reached the kill point"
        child = training_child(job.root)
        assert child is not None
        child.send_signal(signal.SIGKILL)
        out, _ = run.communicate(timeout=600)
    finally:
        run.kill()
    assert run.returncode == 0
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"
    assert [r["step"] for r in read_metrics(job.metrics)] == list(range(1, steps + 1))  # each step once, none lost
    # The retried task announces only the steps the first attempt had not: one progress event per step (every step
    # has one at this length), in order, none twice.
    progress = [r["payload"]["step"] for r in read_events(job.events) if r["event"] == "grpoflow.training.progress"]
    assert progress == list(range(1, steps + 1))
    resumed = json.loads(job.training_result.read_text())["resumed_from"]
    if kill_at > 5:  # checkpoint-5 at least was complete when the child died: the retry started from it
        assert resumed is not None and int(resumed.rsplit("-", 1)[1]) >= 5


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_cancel_stops_child_and_keeps_checkpoint(tmp_path, make_spec, standin):
    """A cancelled flow run gets SIGTERM from its worker (what the Prefect UI's Cancel does); same here, with the
    stand-in child (tests/flows/test_signals.py stops a real one)."""
    from prefect.settings import PREFECT_API_URL

    standin(step_seconds=0.2)

    spec = make_spec(
        "cancel",
        hyperparameters={"max_steps": 200, "rollouts_per_prompt": 2, "max_response_length": 4},
        checkpoint_every=5,
        evaluation={"holdout": 0},
    )
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    run = subprocess.Popen(
        [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec)], env=env, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 900  # reached in ~30 s; far more only on a machine that is very busy
        job = None
        while time.monotonic() < deadline and (job is None or last_step(job) < 8):
            jobs = list((tmp_path / "runs").glob("*/metrics.jsonl"))
            job = JobDir(jobs[0].parent) if jobs else None
            time.sleep(0.05)
        assert job is not None and last_step(job) >= 8
        child = training_child(job.root)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
    finally:
        run.kill()
    assert run.returncode != 0
    child.wait(timeout=30)  # the training child is gone with its task, not orphaned
    assert not child.is_running()
    assert intact_checkpoint(job.checkpoints / "checkpoint-5")
    failed = [r for r in read_events(job.events) if r["event"] == "grpoflow.job.failed"]
    assert failed and failed[-1]["payload"]["reason"] == "cancelled"


@pytest.mark.usefixtures("prefect_server")
def test_held_out_scores_show_rollouts_and_degenerate_output_is_an_alert(make_job, standin):
    # A run whose every completion is `iiiiiiiiii` (completions/degenerate_ratio 1, as the real child logs it), with a
    # held-out score at every step: each evaluation shows that step's rollouts in the UI, and the alert names one.
    from prefect import flow

    standin(grpo={"values": {"eval/exact_answer": 0.0, "completions/degenerate_ratio": 1.0}, "completion": "i" * 10})
    job, spec = make_job("degen", hyperparameters={"max_steps": 10}, evaluation={"holdout": 0})
    state = flow(lambda: train_task(job, spec))(return_state=True)
    assert state.is_completed()
    (alert,) = [e["payload"] for e in events(job) if e["event"] == "grpoflow.training.alert"]
    assert alert["kind"] == "degenerate_completions" and alert["step"] == 10
    assert "100% of the completions over the last 10 steps" in alert["message"]
    assert "e.g. at step 10: 'iiiiiiiiii'" in alert["message"] and "grpoflow rollouts" in alert["advice"]
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:  # every version of the key: one per held-out evaluation
        shown = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["degen-rollouts"])))
    assert sorted(int(a.description.split(" at step ")[1].split(":")[0]) for a in shown) == list(range(1, 11))
    assert [row["completion"] for row in json.loads(shown[0].data)] == ["iiiiiiiiii"] * 3
