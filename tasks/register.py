"""Register task: the job's merged weights registered in the serving registry under the spec's `deploy.name`
(`grpoflow.jobs.registry`), announced with `grpoflow.deployment.registered` (the serving registry's event). The
registry keeps every version of a name (`grpoflow serving list`)."""

from prefect import task

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.artifacts import link_artifact, serving_link
from grpoflow.integrations.events import emit
from grpoflow.jobs.registry import register
from grpoflow.tasks import RETRY_DELAY_S


def registered_payload(record: dict) -> dict:
    """The `grpoflow.deployment.registered` payload: the name, its new version, the weights, status and score."""
    return {k: record.get(k) for k in ("name", "version", "artifact_path", "status", "metric", "score")}


@task(name="register", retries=1, retry_delay_seconds=RETRY_DELAY_S)
def register_task(job: JobDir, spec: JobSpec) -> dict:
    """Registers this job as the current version of the spec's `deploy.name` in the serving registry; emits
    `grpoflow.deployment.registered`."""
    record = register(job, spec.deploy.name, owner=spec.name)
    text = f"serving {record['name']} ({record['status']}): grpoflow serve {record['name']}"
    # The artifact's key keeps its kind, `deployment` (`<base>-deployment`), so a link readers follow stays put.
    link_artifact(spec, "deployment", serving_link(job, record), text, f"{job.job_id} in the serving registry")
    emit(job, "grpoflow.deployment.registered", registered_payload(record))
    return record
