"""Signed webhook delivery of the job's events (Standard Webhooks), at least once, off the training's critical path.

`grpoflow.integrations.events.emit` calls `deliver(job, record)` for every event; it reads the webhooks from the job's
`spec.yaml`, records one delivery per webhook in the job folder's outbox (synced to disk before anything is sent),
queues them and returns. One daemon thread per endpoint URL posts that endpoint's events in order, retrying
connection errors, timeouts, 429 and 5xx with backoff (`POLICY`); other 4xx, and a reply over the size cap, are
final. Each attempt ends within `POLICY.timeout_s` in all, from connecting to the reply's last byte, and reads at most
the reply cap (`grpoflow.core.outbound`: GRPOFLOW_HTTP_DEADLINE_S, GRPOFLOW_HTTP_MAX_RESPONSE_MB). A dead, hanging
or trickling endpoint therefore delays only its own queue, never the run. `flush(timeout)` waits, at most `timeout`
seconds, for the queues to drain.

A delivery that gave up (retries exhausted, still queued when the process exited, or `dropped`) stays undelivered in
the outbox and is sent again, with the same `webhook-id` and body, when the job resumes (`resend`, from
`grpoflow.tasks.bookkeeping.create_job_task`) or on `grpoflow webhooks retry JOB_ID` (`retry`); `undelivered(job)`
lists them, and the job's end writes them into `report.md`. Receivers therefore get each event at least once and
deduplicate on `webhook-id`. Within one process, a delivery still queued or under way is never queued twice.

Each request: a POST of `{"type": "training.completed", "timestamp": "<ISO 8601 UTC>", "data": {..., "job_id": ...}}`
with headers `webhook-id` (the event id, the same on every retry and resend: use it to deduplicate),
`webhook-timestamp` (unix seconds of this attempt), `webhook-signature` (`v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">`, only when the webhook has a `secret_env`), `content-type: application/json` and
`user-agent: grpoflow/<version>`. A `secret_env` naming an unset or empty variable is a failed delivery: nothing is
sent unsigned (a verifying receiver would reject it anyway).

A webhook with `openai_events: true` also gets a job's end as OpenAI's fine-tuning webhook event (`OPENAI_EVENTS`),
whichever way the job started, so a receiver written for OpenAI's webhooks (`openai.OpenAI().webhooks.unwrap(body,
headers, secret=...)`) works unchanged: `{"id": "evt_<event id>", "object": "event", "created_at": <unix seconds>,
"type": "fine_tuning.job.succeeded|failed|cancelled", "data": {"id": "<job id>"}}`, right after grpoflow's own
event, with its own `webhook-id` (`evt_<event id>`), signed the same way. One with `openai_events: only` gets those
events and none of grpoflow's own (the jobs API gives a team's webhooks so to the jobs OpenAI's client creates).

Signing is the `standardwebhooks` package's (the convention's reference implementation). A secret written
`whsec_<base64>` is the package's own form and signs with the decoded bytes; any other secret signs with its UTF-8
bytes, so it is handed to the package as bytes (given a bare string, the package would base64-decode it). Receivers
verify with the package too:

    from standardwebhooks import Webhook

    Webhook(secret if secret.startswith("whsec_") else secret.encode()).verify(raw_body, headers)  # raises if bad

or with `verify` here, which does the same and returns a bool. Both reject a timestamp more than 5 minutes from now.

The job folder's `webhooks-outbox.jsonl` (`OUTBOX`) gets one line per queued delivery, appended and never rewritten:
`time` (when queued), `event_id`, `type`, `url` (the spec's webhook URL, which the spec keeps free of credentials),
`body` (the exact request body, as text). Its `webhooks.jsonl` gets one line per attempt: `time`, `event_id`, `type`,
`url` (scheme://host[:port]/path: no userinfo, no query), `attempt` (1-based; 0 when nothing was sent), `outcome`
(`retrying`, `delivered`, `failed`, or `dropped` when the endpoint's queue is full), `status` (HTTP status or null),
`error` (or null), `duration_s`. The line whose outcome is not `retrying` is the attempt's final one. A delivery is
settled by a `delivered` line, or a `failed` one with a 4xx status other than 429 (the receiver's final word); every
other outbox line is undelivered. Neither secrets nor signatures are ever written or logged.
"""

