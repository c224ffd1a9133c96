"""Register task: the spec's serving deployment of the job's merged weights (`trainers.registry`), announced with
`grpoflow.deployment.registered`."""

from prefect import task

from tasks.events import emit
from trainers.jobdir import JobDir
from trainers.registry import register
from trainers.spec import JobSpec


@task(name="register", retries=1, retry_delay_seconds=5)
def register_task(job: JobDir, spec: JobSpec) -> dict:
    """Registers the spec's deployment for this job and emits `grpoflow.deployment.registered`."""
    record = register(job, spec.deploy.name)
    emit(job, "grpoflow.deployment.registered", {k: record[k] for k in ("name", "artifact_path", "status")})
    return record
