"""Register task: the spec's serving deployment of the job's merged weights (`grpoflow.jobs.registry`), announced
with `grpoflow.deployment.registered`. The registry keeps every version of a name (`grpoflow deployments list`)."""

from prefect import task

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.artifacts import deployment_link, link_artifact
from grpoflow.integrations.events import emit
from grpoflow.jobs.registry import register
from grpoflow.tasks import RETRY_DELAY_S


def registered_payload(record: dict) -> dict:
    """The `grpoflow.deployment.registered` payload: the name, its new version, the weights, status and score."""
    return {k: record.get(k) for k in ("name", "version", "artifact_path", "status", "metric", "score")}


@task(name="register", retries=1, retry_delay_seconds=RETRY_DELAY_S)
def register_task(job: JobDir, spec: JobSpec) -> dict:
    """Registers this job as the current version of the spec's deployment; emits `grpoflow.deployment.registered`."""
    record = register(job, spec.deploy.name, owner=spec.name)
    text = f"deployment {record['name']} ({record['status']}): grpoflow serve {record['name']}"
    link_artifact(spec, "deployment", deployment_link(job, record), text, f"The serving deployment of {job.job_id}")
    emit(job, "grpoflow.deployment.registered", registered_payload(record))
    return record