import asyncio
import base64
import contextvars
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import yaml
from pydantic import TypeAdapter
from standardwebhooks import Webhook, WebhookVerificationError

from grpoflow.core import outbound
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import WebhookSpec
from grpoflow.core.uris import ALLOW_LINK_LOCAL_ENV, link_local_address
from grpoflow.trainers.metrics import read_jsonl

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """How hard one delivery tries. Each delivery keeps the policy in force when its event was emitted."""

    timeout_s: float = 5.0  # one attempt in all, connection to the reply's last byte (GRPOFLOW_HTTP_DEADLINE_S caps)
    backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)  # waits between attempts: len + 1 attempts in all
    max_retry_after_s: float = 30.0  # a larger Retry-After is ignored in favour of the backoff


POLICY = Policy()
OUTBOX = "webhooks-outbox.jsonl"  # in the job folder, beside webhooks.jsonl
# Per endpoint. A hanging endpoint and a chatty job (a progress event per step) would otherwise grow memory unbounded.
MAX_QUEUED = 1000

try:
    USER_AGENT = f"grpoflow/{version('grpoflow')}"
except PackageNotFoundError:  # running from a source tree that was never installed
    USER_AGENT = "grpoflow/0+unknown"

_HOOKS = TypeAdapter(list[WebhookSpec])


@dataclass(frozen=True)
class _Delivery:
    job: JobDir
    hook: WebhookSpec
    msg_id: str
    type: str
    body: bytes
    policy: Policy
    # The emitter's context, where the delivery runs: Prefect's settings live in context variables, and a worker
    # thread's own context lacks the API URL `grpoflow run` sets for its temporary server (a Secret block lookup
    # there would find no server).
    context: contextvars.Context = field(default_factory=contextvars.copy_context, compare=False)


_queues: dict[str, queue.Queue] = {}
_queues_lock = threading.Lock()
_spec_cache: dict[Path, tuple[int, list[WebhookSpec]]] = {}
_idle = threading.Condition()  # guards _pending and _in_flight; notified when _pending drops to 0
_pending = 0
_in_flight: set[tuple[Path, str, str]] = set()  # (job folder, event id, log URL) queued or under way here
_log_lock = threading.Lock()
_warned: set[tuple[Path, str]] = set()


# --- public API ---------------------------------------------------------------------------------------------------


# OpenAI's fine-tuning webhook event for grpoflow's job ends: (event, its payload's reason or None) -> OpenAI's type.
OPENAI_EVENTS = {
    ("grpoflow.job.completed", None): "fine_tuning.job.succeeded",
    ("grpoflow.job.failed", "cancelled"): "fine_tuning.job.cancelled",
    ("grpoflow.job.failed", None): "fine_tuning.job.failed",  # any other reason: rejected, or the exception's class
}


def openai_event(job_id: str, record: dict) -> dict | None:
    """OpenAI's webhook event for `record` (an `events.jsonl` record), or None when it is no job end.

    >>> openai_event("j-1", {"id": "e1", "event": "grpoflow.job.failed", "occurred": "2026-12-06T10:00:00+00:00",
    ...                      "payload": {"reason": "cancelled"}})["type"]
    'fine_tuning.job.cancelled'
    """
    reason = (record.get("payload") or {}).get("reason")
    kind = OPENAI_EVENTS.get((record["event"], reason)) or OPENAI_EVENTS.get((record["event"], None))
    if kind is None:
        return None
    created = int(datetime.fromisoformat(record["occurred"]).timestamp())
    return {"id": f"evt_{record['id']}", "object": "event", "created_at": created, "type": kind,
            "data": {"id": job_id}}  # fmt: skip


