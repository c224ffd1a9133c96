"""Event emission for every stage: a Prefect event (`emit_event`), a line in the job's `events.jsonl`, and a queued
delivery to each of the spec's webhooks (`grpoflow.integrations.webhooks`).

Names follow shared/DESIGN.md: `grpoflow.<subject>.<verb>`, resource `grpoflow.job.<job_id>`. The Prefect event is
sent only when a Prefect API is configured (`PREFECT_API_URL`, or a profile that sets it; `grpoflow run` sets it for
its temporary server) or inside a flow run: with neither, Prefect's `emit_event` would boot an ephemeral server
(~15 s) for a command such as `grpoflow deploy` that needs no Prefect, so the event then goes to `events.jsonl` and
the webhooks only.
"""

import json
import logging
import threading
import uuid
from datetime import UTC, datetime

from grpoflow.integrations import webhooks
from grpoflow.trainers.jobdir import JobDir

logger = logging.getLogger(__name__)
_lock = threading.Lock()


def prefect_api_configured() -> bool:
    """True when a Prefect API is configured (the environment, or the active profile), or when this runs inside a
    flow or task run (Prefect's own ephemeral server then exists already): an event then has a server to go to
    without one being started for it."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.settings import get_current_settings

    return bool(get_current_settings().api.url) or FlowRunContext.get() is not None or TaskRunContext.get() is not None


def emit(job: JobDir, event: str, payload: dict | None = None) -> dict:
    """Emits `event` for `job` to Prefect (when `prefect_api_configured`), appends it to `events.jsonl` and queues
    it for the job's webhooks.

    Returns the record written. Webhook delivery happens in the background and can never fail this call.

    Args:
        job (`JobDir`): the job the event is about.
        event (`str`): a DESIGN.md event name, e.g. `grpoflow.training.completed`.
        payload (`dict`, *optional*): JSON-serializable details; never secrets.
    """
    record = {
        "id": str(uuid.uuid4()),
        "event": event,
        "occurred": datetime.now(UTC).isoformat(),
        "resource": {"prefect.resource.id": f"grpoflow.job.{job.job_id}", "grpoflow.job_id": job.job_id},
        "payload": payload or {},
    }
    if prefect_api_configured():
        from prefect.events import emit_event

        emit_event(
            event=event,
            resource=record["resource"],
            payload=record["payload"],
            id=uuid.UUID(record["id"]),
            occurred=datetime.fromisoformat(record["occurred"]),
        )
    with _lock:
        job.root.mkdir(parents=True, exist_ok=True)
        with job.events.open("a") as f:
            f.write(json.dumps(record) + "\n")
        # Queued under the lock, so each endpoint receives events in events.jsonl's order.
        try:
            webhooks.deliver(job, record)
        except Exception:
            logger.exception("webhooks: could not queue %s for job %s", event, job.job_id)
    return record
