"""The GRPO pipeline flow: ingest -> SFT warm-up (optional) -> GRPO -> merge -> evaluate and report.

Each stage is one Prefect task (`tasks/`), emitting its `grpoflow.*` event; this flow only chains them. Run it with
`grpoflow run SPEC.yaml`, or as the `grpo-pipeline` deployment whose `spec` parameter the Prefect UI shows as a form.
"""

import time

from prefect import flow, get_run_logger
from prefect.states import Failed

from tasks import webhooks
from tasks.evaluate import evaluate_task
from tasks.events import emit
from tasks.ingest import ingest_task
from tasks.job import create_job_task, discard_job
from tasks.merge import merge_task
from tasks.sft import sft_task
from tasks.train import train_task
from trainers.grpo import start_model
from trainers.spec import JobSpec

# The most a job's end waits for its webhook deliveries (a bounded wait: the last events, e.g. job.completed, would
# otherwise be lost when the process exits; a dead endpoint costs at most this).
WEBHOOK_FLUSH_S = 10.0


# A flow that ends with this message rejected its input: the CLI's exit code 2, with no traceback logged.
REJECTED_PREFIX = "rejected: "


@flow(name="grpo-pipeline")
def grpo_pipeline(spec: JobSpec, job_id: str | None = None) -> dict:
    """Fine-tunes `spec.base_model` with GRPO on `spec.dataset`; returns the job id, folder and evaluation.

    Args:
        spec (`JobSpec`): the job spec (see shared/DESIGN.md); validated before anything runs.
        job_id (`str`, *optional*): reuse an existing job folder instead of creating a new one.
    """
    logger = get_run_logger()
    started = time.monotonic()

    # --- job folder
    job = create_job_task(spec, job_id)
    logger.info("job %s in %s", job.job_id, job.root)
    try:
        # --- ingest the dataset and dry-run the rewards on it (rejections cost no model load)
        dataset = ingest_task(job, spec)
        if dataset["rejected"]:
            emit(job, "grpoflow.job.failed", {"reason": "rejected", "error": dataset["rejected"]})
            discard_job(job)
            # Delivers the job.failed above; its folder is already discarded, so webhooks.jsonl is not written.
            webhooks.flush(timeout=WEBHOOK_FLUSH_S)
            return Failed(message=f"{REJECTED_PREFIX}{dataset['rejected']}")

        # --- SFT format warm-up
        sft = sft_task(job, spec) if spec.sft.enabled else None

        # --- GRPO training (child process, resumes from checkpoints on retry)
        training = train_task(job, spec)

        # --- merge the adapter (LoRA jobs) and describe the artifact
        model = merge_task(job)

        # --- held-out evaluation and report
        extra = {
            "wall_time_s": round(time.monotonic() - started, 1),
            "GRPO_training": f"{training['wall_seconds']:.1f} s",
            "resumed_from_checkpoint": training["resumed_from"] or "no",
        }
        if sft:
            extra["SFT_warm_up"] = f"{sft['seconds']:.1f} s"
        evaluation = evaluate_task(job, spec, start_model(spec, job), extra)
    except BaseException as e:
        emit(job, "grpoflow.job.failed", {"reason": type(e).__name__, "error": str(e)[-2000:]})
        webhooks.flush(timeout=WEBHOOK_FLUSH_S)
        raise

    result = {"job_id": job.job_id, "output_dir": str(job.root), "status": "completed"}
    emit(job, "grpoflow.job.completed", {**result, "evaluation": evaluation, "artifact_type": model["artifact_type"]})
    webhooks.flush(timeout=WEBHOOK_FLUSH_S)
    return {**result, "evaluation": evaluation, "dataset": dataset}