def deliver(job: JobDir, record: dict) -> None:
    """Queues `record` (an `events.jsonl` record) for every webhook of `job`'s spec and returns at once.

    Args:
        job (`JobDir`): the job; its `spec.yaml` names the webhooks. No spec file or no webhooks: nothing happens.
        record (`dict`): the record `grpoflow.integrations.events.emit` wrote (`id`, `event`, `occurred`, `payload`).
    """
    hooks = _webhooks(job)
    if not hooks:
        return
    data = {**record["payload"], "job_id": job.job_id}
    body = {"type": record["event"].removeprefix("grpoflow."), "timestamp": record["occurred"], "data": data}
    raw = json.dumps(body, separators=(",", ":")).encode()
    items = [_Delivery(job, hook, record["id"], body["type"], raw, POLICY) for hook in hooks
             if hook.openai_events != "only"]  # fmt: skip
    if (openai := openai_event(job.job_id, record)) is not None:
        raw = json.dumps(openai, separators=(",", ":")).encode()
        asking = [hook for hook in hooks if hook.openai_events]
        items += [_Delivery(job, hook, openai["id"], openai["type"], raw, POLICY) for hook in asking]
    if not items:
        return
    _to_outbox(items)
    for item in items:
        _enqueue(item)


def flush(timeout: float = 10.0) -> bool:
    """Waits until every queued delivery has finished (delivered or given up), but never longer than `timeout`.

    Args:
        timeout (`float`, *optional*, defaults to `10.0`): the most seconds to wait.

    Returns:
        `bool`: True if nothing is left; False if deliveries are still under way (they go on in the background).
    """
    with _idle:
        drained = _idle.wait_for(lambda: _pending == 0, timeout=max(0.0, timeout))
        left = _pending
    if not drained:
        logger.warning("webhooks: %d deliveries still under way after %.1fs; see webhooks.jsonl", left, timeout)
    return drained


def undelivered(job: JobDir) -> list[dict]:
    """The deliveries of `job` that reached no final outcome, in the order they were queued: what `resend` sends.

    A delivery is settled by a `delivered` line in `webhooks.jsonl`, or a `failed` one with a 4xx status other than
    429 (the receiver's final word). One that gave up after its retries, failed before sending (an unset
    `secret_env`), was still queued when its process exited, or was `dropped` is undelivered.

    Args:
        job (`JobDir`): the job; one without an outbox (no webhooks) has nothing undelivered.

    Returns:
        `list[dict]`: `time` (when first queued), `event_id`, `type`, `url` (as `webhooks.jsonl` shows it: no
        userinfo, no query) and `last` (its latest `webhooks.jsonl` line; None when it was never attempted).
    """
    settled, last = _attempts(job)
    return [_listed(entry, last) for entry in _unsettled(job, settled)]


def resend(job: JobDir) -> list[dict]:
    """Queues `job`'s undelivered deliveries again and returns at once: the same `webhook-id` and body, signed afresh.

    Each goes to the webhook of the same URL in the job's spec.yaml as it is now (its `secret_env` too); one the spec
    no longer lists is logged `failed`, unsent. A delivery still queued or under way in this process is left to it.

    Args:
        job (`JobDir`): the job, e.g. one being resumed (`grpoflow.tasks.bookkeeping.create_job_task`).

    Returns:
        `list[dict]`: the deliveries sent again (or failed at once), as `undelivered` lists them.
    """
    hooks = {hook.url: hook for hook in _webhooks(job)}
    settled, last = _attempts(job)
    tried = []
    for entry in _unsettled(job, settled):
        hook = hooks.get(entry["url"]) or WebhookSpec.model_construct(url=entry["url"], secret_env=None)
        item = _Delivery(job, hook, entry["event_id"], entry["type"], entry["body"].encode(), POLICY)
        if entry["url"] not in hooks:
            _finish(item, attempt=0, outcome="failed", error="spec.yaml no longer lists this webhook: not sent")
        elif not _enqueue(item):
            continue
        tried.append(_listed(entry, last))
    return tried


