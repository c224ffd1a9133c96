"""SFT warm-up task: runs `trainers.sft` as a child process and emits `grpoflow.sft.completed`."""

import time

from prefect import task

from tasks.events import emit
from tasks.stages import resumable
from tasks.train import _retryable, check_exit, child_command, start_child, stop_child
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics
from trainers.spec import JobSpec


@task(name="sft", retries=1, retry_delay_seconds=5, retry_condition_fn=_retryable)
@resumable("sft")
def sft_task(job: JobDir, spec: JobSpec) -> dict:
    """Trains the format warm-up into `sft/`; returns its summary (steps, final loss, seconds)."""
    log_path = job.logs / "sft.log"
    (job.root / "sft_metrics.jsonl").unlink(missing_ok=True)
    started = time.monotonic()
    proc = start_child(child_command("trainers.sft", job, spec.gpu_count), log_path)
    try:
        proc.wait()
    finally:
        stop_child(proc)
    check_exit(proc, "SFT warm-up", log_path)
    records = read_metrics(job.root / "sft_metrics.jsonl")
    summary = {
        "steps": spec.sft.max_steps,
        "final_loss": records[-1]["values"].get("loss") if records else None,
        "seconds": round(time.monotonic() - started, 3),
        "model_dir": job.sft.name,
    }
    emit(job, "grpoflow.sft.completed", summary)
    return summary
