"""Event emission for every stage: a Prefect event (`emit_event`), a line in the job's `events.jsonl`, and a queued
delivery to each of the spec's webhooks (`tasks.webhooks`).

Names follow shared/DESIGN.md: `grpoflow.<subject>.<verb>`, resource `grpoflow.job.<job_id>`.
"""

import json
import logging
import threading
import uuid
from datetime import UTC, datetime

from prefect.events import emit_event

from tasks import webhooks
from trainers.jobdir import JobDir

logger = logging.getLogger(__name__)
_lock = threading.Lock()


def emit(job: JobDir, event: str, payload: dict | None = None) -> dict:
    """Emits `event` for `job` to Prefect, appends it to `events.jsonl` and queues it for the job's webhooks.

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
