"""Event emission for every stage: a Prefect event (`emit_event`), a line in the job's `events.jsonl`, and a queued
delivery to each of the spec's webhooks (`grpoflow.integrations.webhooks`).

Names follow shared/DESIGN.md: `grpoflow.<subject>.<verb>`, resource `grpoflow.job.<job_id>`. The Prefect event is
sent only when a Prefect API is configured (`PREFECT_API_URL`, or a profile that sets it; `grpoflow run` sets it for
its temporary server) or inside a flow run: with neither, Prefect's `emit_event` would boot an ephemeral server
(~15 s) for a command such as `grpoflow deploy` that needs no Prefect, so the event then goes to `events.jsonl` and
the webhooks only.

Inside a flow or task run the event goes through `emit_event`, whose background worker sends it while the run goes
on (and adds the run to its related resources). Outside one (`grpoflow deploy`) it is sent before `emit` returns,
through a client that connects, sends and closes: the process may exit right after, and Prefect's worker would then
still be sending at exit ("EventsWorker - Still processing items").
"""

import asyncio
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
    from prefect.settings import get_current_settings

    return bool(get_current_settings().api.url) or _in_a_run()


def _in_a_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


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
        _to_prefect(record)
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


def _to_prefect(record: dict) -> None:
    """Sends `record` to Prefect: in a run through `emit_event`'s background worker, outside one (`grpoflow deploy`)
    at once; the module's docstring says why."""
    from prefect.events import Event, emit_event
    from prefect.settings import get_current_settings

    fields = {
        "event": record["event"],
        "resource": record["resource"],
        "payload": record["payload"],
        "id": uuid.UUID(record["id"]),
        "occurred": datetime.fromisoformat(record["occurred"]),
    }
    # Without a URL, get_events_client would start an ephemeral server: that is emit_event's job, in a run.
    if not get_current_settings().api.url or _in_a_run():
        emit_event(**fields)
        return
    try:
        asyncio.run(_send(Event(**fields)))
    except Exception as e:  # as with emit_event, a Prefect that cannot be reached never fails the command
        logger.warning("could not send %s to Prefect: %s (events.jsonl has it)", record["event"], repr(e))


async def _send(event) -> None:
    from prefect.events import get_events_client

    # Two reconnections, not the default ten: a server that cannot be reached fails at once, not after 7 s of retries.
    async with get_events_client(reconnection_attempts=2) as client:
        await client.emit(event)
