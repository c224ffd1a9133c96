"""GRPO training task: runs `trainers.grpo` as its own child process and watches it.

The child (under `accelerate launch` when gpu_count > 1) writes `metrics.jsonl`; this task tails it to log progress,
emit `grpoflow.training.progress` events and run the health monitor, which emits `grpoflow.training.alert` and, with
`stop_on_alert`, stops the run. A crash of the child (SIGKILL, OOM, an exception) fails the task and Prefect's retries
start a new child that resumes from the newest checkpoint. Exit code 2 means a setup problem no retry can fix.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prefect import get_run_logger, task

from tasks.events import emit
from tasks.stages import resumable
from trainers.health import HealthMonitor
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics
from trainers.spec import JobSpec

SETUP_ERROR_EXIT = 2
POLL_SECONDS = 0.5


class TrainingSetupError(RuntimeError):
    """The training child refused to start (missing library, no CUDA): retrying cannot help."""


class TrainingStopped(RuntimeError):
    """The health monitor stopped the run (`stop_on_alert`)."""


def child_command(module: str, job: JobDir, gpu_count: int = 1) -> list[str]:
    """The command line of a training child; `accelerate launch` spreads it over several GPUs."""
    if gpu_count > 1:
        # --multi_gpu: one process per GPU even where fewer are visible (an error then, not a silent single
        # process), and the only launcher that starts several processes on a CPU machine.
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(gpu_count)]
        return [*launch, "-m", module, str(job.root)]
    return [sys.executable, "-m", module, str(job.root)]


def _retryable(task, task_run, state) -> bool:
    try:
        state.result()
    except (TrainingSetupError, TrainingStopped):
        return False
    except Exception:
        return True
    return False


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if the task's process dies (killed worker, cancelled flow run), so no training
    # process outlives its task and holds the GPU.
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_child(command: list[str], log_path: Path) -> subprocess.Popen:
    """Starts the child in its own process group, output to `log_path`, so it can be stopped as a whole."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop_child(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def check_exit(proc: subprocess.Popen, stage: str, log_path: Path) -> None:
    """Turns the child's exit code into the task's outcome, with the end of its log in the message."""
    if proc.returncode == 0:
        return
    tail = _tail(log_path)
    if proc.returncode == SETUP_ERROR_EXIT:
        raise TrainingSetupError(tail.splitlines()[-1] if tail else f"{stage} could not start")
    raise RuntimeError(f"{stage} child exited with code {proc.returncode}; end of {log_path}:\n{tail}")


class ProgressWatcher:
    """Turns new lines of `metrics.jsonl` into progress logs and events, and health alerts."""

    def __init__(self, job: JobDir, spec: JobSpec):
        hp = spec.hyperparameters
        self.job, self.spec, self.last_step = job, spec, 0
        self.monitor = HealthMonitor(max_response_length=hp.max_response_length, kl_coef=hp.kl_coef)
        self.every = max(1, hp.max_steps // 20)
        self.alerts = []
        self.logger = get_run_logger()
        # A retried task's child resumes from a checkpoint, and the steps before it are already in metrics.jsonl:
        # they feed the health monitor again (its windows need them) but their events went out the first time.
        self.announced_until = max(
            (
                (r.get("payload") or {}).get("step", 0)
                for r in read_metrics(job.events)
                if r.get("event") in ("grpoflow.training.progress", "grpoflow.training.alert")
            ),
            default=0,
        )

    def poll(self) -> bool:
        """Handles new records; returns True when an alert asks the run to stop."""
        stop = False
        # By step, not by line: a resuming child truncates metrics.jsonl to its checkpoint and writes those steps
        # again (bit for bit the same values: see the resume test), which are then not handled twice.
        for record in read_metrics(self.job.metrics):
            if record["step"] > self.last_step:
                stop |= self._handle(record)
                self.last_step = record["step"]
        return stop

    def _handle(self, record: dict) -> bool:
        step, values = record["step"], record["values"]
        if step <= self.announced_until:
            self.alerts += self.monitor.update(record)
            return False
        if step % self.every == 0 or step == self.spec.hyperparameters.max_steps:
            summary = {k: values.get(k) for k in ("reward", "reward_std", "loss", "completions/mean_length", "kl")}
            summary = {k: round(v, 4) for k, v in summary.items() if isinstance(v, float | int)}
            self.logger.info("step %d/%d %s", step, self.spec.hyperparameters.max_steps, summary)
            max_steps = self.spec.hyperparameters.max_steps
            emit(self.job, "grpoflow.training.progress", {"step": step, "max_steps": max_steps, **summary})
        stop = False
        for alert in self.monitor.update(record):
            self.alerts.append(alert)
            self.logger.warning("health alert at step %d: %s %s", alert.step, alert.message, alert.advice)
            emit(self.job, "grpoflow.training.alert", alert.to_dict())
            stop |= self.spec.stop_on_alert
        return stop


@task(name="train", retries=2, retry_delay_seconds=5, retry_condition_fn=_retryable)
@resumable("train")
def train_task(job: JobDir, spec: JobSpec) -> dict:
    """Runs GRPO training in a child process; returns the training summary (steps, seconds, resumed_from)."""
    log_path = job.logs / "train.log"
    proc = start_child(child_command("trainers.grpo", job, spec.gpu_count), log_path)
    watcher = ProgressWatcher(job, spec)
    started = time.monotonic()
    try:
        while proc.poll() is None:
            if watcher.poll():
                stop_child(proc)
                raise TrainingStopped(f"stopped by the health monitor: {watcher.alerts[-1].message}")
            time.sleep(POLL_SECONDS)
        watcher.poll()
    finally:
        stop_child(proc)
    check_exit(proc, "training", log_path)
    summary = json.loads(job.training_result.read_text())
    summary["wall_seconds"] = round(time.monotonic() - started, 3)
    summary["alerts"] = [a.to_dict() for a in watcher.alerts]
    emit(job, "grpoflow.training.completed", {k: v for k, v in summary.items() if k != "alerts"})
    return summary