def retry(job: JobDir, timeout: float) -> list[dict]:
    """`resend`s `job`'s undelivered deliveries and waits for them, at most `timeout` seconds (`flush`).

    Args:
        job (`JobDir`): the job (`grpoflow webhooks retry JOB_ID`).
        timeout (`float`): the most seconds to wait; a delivery still under way then stays undelivered.

    Returns:
        `list[dict]`: each delivery sent again, as `undelivered` lists it, with `last` its latest line now and
        `settled` whether it is delivered (or failed for good, a 4xx).
    """
    tried = resend(job)
    flush(timeout)
    settled, last = _attempts(job)
    return [{**e, "last": last.get(key := (e["event_id"], e["url"])), "settled": key in settled} for e in tried]


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value for one request: `v1,` + base64 HMAC-SHA256 of `{msg_id}.{timestamp}.{body}`.

    Args:
        secret (`str`): `whsec_<base64>` (signs with the decoded bytes) or any other string (signs with its UTF-8).
        msg_id (`str`): the `webhook-id` header.
        timestamp (`int`): the `webhook-timestamp` header, unix seconds.
        body (`bytes`): the exact request body, UTF-8 (the package signs text).

    Raises:
        `ValueError`: a `whsec_` secret whose rest is not base64 or decodes to nothing.
    """
    # The package replaces the datetime's tzinfo with UTC, so it must be a UTC datetime already (not local time).
    return _webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body.decode())


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """Reference receiver check: True if one of the request's `v1` signatures matches and its timestamp is recent.

    `standardwebhooks.Webhook.verify` does the check, with its tolerance of 5 minutes either side of now.

    Args:
        secret (`str`): the shared secret, as in `sign`.
        headers (`Mapping[str, str]`): the request headers (any case).
        body (`bytes`): the raw request body, before any JSON parsing.
    """
    try:
        _webhook(secret).verify(body, dict(headers), json_parse=False)
    # ValueError: a malformed signature list, non-base64 signature, or a body that is not UTF-8.
    except (WebhookVerificationError, ValueError):
        return False
    return True


# --- queueing -----------------------------------------------------------------------------------------------------


def _webhooks(job: JobDir) -> list[WebhookSpec]:
    """The webhooks in `job`'s spec.yaml, re-read only when the file changes (a resumed job may rewrite it)."""
    try:
        mtime = job.spec.stat().st_mtime_ns
    except FileNotFoundError:
        return []
    cached = _spec_cache.get(job.root)
    if cached is None or cached[0] != mtime:
        # Only the webhooks are validated: delivery should not depend on, or re-check, the rest of the spec.
        cached = (mtime, _HOOKS.validate_python((yaml.safe_load(job.spec.read_text()) or {}).get("webhooks") or []))
        _spec_cache[job.root] = cached
    return cached[1]


def _enqueue(item: _Delivery) -> bool:
    """Queues `item` unless the same delivery is already queued or under way in this process (False then)."""
    global _pending
    with _idle:
        if _key(item) in _in_flight:
            return False
        _in_flight.add(_key(item))
        _pending += 1
    try:
        _queue_for(item.hook.url).put_nowait(item)
    except queue.Full:
        _finish(item, attempt=0, outcome="dropped", error=f"more than {MAX_QUEUED} events waiting for this endpoint")
        _done(item)
    return True


def _key(item: _Delivery) -> tuple[Path, str, str]:
    return item.job.root, item.msg_id, safe_url(item.hook.url)


def _queue_for(url: str) -> queue.Queue:
    with _queues_lock:
        if url not in _queues:
            _queues[url] = queue.Queue(MAX_QUEUED)
            name = f"grpoflow-webhook {safe_url(url)}"
            threading.Thread(target=_worker, args=(_queues[url],), name=name, daemon=True).start()
        return _queues[url]


def _done(item: _Delivery) -> None:
    global _pending
    with _idle:
        _in_flight.discard(_key(item))
        _pending -= 1
        if _pending == 0:
            _idle.notify_all()


def _worker(q: queue.Queue) -> None:
    # One client per endpoint keeps its connection alive between events, on this thread's own event loop (an async
    # client's connections belong to their loop; async, so one deadline bounds a whole attempt). Never closed, like
    # the daemon thread.
    runner, client = asyncio.Runner(), httpx2.AsyncClient(headers={"user-agent": USER_AGENT})

    def post(url: str, **kwargs) -> httpx2.Response:
        # In a copy of the delivery's context (the runner's own would be the thread's).
        return runner.run(outbound.request(client, "POST", url, **kwargs), context=contextvars.copy_context())

    while True:
        item = q.get()
        try:
            item.context.run(_send, post, item)
        except Exception:
            # A bug here must not kill the thread: the endpoint's later events would never be sent.
            logger.exception("webhooks: delivering %s to %s failed", item.msg_id, safe_url(item.hook.url))
        finally:
            _done(item)


# --- one delivery -------------------------------------------------------------------------------------------------


