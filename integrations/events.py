"""Event emission for every stage: a Prefect event (`emit_event`), a line in the job's `events.jsonl`, and a queued
delivery to each of the spec's webhooks (`grpoflow.integrations.webhooks`).

Names follow docs/design.md: `grpoflow.<subject>.<verb>`, resource `grpoflow.job.<job_id>`. The Prefect event is
sent only when a Prefect API is configured (`PREFECT_API_URL`, or a profile that sets it; `grpoflow run` sets it for
its temporary server) or inside a flow run: with neither, Prefect's `emit_event` would boot an ephemeral server
(~15 s) for a command such as `serving register` that needs no Prefect, so the event then goes to `events.jsonl` and
the webhooks only.

Inside a flow or task run the event goes through `emit_event`, whose background worker sends it while the run goes
on (and adds the run to its related resources). Outside one (`serving register`) it is sent before `emit` returns,
through a client that connects, sends and closes: the process may exit right after, and Prefect's worker would then
still be sending at exit ("EventsWorker - Still processing items").
"""

import asyncio
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from grpoflow.core.jobdir import JobDir
from grpoflow.integrations import webhooks

logger = logging.getLogger(__name__)
_lock = threading.Lock()


@dataclass(frozen=True)
class EventKind:
    """One event grpoflow emits: when, and its payload's keys.

    Args:
        when (`str`): what happened.
        payload (`dict[str, str]`): each key of the payload, with what it holds.
        more (`str`, *optional*): the payload's other keys, when it has more than `payload` names (e.g. every metric).
    """

    when: str
    payload: dict[str, str]
    more: str = ""


