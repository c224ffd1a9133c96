"""Job bookkeeping tasks: create the job folder (id, resolved spec.yaml) and record how the job ended."""

import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path

from prefect import task

from tasks.events import emit
from trainers.jobdir import JobDir, write_text_atomic
from trainers.spec import JobSpec, to_yaml


def new_job_id(name: str) -> str:
    """`<name>-<UTC time>-<random>`: sortable by time, unique even for two runs started in the same second."""
    return f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def job_dir(output_root: str | Path, job_id: str) -> JobDir:
    return JobDir(Path(output_root).expanduser().resolve() / job_id)


@task(name="create-job")
def create_job_task(spec: JobSpec, job_id: str | None = None) -> JobDir:
    """Creates `<output_uri>/<job_id>/` with the resolved spec and emits `grpoflow.job.started`.

    An existing folder is reused only when `job_id` is given (a resumed job); a new id never collides.
    """
    job = job_dir(spec.output_uri, job_id or new_job_id(spec.name))
    job.root.mkdir(parents=True, exist_ok=job_id is not None)
    write_text_atomic(job.spec, to_yaml(spec))
    emit(job, "grpoflow.job.started", {"name": spec.name, "base_model": spec.base_model, "output_dir": str(job.root)})
    return job


def discard_job(job: JobDir) -> None:
    """Removes a job folder whose input was rejected: a rejected job leaves nothing half-written behind."""
    shutil.rmtree(job.root, ignore_errors=True)
