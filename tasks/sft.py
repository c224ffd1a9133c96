"""SFT warm-up task: runs `trainers.sft` as a child process (`trainers.launch`) and emits `grpoflow.sft.completed`."""

from prefect import task

from tasks.events import emit
from tasks.stages import resumable, retry_unless_final
from trainers.jobdir import JobDir
from trainers.launch import run_child
from trainers.metrics import read_metrics
from trainers.spec import JobSpec


@task(name="sft", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_final)
@resumable("sft", outputs=("sft/config.json",), reads=("ingest",))
def sft_task(job: JobDir, spec: JobSpec) -> dict:
    """Trains the format warm-up into `sft/`; returns its summary (steps, final loss, seconds)."""
    (job.root / "sft_metrics.jsonl").unlink(missing_ok=True)
    seconds = run_child("trainers.sft", job, spec.gpu_count, "sft.log")
    records = read_metrics(job.root / "sft_metrics.jsonl")
    summary = {
        "steps": spec.sft.max_steps,
        "final_loss": records[-1]["values"].get("loss") if records else None,
        "seconds": seconds,
        "model_dir": job.sft.name,
    }
    emit(job, "grpoflow.sft.completed", summary)
    return summary
