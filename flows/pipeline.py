"""The GRPO pipeline flow: ingest -> SFT warm-up (optional) -> GRPO -> merge -> evaluate and report -> promotion gate
-> publish -> register.

Each stage is one Prefect task (`tasks/`), emitting its `grpoflow.*` event; this flow only chains them, and
`grpoflow.tasks.job.JobEnding` ends the job (its last event, webhooks, uploads) however it ends. Run it with
`grpoflow run SPEC.yaml`, or as the `grpo-pipeline` deployment whose `spec` parameter the Prefect UI shows as a form.
"""

import time

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from prefect.states import Completed

from grpoflow.integrations.jobs import job_location
from grpoflow.integrations.stages import REJECTED, rejected, stage_done
from grpoflow.tasks.evaluate import evaluate_task
from grpoflow.tasks.gate import gate_task
from grpoflow.tasks.ingest import ingest_task
from grpoflow.tasks.job import JobEnding, create_job_task, new_job_id
from grpoflow.tasks.merge import merge_task
from grpoflow.tasks.publish import publish_task
from grpoflow.tasks.register import register_task
from grpoflow.tasks.sft import sft_task
from grpoflow.tasks.train import train_task
from grpoflow.trainers.jobdir import JobDir
from grpoflow.trainers.metrics import read_events
from grpoflow.trainers.spec import JobSpec


def job_run_name() -> str:
    """The flow run's name: its job id, as the flow derives it below (or the resumed job's)."""
    parameters = FlowRunContext.get().parameters
    name = parameters["spec"].name if isinstance(parameters["spec"], JobSpec) else parameters["spec"]["name"]
    return parameters.get("job_id") or new_job_id(name, flow_run.id, flow_run.scheduled_start_time)


@flow(name="grpo-pipeline", flow_run_name=job_run_name)
def grpo_pipeline(spec: JobSpec, job_id: str | None = None) -> dict:
    """Fine-tunes `spec.base_model` with GRPO on `spec.dataset`; returns the job id, folder and evaluation.

    Args:
        spec (`JobSpec`): the job spec; validated before anything runs.
        job_id (`str`, *optional*): reuse an existing job folder instead of creating a new one.
    """
    started = time.monotonic()

    # --- job folder (the same one on every retry of this flow run)
    created = create_job_task(
        spec, job_id or new_job_id(spec.name, flow_run.id, flow_run.scheduled_start_time), return_state=True
    )
    if created.name == REJECTED:  # another live run holds this job's folder
        return rejected(created.message)
    job = created.result()
    get_run_logger().info("job %s in %s", job.job_id, job.root)
    with JobEnding(job, spec, resumed=job_id is not None) as end:
        # --- ingest the dataset and dry-run the rewards on it (a rejection costs no model load)
        ingested = ingest_task(job, spec, return_state=True)
        if ingested.name == REJECTED:
            return end.rejected(ingested.message)
        dataset = ingested.result()

        # --- SFT format warm-up
        sft = sft_task(job, spec) if spec.sft.enabled else None

        # --- GRPO training (child process, resumes from checkpoints on retry)
        training = train_task(job, spec)

        # --- merge the adapter (LoRA jobs) and describe the artifact
        model = merge_task(job, spec)

        # --- held-out evaluation and report
        evaluation = evaluate_task(job, spec, sft, training, wall_seconds=time.monotonic() - started)

        # --- promotion gate (evaluation.gate): a model that fails it is neither published nor deployed
        promoted = gate_task(job, spec, evaluation)["promote"]

        # --- publish to the Hugging Face Hub
        if spec.publish and promoted:
            publish_task(job, spec)

        # --- register the serving deployment (served from merged/, LoRA or not)
        if spec.deploy and promoted:
            register_task(job, spec)

        # --- upload the job folder (remote output_uri) and announce the result
        result = {"job_id": job.job_id, "output_dir": job_location(job, spec), "status": "completed"}
        end.completed({**result, "evaluation": evaluation, "artifact_type": model["artifact_type"]})
    return Completed(message=end.message, data={**result, "evaluation": evaluation, "dataset": dataset})


def completed_before(job: JobDir, spec: JobSpec) -> bool:
    """Whether `job` completed and a resume would redo none of its stages (`grpoflow run --resume` then says so and
    starts no flow run, so nothing is announced twice)."""
    ends = [
        r["event"] for r in read_events(job.events) if r["event"] in ("grpoflow.job.completed", "grpoflow.job.failed")
    ]
    if not ends or ends[-1] != "grpoflow.job.completed":
        return False
    stages = ["ingest", *(["sft"] if spec.sft.enabled else []), "train", "merge", "evaluate"]
    return all(stage_done(stage, job, spec) for stage in stages)