_JOB_END = {"job_id": "the job's id", "output_dir": "its folder (or URL)", "status": "`completed`"}
_ALERT = {
    "kind": "policy_collapse, length_explosion, kl_drift, no_learning_signal, non_finite, held_out_divergence, stall "
    "or no_improvement",
    "step": "the training step it fired at",
    "message": "one sentence saying what was seen",
    "evidence": "the numbers behind it: window, values, thresholds",
    "advice": "what to change in the spec",
}
_GATE = {
    "promote": "false",
    "reason": "why: the gate's kind (not_scored, no_improvement, below_min_gain, not_significant, below_deployed), "
    "`not_approved` or `timeout`",
    "kind": "the gate's check that decided",
    "metric": "the held-out metric",
    "before": "held-out score of the start model",
    "after": "held-out score of the GRPO result",
    "gain": "after minus before",
    "gain_ci": "the gain's interval, [low, high]: a paired bootstrap over the held-out prompts "
    "(evaluation.confidence); null without one",
    "confidence": "evaluation.confidence, the interval's confidence (e.g. 0.95), or null",
    "deployed_score": "the score of the version deploy.name serves now (beat_deployed), else null",
    "min_gain": "evaluation.gate.min_gain",
    "significant": "evaluation.gate.significant: the gain's lower bound had to exceed min_gain",
    "beat_deployed": "evaluation.gate.beat_deployed",
    "message": "the decision in words",
}
# Every event grpoflow emits (docs/design.md), named `grpoflow.<subject>.<verb>`: `emit` refuses any other name,
# and the docs' events page is generated from this table. Resource: `grpoflow.job.<job_id>` (the watcher's:
# `grpoflow.dataset.<uri>`); a webhook's body carries the name without `grpoflow.` as its `type`.
EVENTS = {
    "grpoflow.job.started": EventKind(
        "a job's folder is created (or a job resumed)",
        {"name": "the spec's name", "base_model": "the spec's base_model", "output_dir": "the job's folder (or URL)"},
    ),
    "grpoflow.dataset.ingested": EventKind(
        "the dataset was read, checked and saved to the job folder",
        {
            "uri": "dataset.uri",
            "num_train": "training prompts",
            "num_eval": "held-out prompts",
            "columns": "the dataset's columns",
            "prompt_format": "`text` or `chat`",
            "fingerprint": "a hash of the ingested rows",
        },
    ),
    "grpoflow.sft.completed": EventKind(
        "the SFT warm-up finished",
        {
            "steps": "sft.max_steps",
            "final_loss": "the last step's loss",
            "seconds": "its wall time",
            "model_dir": "the folder of its model (`sft`)",
        },
    ),
    "grpoflow.training.progress": EventKind(
        "a GRPO step was logged (every few steps, the last, and each step with a held-out score)",
        {
            "step": "the step",
            "max_steps": "hyperparameters.max_steps",
            "reward": "the step's mean total reward",
            "reward_std": "its standard deviation within the groups",
            "loss": "the step's loss",
            "completions/mean_length": "the completions' mean length in tokens",
            "kl": "the KL to the reference model (kl_coef > 0 only)",
        },
        more="`eval/METRIC`, the held-out score, at a step with a held-out evaluation (evaluation.every)",
    ),
    "grpoflow.training.alert": EventKind("a health alert fired (docs/design.md, Health alerts)", _ALERT),
    "grpoflow.training.completed": EventKind(
        "GRPO training ended",
        {"global_step": "steps trained", "selected_step": "the step whose model goes on (evaluation.select)"},
        more="every other key of the job's training.json (artifact, times, LoRA targets, parameter counts)",
    ),
    "grpoflow.adapter.merged": EventKind(
        "a LoRA adapter was merged into the base model",
        {"artifact_type": "`adapter`", "merged_files": "the files of merged/"},
    ),
    "grpoflow.model.published": EventKind(
        "the model was pushed to the Hugging Face Hub",
        {
            "repo_id": "publish.repo_id",
            "url": "the repository's URL",
            "commit": "the new commit, null when nothing changed",
            "revision": "the repository's head commit",
            "changed": "whether the push changed the repository",
            "artifact": "`merged` or `adapter`",
        },
    ),
    "grpoflow.model.rejected": EventKind(
        "the GRPO result failed the evaluation gate (or its approval): neither published nor deployed",
        _GATE,
        more="with approval: the approver's answer and note",
    ),
    "grpoflow.deployment.registered": EventKind(
        "the serving registry's: a name's new version was registered (the event keeps its name; `grpoflow serving`)",
        {
            "name": "the name in the serving registry",
            "version": "its new version",
            "artifact_path": "the weights it serves",
            "status": "its status (`ready` once the smoke inference passed)",
            "metric": "the held-out metric",
            "score": "the held-out score",
        },
    ),
    "grpoflow.job.completed": EventKind(
        "the job finished",
        {
            **_JOB_END,
            "evaluation": "the held-out evaluation (evaluation.json; `ci`: the scores' and the gain's intervals)",
            "suites": "the evaluation suites' scores of the start and the kept model (suites.json), or null without "
            "evaluation.suites",
            "artifact_type": "adapter or full",
        },
    ),
    "grpoflow.job.failed": EventKind(
        "the job ended without completing",
        {
            "reason": "`rejected` (bad input), `cancelled`, `crashed` (its runs crashed more often than "
            "GRPOFLOW_AUTO_RESUME resumes), or the failure's exception class",
            "error": "the message (its last 2000 characters)",
        },
    ),
    "grpoflow.job.resumed": EventKind(
        "a run that ended Crashed (its process or machine lost) was resumed by grpo-pipeline/resume, in the run "
        "named `<job id>-resume-<resume>`",
        {
            "resume": "which automatic resume of the job this is (1, 2, ...)",
            "max_resumes": "GRPOFLOW_AUTO_RESUME, the most a job gets",
            "checkpoint": "the newest training checkpoint it goes on from (`checkpoint-N`), or null",
        },
    ),
    "grpoflow.dataset.landed": EventKind(
        "the data watcher saw a new file version (resource `grpoflow.dataset.<uri>`); the on-new-data deployment's "
        "trigger starts a run with it",
        {
            "uri": "the file's URI",
            "size": "its size in bytes",
            "etag": "its ETag (object stores)",
            "mtime": "its modification time",
            "version": "its version id or ETag",
            "spec": "the spec to run (the watcher's `spec` parameter), or null",
        },
    ),
}


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
        event (`str`): a name in `EVENTS`, e.g. `grpoflow.training.completed`.
        payload (`dict`, *optional*): JSON-serializable details; never secrets.
    """
    if event not in EVENTS:
        raise ValueError(f"{event!r} is not an event of grpoflow's (grpoflow.integrations.events.EVENTS)")
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
    """Sends `record` to Prefect: in a run through `emit_event`'s background worker, outside one (`serving register`)
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
