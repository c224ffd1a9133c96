"""The GRPO pipeline flow: ingest -> SFT warm-up (optional) -> GRPO -> merge -> evaluate and report.

Each stage is one Prefect task (`tasks/`), emitting its `grpoflow.*` event; this flow only chains them. Run it with
`grpoflow run SPEC.yaml`, or as the `grpo-pipeline` deployment whose `spec` parameter the Prefect UI shows as a form.
"""

import time

from prefect import flow, get_run_logger
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run
from prefect.states import Failed

from tasks import webhooks
from tasks.evaluate import evaluate_task
from tasks.events import emit
from tasks.ingest import ingest_task
from tasks.job import create_job_task, discard_job, job_location, new_job_id, upload_failed_job, upload_job_task
from tasks.merge import merge_task
from tasks.publish import publish_task
from tasks.register import register_task
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

    # --- job folder (the same one on every retry of this flow run)
    resumed = job_id is not None
    job_id = job_id or new_job_id(spec.name, flow_run.id, flow_run.scheduled_start_time)
    job = create_job_task(spec, job_id)
    logger.info("job %s in %s", job.job_id, job.root)
    try:
        # --- ingest the dataset and dry-run the rewards on it (rejections cost no model load)
        dataset = ingest_task(job, spec)
        if dataset["rejected"]:
            emit(job, "grpoflow.job.failed", {"reason": "rejected", "error": dataset["rejected"]})
            if not resumed:  # never delete an earlier job's checkpoints over a rejected input
                discard_job(job)
            # Delivers the job.failed above; its folder is already discarded, so webhooks.jsonl is not written.
            webhooks.flush(timeout=WEBHOOK_FLUSH_S)
            return Failed(message=f"{REJECTED_PREFIX}{dataset['rejected']}")

        # --- SFT format warm-up
        sft = sft_task(job, spec) if spec.sft.enabled else None

        # --- GRPO training (child process, resumes from checkpoints on retry)
        training = train_task(job, spec)

        # --- merge the adapter (LoRA jobs) and describe the artifact
        model = merge_task(job, spec)

        # --- held-out evaluation and report
        extra = {
            "wall_time_s": round(time.monotonic() - started, 1),
            "GRPO_training": f"{training['wall_seconds']:.1f} s",
            "resumed_from_checkpoint": training["resumed_from"] or "no",
        }
        if sft:
            extra["SFT_warm_up"] = f"{sft['seconds']:.1f} s"
        evaluation = evaluate_task(job, spec, start_model(spec, job), extra)

        # --- publish to the Hugging Face Hub
        if spec.publish:
            publish_task(job, spec)

        # --- register the serving deployment (served from merged/, LoRA or not)
        if spec.deploy:
            register_task(job, spec)

        # --- upload the job folder when output_uri is s3://..., before job.completed announces it
        upload_job_task(job, spec)
    except BaseException as e:
        # A cancelled flow run (Prefect UI, SIGTERM) or Ctrl-C: the training child is stopped, its checkpoints kept.
        reason = "cancelled" if isinstance(e, TerminationSignal | KeyboardInterrupt) else type(e).__name__
        emit(job, "grpoflow.job.failed", {"reason": reason, "error": str(e)[-2000:]})
        webhooks.flush(timeout=WEBHOOK_FLUSH_S)
        upload_failed_job(job, spec)
        raise

    result = {"job_id": job.job_id, "output_dir": job_location(job, spec), "status": "completed"}
    emit(job, "grpoflow.job.completed", {**result, "evaluation": evaluation, "artifact_type": model["artifact_type"]})
    webhooks.flush(timeout=WEBHOOK_FLUSH_S)
    upload_job_task(job, spec, names=("events.jsonl", "webhooks.jsonl"))
    return {**result, "evaluation": evaluation, "dataset": dataset}