def _send(post: Callable[..., httpx2.Response], item: _Delivery) -> None:
    """Posts `item` until it is delivered, fails for good, or runs out of attempts; logs every attempt."""
    secret, problem = _secret(item.hook)
    if why := link_local_address(item.hook.url, resolve=True):  # a name the spec's check could not see through
        problem = f"{why}: not sent (the operator allows it with {ALLOW_LINK_LOCAL_ENV}=1)"
    if problem:
        _finish(item, attempt=0, outcome="failed", error=problem)
        return
    attempts = len(item.policy.backoff_s) + 1
    for attempt in range(1, attempts + 1):
        started = time.monotonic()
        status, error, retryable, retry_after = _post(post, item, secret)
        outcome = "delivered" if error is None else "retrying" if retryable and attempt < attempts else "failed"
        _finish(item, attempt, outcome, status, error, time.monotonic() - started)
        if outcome != "retrying":
            return
        wait = item.policy.backoff_s[attempt - 1]
        if retry_after is not None and 0 <= retry_after <= item.policy.max_retry_after_s:
            wait = retry_after
        time.sleep(wait)


def _secret(hook: WebhookSpec) -> tuple[str | None, str | None]:
    """The signing secret (None: unsigned webhook), or a problem that names the variable but never its value."""
    if hook.secret_env is None:
        return None, None
    secret = os.environ.get(hook.secret_env) or _secret_block(hook.secret_env)
    if not secret:
        return None, (
            f"secret_env {hook.secret_env} is not set (or empty), and there is no Prefect Secret block "
            f"{secret_block_name(hook.secret_env)!r}; not sending unsigned"
        )
    try:
        _webhook(secret)
    except ValueError:
        return None, f"secret_env {hook.secret_env} starts with whsec_ but the rest is not a non-empty base64 key"
    return secret, None


def secret_block_name(env: str) -> str:
    """The Prefect Secret block that holds a webhook secret when the variable `env` is not set: the name lowercased,
    `_` as `-` (`GRPOFLOW_WEBHOOK_SECRET` -> `grpoflow-webhook-secret`), as `hf-token` holds HF_TOKEN's value. A
    block keeps the secret out of the worker's environment, which Prefect copies into each run's workspace files."""
    return env.lower().replace("_", "-")


def _secret_block(env: str) -> str | None:
    from prefect.settings import get_current_settings

    if env not in _BLOCK_SECRETS:
        if not get_current_settings().api.url:  # no server to ask (and none to start from a delivery thread)
            return None
        try:
            from prefect.blocks.system import Secret

            _BLOCK_SECRETS[env] = str(Secret.load(secret_block_name(env)).get())
        except Exception:  # no such block, no server: the delivery fails, naming the variable and the block
            return None
    return _BLOCK_SECRETS[env]


_BLOCK_SECRETS: dict[str, str] = {}  # loaded once per process


def _post(
    post: Callable[..., httpx2.Response], item: _Delivery, secret: str | None
) -> tuple[int | None, str | None, bool, float | None]:
    """One attempt: (status, error or None if 2xx, whether to retry, Retry-After seconds or None)."""
    timestamp = int(time.time())  # per attempt, so a late retry still passes the receiver's replay window
    headers = {"content-type": "application/json", "webhook-id": item.msg_id, "webhook-timestamp": str(timestamp)}
    if secret is not None:
        headers["webhook-signature"] = sign(secret, item.msg_id, timestamp, item.body)
    try:
        response = post(item.hook.url, content=item.body, headers=headers, timeout=item.policy.timeout_s)
    except httpx2.TransportError as e:  # refused, reset, DNS, timeouts (the attempt's deadline too)
        return None, _describe(e, item.hook.url), True, None
    except (httpx2.HTTPError, ValueError) as e:  # a reply over the cap; a setting that is no number
        return None, _describe(e, item.hook.url), False, None
    status = response.status_code
    if 200 <= status < 300:
        return status, None, False, None
    return status, f"HTTP {status}", status == 429 or status >= 500, _seconds(response.headers.get("retry-after"))


