"""The `grpo-pipeline` flow for deployments that name a spec *file*: `grpo-pipeline/nightly` (a cron schedule) and
`grpo-pipeline/on-new-data` (a trigger on `grpoflow.dataset.landed`, see deployments/prefect.yaml).

It loads the spec file (a path relative to the project root the worker runs in, or a URL such as
`s3://bucket/spec.yaml`), sets `dataset.uri` from the event, validates, and runs
`grpoflow.flows.pipeline.grpo_pipeline`'s stages in this same flow run. A run with the event's dataset is named
`<name>-new-data-<UTC time>-<6 hex>`, its job id, so the run list says new data started it. It carries the pipeline's
flow name, so its deployments are listed under `grpo-pipeline` as docs/design.md names them;
`grpo-pipeline/retrain` deploys `grpo_pipeline` itself, whose `spec` parameter is the job spec object (the UI's
form). By hand:

    python -c 'from grpoflow.flows.triggered import grpo_pipeline_from_file as f; f("deployments/default-spec.yaml")'
"""

import json

from prefect import flow, get_run_logger

from grpoflow.core.spec import SpecError, load_spec
from grpoflow.core.spec.models import OptionalUrl, Url
from grpoflow.core.trust import path_outside
from grpoflow.flows.pipeline import NEW_DATA, run_pipeline
from grpoflow.integrations.stages import rejected
from grpoflow.integrations.storage import storage_options

DEFAULT_SPEC = "deployments/default-spec.yaml"


@flow(name="grpo-pipeline")
def grpo_pipeline_from_file(
    spec: OptionalUrl = None,
    dataset_uri: OptionalUrl = None,
    default_spec: Url = DEFAULT_SPEC,
    team: str | None = None,
    job_id: str | None = None,
) -> dict:
    """Runs the GRPO pipeline on the spec file `spec` (else `default_spec`), with `dataset_uri` as its dataset.

    Args:
        spec (`str`, *optional*): path or URI of a spec file; replaces `default_spec` (the event payload's `spec`).
        dataset_uri (`str`, *optional*): becomes the spec's `dataset.uri` (the event payload's `uri`).
        default_spec (`str`, *optional*, defaults to `"deployments/default-spec.yaml"`): the deployment's own spec.
        team (`str`, *optional*): the deployment's team (`grpo_pipeline`'s).
        job_id (`str`, *optional*): resume this existing job, started from the same spec and dataset
            (`grpo-pipeline/resume` sets it after a crash).
    """
    logger = get_run_logger()
    source = spec or default_spec
    # JSON quoting keeps the URI a string through the override's YAML parsing (a name like `2024` stays text).
    overrides = [f"dataset.uri={json.dumps(dataset_uri)}"] if dataset_uri else []
    if refused := path_outside("spec", source):  # the spec file itself, before it is read
        logger.error("spec %s rejected: %s", source, refused)
        return rejected(refused)
    try:
        job_spec, warnings = load_spec(source, overrides, storage_options(source))
    except SpecError as e:
        logger.error("spec %s rejected:\n%s", source, "\n".join(e.problems))
        problems = "; ".join(e.problems)
        return rejected(problems if source in problems else f"{source}: {problems}")
    for warning in warnings:
        logger.warning(warning)
    logger.info("spec %s, dataset %s", source, job_spec.dataset.uri)
    # The pipeline's tasks run in this flow run; a nested run of the same flow would only add noise. A dataset from the
    # event (on-new-data) puts `new-data` in the job id, and so in the run's name.
    return run_pipeline(job_spec, job_id, team=team, started_by=NEW_DATA if dataset_uri else None)
