"""Crash safety of the training task: a SIGKILLed training child is retried and resumes from its checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainers.grpo import intact_checkpoint, resume_checkpoint
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics

pytestmark = pytest.mark.slow


def training_child(job_root: Path) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "trainers.grpo" in cmdline and str(job_root) in cmdline:
            return proc
    return None


def last_step(job: JobDir) -> int:
    records = read_metrics(job.metrics)
    return records[-1]["step"] if records else 0


@pytest.mark.usefixtures("prefect_server")
# Kill points: before the first checkpoint (resumes from scratch), between checkpoints, and near the end.
@pytest.mark.parametrize("kill_at", [3, 12, 27])
def test_sigkill_resumes_each_step_once(tmp_path, make_spec, kill_at):
    from prefect.settings import PREFECT_API_URL

    spec = make_spec(
        f"kill{kill_at}",
        hyperparameters={"max_steps": 30, "rollouts_per_prompt": 2, "max_response_length": 4},
        checkpoint_every=5,
        evaluation={"holdout": 0},
    )
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(spec), "--json"], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        deadline = time.monotonic() + 300
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
    steps = [r["step"] for r in read_metrics(job.metrics)]
    assert steps == list(range(1, 31))  # every step exactly once, none lost, none repeated
    # The retried task announces only the steps the first attempt had not: one progress event per step (30 steps:
    # every step has one), in order, none twice.
    progress = [r["payload"]["step"] for r in read_metrics(job.events) if r["event"] == "grpoflow.training.progress"]
    assert progress == list(range(1, 31))
    resumed = json.loads(job.training_result.read_text())["resumed_from"]
    if kill_at >= 10:  # checkpoint-5 at least was complete when the child died: the retry started from it
        assert resumed is not None and int(resumed.rsplit("-", 1)[1]) >= 5


def test_torn_checkpoint_is_skipped(tmp_path):
    job = JobDir(tmp_path / "job")
    for step in (5, 10):
        folder = job.checkpoints / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    # A kill during the save of checkpoint-15: the model is there, trainer_state.json (written last) is truncated.
    torn = job.checkpoints / "checkpoint-15"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"\0" * 64)
    (torn / "trainer_state.json").write_text('{"global_step": 1')
    job.metrics.write_text("".join(json.dumps({"step": s, "values": {}}) + "\n" for s in range(1, 16)))

    assert not intact_checkpoint(torn)
    assert resume_checkpoint(job) == str(job.checkpoints / "checkpoint-10")
    assert not torn.exists()
    assert [r["step"] for r in read_metrics(job.metrics)] == list(range(1, 11))


@pytest.mark.usefixtures("prefect_server")
def test_cancel_stops_child_and_keeps_checkpoint(tmp_path, make_spec):
    """A cancelled flow run gets SIGTERM from its worker (what the Prefect UI's Cancel does); same here."""
    from prefect.settings import PREFECT_API_URL

    spec = make_spec(
        "cancel",
        hyperparameters={"max_steps": 200, "rollouts_per_prompt": 2, "max_response_length": 4},
        checkpoint_every=5,
        evaluation={"holdout": 0},
    )
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    run = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(spec)], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
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
    failed = [r for r in read_metrics(job.events) if r["event"] == "grpoflow.job.failed"]
    assert failed and failed[-1]["payload"]["reason"] == "cancelled"
