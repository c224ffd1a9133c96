"""Publish task: pushes the job's model to the Hugging Face Hub (`grpoflow.jobs.publish`), writes `published.json`
and emits `grpoflow.model.published`. Here the Hub token may also come from the Prefect Secret block `hf-token`.

    grpoflow publish JOB_ID --repo-id my-org/my-model [--artifact merged|adapter]
"""

from datetime import UTC, datetime

from huggingface_hub import get_token
from prefect import get_run_logger, task
from prefect.settings import get_current_settings

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec, PublishSpec
from grpoflow.integrations.artifacts import link_artifact
from grpoflow.integrations.events import emit
from grpoflow.integrations.stages import cancellable
from grpoflow.jobs.publish import TOKEN_SECRET_BLOCK, PublishError, publish


def _secret_block_token() -> str | None:
    # Without a Prefect API there is no block to load, and trying would start an ephemeral server.
    if not get_current_settings().api.url:
        return None
    try:
        from prefect.blocks.system import Secret

        return Secret.load(TOKEN_SECRET_BLOCK).get()
    except Exception:  # no such block, or the server is down: fall through to the "no token" message
        return None


def publish_and_record(job: JobDir, target: PublishSpec, spec: JobSpec | None = None) -> dict:
    """`grpoflow.jobs.publish.publish` with the token found as huggingface_hub finds it, else in the Prefect Secret
    block `hf-token`; then `published.json` in the job folder and the `grpoflow.model.published` event."""
    result = publish(job, target, token=get_token() or _secret_block_token(), spec=spec)
    write_json_atomic(job.root / "published.json", {**result, "published_at": datetime.now(UTC).isoformat()})
    emit(job, "grpoflow.model.published", result)
    return result


# No Prefect retries: `publish` retries transient failures itself, because `grpoflow publish` runs it without Prefect.
# Task retries on top would multiply the attempts (3 x 3 for a Hub that stays down) and retry nothing more.
@task(name="publish", retries=0)
@cancellable
def publish_task(job: JobDir, spec: JobSpec) -> dict:
    """Publishes the job per its spec's `publish:` block, writes `published.json`, emits `grpoflow.model.published`.

    The token is resolved inside, so it is never a task parameter that Prefect would record.
    """
    if spec.publish is None:
        raise PublishError(
            "the spec has no publish: block; add one with repo_id (or use grpoflow publish)", user_error=True
        )
    result = publish_and_record(job, spec.publish, spec=spec)
    link_artifact(
        spec, "hub-repo", result["url"], result["repo_id"], f"The {result['artifact']} model of {job.job_id}"
    )
    get_run_logger().info(
        "published the %s model to %s: %s", result["artifact"], result["url"], result["commit"] or "unchanged"
    )
    return result
