"""GRPO training task: runs `grpoflow.trainers.grpo` as its own child process (`grpoflow.jobs.launch`) and watches
it.

The child writes `metrics.jsonl`; this task tails it to log progress, emit `grpoflow.training.progress` events and
run the health monitor, which emits `grpoflow.training.alert` and, with `stop_on_alert` (or always, for a non-finite
loss, gradient or weights: the child stops itself on those too, exit code 4), stops the run; a stall watchdog alerts
when no new step came for `health.stall_factor` times the median step time, and stops the run at twice that. A crash
of the child (SIGKILL, OOM, an exception) fails the task and Prefect's retries start a new child that resumes from the
newest checkpoint; a setup problem (the child's exit code 2, a full disk or read-only job folder among them), a failed
reward (exit code 3), a child that exited 0 without its result, or a stop is not retried.

With a remote `output_uri`, checkpoints survive losing the machine (`grpoflow.integrations.checkpoint_sync`): a
background thread uploads each checkpoint as it is saved, with metrics, events and logs, and a child started on a fresh
machine (an empty staging folder) first gets the newest intact checkpoint from the remote job folder.

With `distributed.num_machines` > 1 the child runs on that many nodes of a Kubeflow Trainer TrainJob instead
(`grpoflow.cluster.multinode`: created, watched and deleted by this task), which share the job folder on
`distributed.shared_volume`; the watcher reads the metrics there and the checkpoints reach the store as above.
"""

import json
import statistics
import time
from functools import partial

from prefect import get_run_logger, task

from grpoflow.cluster.multinode import run_on_machines
from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import EVAL_PREFIX, EVAL_SECONDS
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.artifacts import StageProgress, StepRate, grpo_line, rollouts_artifact
from grpoflow.integrations.checkpoint_sync import CheckpointSync, restore_checkpoint
from grpoflow.integrations.events import emit
from grpoflow.integrations.heartbeat import ChildPhases
from grpoflow.integrations.stages import cancellable, resumable, retry_unless_final
from grpoflow.integrations.storage import is_remote, join
from grpoflow.jobs.launch import recorded_divergence, run_child
from grpoflow.jobs.vllm_server import vllm_server
from grpoflow.tasks import RETRY_DELAY_S
from grpoflow.trainers.health import FATAL, NON_FINITE_ADVICE, Alert, HealthMonitor
from grpoflow.trainers.metrics import read_events, read_metrics
from grpoflow.trainers.rollouts import degenerate_example


