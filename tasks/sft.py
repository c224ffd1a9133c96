"""SFT warm-up task: runs `grpoflow.trainers.sft` as a child process (`grpoflow.jobs.launch`), tails its
`sft_metrics.jsonl` into progress lines (`sft step n/N loss ...`, the UI's progress artifact, a terminal bar) and emits
`grpoflow.sft.completed`."""

from prefect import get_run_logger, task

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.artifacts import StageProgress, StepRate, sft_line
from grpoflow.integrations.events import emit
from grpoflow.integrations.heartbeat import ChildPhases
from grpoflow.integrations.stages import cancellable, resumable, retry_unless_final
from grpoflow.jobs.launch import run_child
from grpoflow.tasks import RETRY_DELAY_S
from grpoflow.trainers.metrics import read_metrics


class SFTWatcher:
    """Turns each new record of `sft_metrics.jsonl` (one per SFT logging step) into a progress line."""

    def __init__(self, job: JobDir, spec: JobSpec):
        self.path, self.total, self.last_step = job.root / "sft_metrics.jsonl", spec.sft.max_steps, 0
        self.rate = StepRate()
        self.progress = StageProgress(spec, "sft", self.total, get_run_logger())
        self.phases = ChildPhases(job.logs / "sft.log", self.progress.note, "SFT warm-up")
        self.polled = False  # the first poll may read a retried warm-up's earlier steps

    def poll(self) -> None:
        if self.last_step == 0:  # the phases before the first step come before it
            self.phases.poll()
        before = self.last_step
        for record in read_metrics(self.path):
            if record["step"] > self.last_step:
                step, values = record["step"], record["values"]
                self.progress.update(
                    step, sft_line(step, self.total, values, self.rate.seconds_per_step(step, values))
                )
                self.last_step = step
        if self.last_step > before and self.polled:  # this child's steps: a beat counts from the last one
            self.phases.stepped(self.last_step, self.total)
        self.polled = True
        if self.last_step:
            self.phases.poll(stepping=self.last_step < self.total)  # SFT logs every few steps: not held back


@task(name="sft", retries=1, retry_delay_seconds=RETRY_DELAY_S, retry_condition_fn=retry_unless_final)
@cancellable
@resumable("sft", outputs=("sft/config.json",), reads=("ingest",))
def sft_task(job: JobDir, spec: JobSpec) -> dict:
    """Trains the format warm-up into `sft/`; returns its summary (steps, final loss, seconds). A warm-up stopped
    midway goes on from its newest checkpoint (the child keeps sft_metrics.jsonl up to it)."""
    watcher = SFTWatcher(job, spec)
    try:
        seconds = run_child(
            "grpoflow.trainers.sft",
            job,
            spec.gpu_count,
            "sft.log",
            poll=watcher.poll,
            strategy=spec.distributed.strategy,
        )
    finally:
        watcher.progress.close()
    watcher.progress.finish()
    records = read_metrics(job.root / "sft_metrics.jsonl")
    summary = {
        "steps": spec.sft.max_steps,
        "final_loss": records[-1]["values"].get("loss") if records else None,
        "seconds": seconds,
        "model_dir": job.sft.name,
    }
    emit(job, "grpoflow.sft.completed", summary)
    return summary