def _webhook(secret: str) -> Webhook:
    """The package's signer for `secret`: a `whsec_<base64>` string as it is, any other secret as its UTF-8 bytes.

    Raises:
        `ValueError`: an empty secret, or `whsec_` followed by nothing or by something that is not base64 (the
            package would skip the stray characters and sign with other bytes than the receiver's).
    """
    if secret.removeprefix("whsec_") == "":
        raise ValueError("the webhook secret is empty")
    if secret.startswith("whsec_"):
        key = secret.removeprefix("whsec_")
        base64.b64decode(key + "=" * (-len(key) % 4), validate=True)  # unpadded is fine, as for the package
    return Webhook(secret if secret.startswith("whsec_") else secret.encode())


def _seconds(value: str | None) -> float | None:
    # Only the delta-seconds form; an HTTP-date Retry-After falls back to the backoff.
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _describe(error: Exception, url: str) -> str:
    # httpx2 messages may quote the URL, whose userinfo or query can hold credentials.
    return f"{type(error).__name__}: {error}".replace(url, safe_url(url))[:500]


def safe_url(url: str) -> str:
    """`url` without userinfo, query or fragment: what logs and `webhooks.jsonl` may show."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


# --- the outbox ---------------------------------------------------------------------------------------------------


def _to_outbox(items: list[_Delivery]) -> None:
    """Appends one outbox line per delivery (of one event) and syncs it to disk, before any of them is sent."""
    job, now = items[0].job, datetime.now(UTC).isoformat()
    lines = [
        {"time": now, "event_id": i.msg_id, "type": i.type, "url": i.hook.url, "body": i.body.decode()} for i in items
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    try:
        fd = os.open(job.root / OUTBOX, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a crash: the next must not join it
                data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:  # sent all the same, once; a discarded job's folder has nothing to keep
        if job.root.is_dir():
            logger.warning("webhooks: could not record %s in %s (%s); sending it once", items[0].type, OUTBOX, e)


def _attempts(job: JobDir) -> tuple[set[tuple[str, str]], dict[tuple[str, str], dict]]:
    """The (event id, URL) of each settled delivery in `webhooks.jsonl`, and each delivery's latest line there."""
    settled, last = set(), {}
    for line in read_jsonl(job.webhooks, lambda r: isinstance(r, dict) and {"event_id", "url", "outcome"} <= r.keys()):
        key = (line["event_id"], line["url"])
        last[key] = line
        status = line.get("status")
        final_4xx = isinstance(status, int) and 400 <= status < 500 and status != 429
        if line["outcome"] == "delivered" or (line["outcome"] == "failed" and final_4xx):
            settled.add(key)
    return settled, last


def _unsettled(job: JobDir, settled: set[tuple[str, str]]) -> list[dict]:
    """The outbox lines of the deliveries not `settled`, once each, in outbox order."""
    seen, entries = set(settled), []
    for entry in read_jsonl(
        job.root / OUTBOX, lambda r: isinstance(r, dict) and {"event_id", "type", "url", "body"} <= r.keys()
    ):
        key = (entry["event_id"], safe_url(entry["url"]))
        if key not in seen:
            seen.add(key)
            entries.append(entry)
    return entries


def _listed(entry: dict, last: dict) -> dict:
    url = safe_url(entry["url"])
    return {
        "time": entry.get("time"),
        "event_id": entry["event_id"],
        "type": entry["type"],
        "url": url,
        "last": last.get((entry["event_id"], url)),
    }


# --- delivery log -------------------------------------------------------------------------------------------------


def _finish(item: _Delivery, attempt: int, outcome: str, status=None, error=None, duration: float = 0.0) -> None:
    """Appends one attempt to the job's `webhooks.jsonl`; warns once per job and endpoint about a failure."""
    url = safe_url(item.hook.url)
    line = {
        "time": datetime.now(UTC).isoformat(),
        "event_id": item.msg_id,
        "type": item.type,
        "url": url,
        "attempt": attempt,
        "outcome": outcome,
        "status": status,
        "error": error,
        "duration_s": round(duration, 3),
    }
    if outcome in ("failed", "dropped") and (item.job.root, url) not in _warned:
        _warned.add((item.job.root, url))
        logger.warning("webhooks: %s %s to %s: %s (more in %s)", item.type, outcome, url, error, item.job.webhooks)
    with _log_lock:
        # A rejected job's folder is discarded right after its last event: do not create it again.
        if not item.job.root.is_dir():
            return
        try:
            with item.job.webhooks.open("a") as f:
                f.write(json.dumps(line) + "\n")
        except FileNotFoundError:
            pass