class ProgressWatcher:
    """Turns new lines of `metrics.jsonl` into a progress line per step (log, terminal bar, the UI's progress
    artifact: `grpoflow.integrations.artifacts.StageProgress`), `grpoflow.training.progress` events every `max_steps //
    20` steps, and health alerts."""

    def __init__(self, job: JobDir, spec: JobSpec):
        hp = spec.hyperparameters
        self.job, self.spec, self.last_step = job, spec, 0
        self.monitor = HealthMonitor.for_spec(spec, examples=partial(degenerate_example, job))
        self.every = max(1, hp.max_steps // 20)
        self.alerts = []
        self.logger = get_run_logger()
        # A retried task's child resumes from a checkpoint, and the steps before it are already in metrics.jsonl:
        # they feed the health monitor again (its windows need them) but their events went out the first time.
        self.announced_until = max(
            (
                (r.get("payload") or {}).get("step", 0)
                for r in read_events(job.events)
                if r.get("event") in ("grpoflow.training.progress", "grpoflow.training.alert")
            ),
            default=0,
        )
        self.rate = StepRate()
        self.progress = StageProgress(spec, "training", hp.max_steps, self.logger, start=self.announced_until)
        # The stall watchdog: when this child's steps arrived, and the seconds per step between them.
        self.polled, self.last_step_at, self.step_seconds, self.stall_alerted = False, None, [], False
        self.phases = ChildPhases(job.logs / "train.log", self.progress.note, "training")

    def poll(self) -> str | None:
        """Handles new records; returns the reason when an alert asks the run to stop."""
        stop, before = None, self.last_step
        self.phases.poll(self.last_step, self._stepping())  # the phase lines before the new steps (the model load)
        # Read before the steps: the child writes its last step's line before its exit record, so this poll's steps
        # then include the step the divergence is named at.
        diverged = recorded_divergence(self.job)
        # By step, not by line: a resuming child truncates metrics.jsonl to its checkpoint and writes those steps
        # again (bit for bit the same values: see the resume test), which are then not handled twice.
        records = read_metrics(self.job.metrics)
        for record in records:
            if record["step"] > self.last_step:
                stop = self._handle(record) or stop
                self.last_step = record["step"]
        stop = stop or self._child_diverged(diverged) or self._watch_stall(self.last_step - before)
        if self.last_step > before and self.last_step_at is not None:  # this child's steps (the watchdog's clock)
            self.phases.stepped(self.last_step, self.spec.hyperparameters.max_steps)
        # Then those after them (the final save), and how long a phase outside the steps lasts.
        self.phases.poll(self.last_step, self._stepping())
        return stop

    def _stepping(self) -> bool:
        """Whether this child's steps are coming (its first new step arrived, its last not yet): each step's own line
        then says enough, and the phase before the first step (`step 1: generating ...`) is over, not lasting."""
        return self.last_step_at is not None and self.last_step < self.spec.hyperparameters.max_steps

    def _child_diverged(self, message: str | None) -> str | None:
        """The child's own stop on NaN or inf weights (`message`, from its exit record; the loss and gradient norm it
        logged may still be finite), as the `non_finite` alert the metrics would have raised: once, the reason to
        stop."""
        if "non_finite" in self.monitor.fired or message is None:
            return None
        self.monitor.fired.add("non_finite")
        self._alert(Alert("non_finite", self.last_step, message, {"non_finite": ["weights"]}, NON_FINITE_ADVICE))
        return f"stopped by the health monitor: {message}"

    def _watch_stall(self, new_steps: int) -> str | None:
        """The stall watchdog, armed by this child's first step (the first poll reads an earlier attempt's steps, and
        the model load before step 1 has no bound worth guessing): an alert after `stall_factor` times the median
        step time without a new step (at least `stall_min_seconds`), the reason to stop at twice that. The first
        step's own time counts, from the child's last phase line before it ("model loaded ...; step 1: generating"):
        a step 1 of 328 s makes the next step's limit `stall_factor` x 328 s, not the floor."""
        now, first_poll, self.polled = time.monotonic(), not self.polled, True
        if first_poll:
            return None
        if new_steps:
            began = self.last_step_at if self.last_step_at is not None else self.phases.phase_started
            self.step_seconds.append((now - began) / new_steps)
            self.last_step_at, self.stall_alerted = now, False
            return None
        if self.last_step_at is None or self.last_step >= self.spec.hyperparameters.max_steps:
            return None  # the final save and the evaluation after the last step are no steps
        health = self.spec.health
        median = statistics.median(self.step_seconds) if self.step_seconds else None
        limit = max(health.stall_min_seconds, health.stall_factor * median) if median else health.stall_min_seconds
        waited = now - self.last_step_at
        if waited >= 2 * limit:
            return (
                f"stopped by the stall watchdog: no new step for {waited:.0f} s after step {self.last_step} "
                f"(twice the {limit:.0f} s limit: health.stall_factor x the median step time, at least "
                "health.stall_min_seconds); a reward, the generation or a collective is hung"
            )
        if waited >= limit and not self.stall_alerted:
            self.stall_alerted = True
            evidence = {"waited_s": round(waited, 1), "limit_s": round(limit, 1), "median_step_s": median}
            message = f"no new step for {waited:.0f} s after step {self.last_step} (limit {limit:.0f} s)."
            advice = "The run stops at twice the limit; look at logs/train.log and at what the rewards wait on."
            self._alert(Alert("stall", self.last_step, message, evidence, advice))
        return None

    def _alert(self, alert: Alert) -> None:
        self.alerts.append(alert)
        self.logger.warning("health alert at step %d: %s %s", alert.step, alert.message, alert.advice)
        emit(self.job, "grpoflow.training.alert", alert.to_dict())

    def _handle(self, record: dict) -> str | None:
        step, values = record["step"], record["values"]
        if step <= self.announced_until:
            self.alerts += self.monitor.update(record)
            return None
        max_steps = self.spec.hyperparameters.max_steps
        seconds_per_step = self.rate.seconds_per_step(step, values)
        self.progress.update(step, grpo_line(step, max_steps, values, seconds_per_step))
        held_out = {k: v for k, v in values.items() if k.startswith(EVAL_PREFIX) and k != EVAL_SECONDS}
        if step % self.every == 0 or step == max_steps or held_out:  # every held-out score is announced
            summary = {k: values.get(k) for k in ("reward", "reward_std", "loss", "completions/mean_length", "kl")}
            summary = {k: round(v, 4) for k, v in (summary | held_out).items() if isinstance(v, float | int)}
            emit(self.job, "grpoflow.training.progress", {"step": step, "max_steps": max_steps, **summary})
        if held_out:  # what the model writes now: the child wrote the step's rollouts before it evaluated
            rollouts_artifact(self.job, self.spec, step)
        stop = None
        for alert in self.monitor.update(record):
            self._alert(alert)
            if self.spec.stop_on_alert or alert.kind in FATAL:
                stop = f"stopped by the health monitor: {alert.message}"
        return stop


def trained(job: JobDir) -> tuple[str, ...]:
    """What GRPO produced: a LoRA job's adapter (its merged/ is the merge's), else the full weights in merged/."""
    return ("training.json", "adapter" if (job.adapter / "adapter_config.json").exists() else "merged")


@task(name="train", retries=2, retry_delay_seconds=RETRY_DELAY_S, retry_condition_fn=retry_unless_final)
@cancellable
@resumable("train", outputs=("training.json",), reads=("ingest", "sft"), digest=trained)
def train_task(job: JobDir, spec: JobSpec) -> dict:
    """Runs GRPO training in a child process; returns the training summary (steps, seconds, resumed_from)."""
    sync = None
    if is_remote(spec.output_uri):
        location = join(spec.output_uri, job.job_id)
        if restored := restore_checkpoint(job, location):
            get_run_logger().info("%s downloaded from %s: training resumes from it", restored, location)
        sync = CheckpointSync(job, location, get_run_logger())
        sync.start()
    watcher = ProgressWatcher(job, spec)
    try:
        if spec.distributed.num_machines > 1:  # a Kubeflow Trainer TrainJob, one node per machine
            seconds = run_on_machines(job, spec, poll=watcher.poll)
        else:
            with vllm_server(spec, job) as env:  # a vLLM server of the job's own, when its generation asks for one
                seconds = run_child(
                    "grpoflow.trainers.grpo",
                    job,
                    spec.gpu_count,
                    "train.log",
                    poll=watcher.poll,
                    result=job.training_result,
                    strategy=spec.distributed.strategy,
                    env=env,
                )
    finally:
        watcher.phases.flush()
        watcher.progress.close()
        if sync is not None:
            sync.stop()
    summary = json.loads(job.training_result.read_text())
    summary["wall_seconds"] = seconds
    if sync is not None:
        summary["checkpoint_uploads"] = sync.summary()
    summary["alerts"] = [a.to_dict() for a in watcher.alerts]
    emit(job, "grpoflow.training.completed", {k: v for k, v in summary.items() if k != "alerts"})
    return summary
