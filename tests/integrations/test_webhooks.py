"""Tests for integrations/webhooks.py: events emitted for real, delivered over HTTP to real receivers on 127.0.0.1.

No test bounds a duration from above by less than many times what it takes on a loaded machine: "does not wait" is
shown by what has (not) happened yet while a receiver holds its answer back, and a flush that must drain is given
`DRAIN_S`, which it only uses up when something hangs.
"""

import base64
import hashlib
import hmac
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version

import openai
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

import grpoflow.integrations.events
from grpoflow.core.jobdir import JobDir, write_text_atomic
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.integrations import webhooks
from grpoflow.integrations.events import emit
from tests.conftest import cli
from tests.hostile_server import HostileServer

SECRET_ENV = "GRPOFLOW_TEST_SECRET"
PLAIN = "plain-secret-do-not-leak-7f3a"
WHSEC = "whsec_" + base64.b64encode(b"raw-key-do-not-leak-0123456789ab").decode()
# Small waits keep the suite fast; the retry logic is the same as with the defaults.
FAST = webhooks.Policy(timeout_s=1.0, backoff_s=(0.05, 0.05, 0.05, 0.05))
# The most a flush that must drain may wait: far above the fraction of a second it takes, so load cannot break it.
DRAIN_S = 60


def reference_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks' signature, written out here rather than taken from the module under test."""
    key = base64.b64decode(secret[len("whsec_") :]) if secret.startswith("whsec_") else secret.encode()
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


# --- a real receiver ----------------------------------------------------------------------------------------------


@dataclass
class Request:
    arrived: float
    headers: dict[str, str]
    body: bytes
    status: int | None = None  # the answer sent; None: none (the connection closed, or the sender hung up)


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records every POST and answers from a script of statuses, then 200.

    Args:
        statuses (`list[int]`): the first answers, in order.
        delay (`float`): seconds to hang before answering (released early by `release` or `stop`).
        retry_after (`str`, *optional*): a `Retry-After` header sent with every answer.
        fault (`str`, *optional*): while set (the attribute can change), every request meets it: `500` answers 500,
            `hang` holds the request until `stop` (then 500), `close` hangs up without an answer.
    """

    def __init__(self, statuses=(), delay: float = 0.0, retry_after: str | None = None, fault: str | None = None):
        self.statuses, self.requests, self.released, self.fault = list(statuses), [], threading.Event(), fault
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                request = Request(time.monotonic(), {k.lower(): v for k, v in self.headers.items()}, body)
                receiver.requests.append(request)
                fault = receiver.fault
                if fault == "close":
                    self.close_connection = True
                    return
                receiver.released.wait(3600 if fault == "hang" else delay)
                request.status = 500 if fault else receiver.statuses.pop(0) if receiver.statuses else 200
                try:
                    self.send_response(request.status)
                    if retry_after is not None:
                        self.send_header("retry-after", retry_after)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:  # the sender timed out and hung up
                    request.status = None

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def ids(self) -> list[str]:
        return [r.headers["webhook-id"] for r in self.requests]

    def delivered(self) -> list[Request]:
        """The requests answered 200, in the order they arrived."""
        return [r for r in self.requests if r.status == 200]

    def release(self) -> None:
        """Answers every held and later request at once."""
        self.released.set()

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def dead_url() -> str:
    """A loopback URL nothing listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


@pytest.fixture
def receiver():
    started = []

    def start(**kwargs) -> Receiver:
        started.append(Receiver(**kwargs))
        return started[-1]

    yield start
    for r in started:
        r.stop()


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    # Prefect's side of emit is tested against a real server in tests/flows; here it would start an ephemeral one.
    prefect_events = []
    monkeypatch.setattr("prefect.events.emit_event", lambda **kwargs: prefect_events.append(kwargs))  # imported late
    monkeypatch.setattr(webhooks, "POLICY", FAST)
    monkeypatch.setenv(SECRET_ENV, PLAIN)
    yield prefect_events
    # Deliveries are process-wide: none may still run into the next test.
    assert webhooks.flush(DRAIN_S)


@pytest.fixture
def make_job(tmp_path):
    def make(*urls: str, secret_env: str | None = SECRET_ENV, openai_events: bool | str = False) -> JobDir:
        hooks = [{"url": url, "secret_env": secret_env} if secret_env else {"url": url} for url in urls]
        hooks = [{**h, "openai_events": openai_events} for h in hooks] if openai_events else hooks
        spec, _ = load_spec(
            {
                "name": "t",
                "base_model": "builtin:tiny",
                "dataset": {"uri": "x.jsonl"},
                "rewards": [{"name": "exact_answer"}],
                "webhooks": hooks,
                "output_uri": str(tmp_path / "runs"),
            }
        )
        job = JobDir(tmp_path / "runs" / "t-job")
        write_text_atomic(job.spec, to_yaml(spec))
        return job

    return make


def attempts(job: JobDir) -> list[dict]:
    return [json.loads(line) for line in job.webhooks.read_text().splitlines()]


def wait_until(condition, timeout: float = DRAIN_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


# --- signing ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [PLAIN, WHSEC], ids=["plain", "whsec"])
def test_delivery_is_signed_and_verifiable(monkeypatch, receiver, make_job, secret):
    monkeypatch.setenv(SECRET_ENV, secret)
    r = receiver()
    job = make_job(r.url)

    record = emit(job, "grpoflow.training.completed", {"steps": 3})

    assert webhooks.flush(DRAIN_S)
    [request] = r.requests
    headers, stamp = request.headers, int(request.headers["webhook-timestamp"])
    assert headers["webhook-id"] == record["id"]
    assert abs(stamp - time.time()) < 60
    assert headers["webhook-signature"] == reference_signature(secret, record["id"], stamp, request.body)
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == f"grpoflow/{version('grpoflow')}"
    assert json.loads(request.body) == {
        "type": "training.completed",
        "timestamp": record["occurred"],
        "data": {"steps": 3, "job_id": job.job_id},
    }
    assert webhooks.verify(secret, headers, request.body)
    assert [a["outcome"] for a in attempts(job)] == ["delivered"]


@pytest.mark.parametrize(
    ("secret", "receiver_secret"),
    [
        (WHSEC, WHSEC),  # the Standard Webhooks form: the same string on both sides
        (PLAIN, "whsec_" + base64.b64encode(PLAIN.encode()).decode()),  # a plain secret signs with its UTF-8 bytes
    ],
    ids=["whsec", "plain"],
)
def test_the_standardwebhooks_package_verifies_deliveries(monkeypatch, receiver, make_job, secret, receiver_secret):
    monkeypatch.setenv(SECRET_ENV, secret)
    r = receiver(statuses=[503])  # a retry too: each attempt is signed with its own timestamp
    job = make_job(r.url)

    emit(job, "grpoflow.training.completed", {"steps": 3})

    assert webhooks.flush(DRAIN_S)
    assert len(r.requests) == 2
    hook = Webhook(receiver_secret)
    for request in r.requests:
        assert hook.verify(request.body, request.headers) == json.loads(request.body)
    with pytest.raises(WebhookVerificationError):
        hook.verify(request.body.replace(b"3", b"4"), request.headers)


@pytest.mark.parametrize(
    "event, reason, openai_type",
    [
        ("grpoflow.job.completed", None, "fine_tuning.job.succeeded"),
        ("grpoflow.job.failed", "cancelled", "fine_tuning.job.cancelled"),  # a cancel (or an API pause)
        ("grpoflow.job.failed", "rejected", "fine_tuning.job.failed"),
        ("grpoflow.job.failed", "RuntimeError", "fine_tuning.job.failed"),
    ],
)
def test_a_job_end_is_also_openais_webhook_event(monkeypatch, receiver, make_job, event, reason, openai_type):
    monkeypatch.setenv(SECRET_ENV, WHSEC)
    r = receiver()
    job = make_job(r.url, openai_events=True)

    record = emit(job, event, {"reason": reason} if reason else {"output_dir": "x"})

    assert webhooks.flush(DRAIN_S)
    ours, theirs = r.requests  # grpoflow's own event first, then OpenAI's, each with its own webhook-id
    assert json.loads(ours.body)["type"] == event.removeprefix("grpoflow.")
    assert theirs.headers["webhook-id"] == f"evt_{record['id']}" != ours.headers["webhook-id"]
    unwrapped = openai.OpenAI(api_key="unused").webhooks.unwrap(theirs.body, theirs.headers, secret=WHSEC)
    assert unwrapped.type == openai_type and unwrapped.data.id == job.job_id and unwrapped.object == "event"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="unused").webhooks.unwrap(theirs.body.replace(b"evt_", b"evt-"), theirs.headers,
                                                        secret=WHSEC)  # fmt: skip
    assert all(a["outcome"] == "delivered" for a in attempts(job)) and len(attempts(job)) == 2


def test_openai_events_only_for_a_job_end_and_a_webhook_that_asks(receiver, make_job):
    r = receiver()
    job = make_job(r.url, openai_events=True)
    emit(job, "grpoflow.job.started", {"name": "t"})
    emit(make_job(r.url), "grpoflow.job.completed", {"status": "completed"})  # the same job, its webhook not asking
    assert webhooks.flush(DRAIN_S)
    assert [json.loads(q.body)["type"] for q in r.requests] == ["job.started", "job.completed"]


def test_a_webhook_for_openai_events_only_gets_none_of_grpoflows(receiver, make_job):
    r = receiver()
    job = make_job(r.url, openai_events="only")
    emit(job, "grpoflow.job.started", {"name": "t"})
    record = emit(job, "grpoflow.job.failed", {"reason": "cancelled"})
    assert webhooks.flush(DRAIN_S)
    assert [json.loads(q.body)["type"] for q in r.requests] == ["fine_tuning.job.cancelled"]
    assert r.ids() == [f"evt_{record['id']}"] and webhooks.undelivered(job) == []


KEY = base64.b64encode(b"k" * 25).decode()  # 25 bytes: base64 with "==" padding


@pytest.mark.parametrize(
    ("secret", "signs_as", "problem"),
    [
        ("whsec_" + KEY.rstrip("="), "whsec_" + KEY, None),  # unpadded base64, as the package reads it
        ("whsec_not*base64!", None, "not a non-empty base64 key"),  # a typo: the package would skip the bad chars
        ("whsec_", None, "not a non-empty base64 key"),  # no key at all
    ],
    ids=["unpadded", "not-base64", "empty"],
)
def test_whsec_secret_forms(monkeypatch, receiver, make_job, secret, signs_as, problem):
    monkeypatch.setenv(SECRET_ENV, secret)
    r = receiver()
    job = make_job(r.url)

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    [line] = attempts(job)
    if problem is None:
        [request] = r.requests
        msg_id, stamp = request.headers["webhook-id"], int(request.headers["webhook-timestamp"])
        assert request.headers["webhook-signature"] == reference_signature(signs_as, msg_id, stamp, request.body)
        assert line["outcome"] == "delivered"
    else:
        assert r.requests == []  # nothing sent, neither unsigned nor signed with some other key
        assert (line["attempt"], line["outcome"]) == (0, "failed") and problem in line["error"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, True),  # as signed; header names in any case
        ({"secret": WHSEC}, True),  # whsec_ secrets sign with their decoded bytes
        ({"body": b'{"a":2}'}, False),  # tampered body
        ({"verify_with": "other-secret"}, False),  # wrong secret
        ({"age": 400}, False),  # older than the 300 s tolerance: a replay
        ({"age": -400}, False),  # too far in the future
        ({"extra": "v1,bm90LWl0 "}, True),  # several signatures (key rotation): one match is enough
        ({"extra": "v1a,bm90LWl0 "}, True),  # other schemes (v1a: asymmetric) are skipped
        ({"extra": "no-comma "}, False),  # a malformed entry: the package rejects the whole header
        ({"drop": "Webhook-Signature"}, False),  # unsigned
        ({"drop": "Webhook-Timestamp"}, False),
    ],
)
def test_verify(change, expected):
    secret = change.get("secret", PLAIN)
    stamp = int(time.time()) - change.get("age", 0)
    body = b'{"type":"job.started"}'
    headers = {
        "Webhook-Id": "msg_1",
        "Webhook-Timestamp": str(stamp),
        "Webhook-Signature": change.get("extra", "") + reference_signature(secret, "msg_1", stamp, body),
    }
    headers.pop(change.get("drop", ""), None)

    assert webhooks.verify(change.get("verify_with", secret), headers, change.get("body", body)) is expected


def test_no_secret_env_sends_unsigned(receiver, make_job):
    r = receiver()
    job = make_job(r.url, secret_env=None)

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    [request] = r.requests
    assert "webhook-signature" not in request.headers
    assert request.headers["webhook-id"]


def test_unset_secret_env_is_a_failed_delivery_not_an_unsigned_one(monkeypatch, receiver, make_job, caplog):
    monkeypatch.delenv(SECRET_ENV)
    r = receiver()
    job = make_job(r.url)

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert r.requests == []
    [line] = attempts(job)
    assert (line["attempt"], line["outcome"], line["status"]) == (0, "failed", None)
    assert f"secret_env {SECRET_ENV} is not set" in line["error"]
    assert f"secret_env {SECRET_ENV} is not set" in caplog.text


# --- retries ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "statuses", "final"),
    [
        ([500, 500], [500, 500, 200], "delivered"),  # 5xx retried; delivered on the third attempt
        ([400], [400], "failed"),  # 4xx is the receiver's final word: not retried
        ([410], [410], "failed"),
        ([429], [429, 200], "delivered"),  # 429 (rate limited) is retried
        ([503] * 5, [503] * 5, "failed"),  # gives up after 5 attempts (len(backoff_s) + 1)
    ],
)
def test_retry_rules(receiver, make_job, script, statuses, final):
    r = receiver(statuses=script)
    job = make_job(r.url)

    record = emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert r.ids() == [record["id"]] * len(statuses)  # the same webhook-id on every retry: receivers can dedupe
    lines = attempts(job)
    assert [a["status"] for a in lines] == statuses
    assert [a["attempt"] for a in lines] == list(range(1, len(statuses) + 1))
    assert [a["outcome"] for a in lines] == ["retrying"] * (len(statuses) - 1) + [final]


def test_retry_after_is_honoured(receiver, make_job):
    r = receiver(statuses=[429], retry_after="1")
    job = make_job(r.url)

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    first, second = r.requests
    # The backoff alone would wait 0.05 s.
    assert second.arrived - first.arrived >= 0.9


def test_endpoint_down_is_retried_and_logged(make_job, caplog):
    # That emit does not wait for any of this is shown with a receiver that holds its answer (below).
    job = make_job(dead_url())

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    lines = attempts(job)
    assert [a["outcome"] for a in lines] == ["retrying"] * 4 + ["failed"]
    assert all(a["status"] is None and a["error"].startswith("ConnectError") for a in lines)
    assert "job.started failed" in caplog.text


# --- never on the critical path -----------------------------------------------------------------------------------


def test_hanging_endpoint_does_not_slow_emit_and_flush_is_bounded(monkeypatch, receiver, make_job):
    # No attempt can end before the receiver is released: not by its answer, not by the sender's timeout.
    monkeypatch.setattr(webhooks, "POLICY", webhooks.Policy(timeout_s=3600, backoff_s=()))
    r = receiver(delay=3600)
    job = make_job(r.url)

    ids = [emit(job, "grpoflow.training.progress", {"step": step})["id"] for step in range(50)]

    # All 50 emits returned while the first delivery was still waiting for its answer, each in the outbox already.
    assert not job.webhooks.exists()
    assert [d["event_id"] for d in webhooks.undelivered(job)] == ids
    started = time.monotonic()
    assert webhooks.flush(0.5) is False
    # It waited its 0.5 s (a lower bound: load only adds to it) and returned with nothing delivered.
    assert time.monotonic() - started >= 0.45 and not job.webhooks.exists()

    r.release()
    assert webhooks.flush(DRAIN_S)
    assert r.ids() == ids and [a["outcome"] for a in attempts(job)] == ["delivered"] * 50


def test_hanging_endpoint_times_out_and_is_retried(monkeypatch, receiver, make_job):
    monkeypatch.setattr(webhooks, "POLICY", webhooks.Policy(timeout_s=0.3, backoff_s=(0.05,)))
    r = receiver(delay=3600)
    job = make_job(r.url)

    record = emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert r.ids() == [record["id"]] * 2
    lines = attempts(job)
    assert [a["outcome"] for a in lines] == ["retrying", "failed"]
    assert all(a["status"] is None and a["error"].startswith("ReadTimeout") for a in lines)


def test_a_trickling_endpoint_is_cut_at_each_attempts_deadline(monkeypatch, make_job):
    # One byte every 0.3 s, headers included: no single read waits 0.5 s, only the attempt's total deadline ends it.
    monkeypatch.setattr(webhooks, "POLICY", webhooks.Policy(timeout_s=0.5, backoff_s=(0.05,)))
    with HostileServer("trickle", every_s=0.3) as server:
        job = make_job(f"{server.url}/hook")
        emit(job, "grpoflow.job.started")
        assert webhooks.flush(DRAIN_S)
    lines = attempts(job)
    assert [a["outcome"] for a in lines] == ["retrying", "failed"]
    assert all(a["error"] == "ReadTimeout: no complete reply within 0.5 s, the request's whole timeout" for a in lines)
    assert all(a["duration_s"] < 5 for a in lines)  # the whole answer would take ~30 s


def test_a_huge_answer_is_not_read_past_the_cap_nor_retried(monkeypatch, make_job):
    monkeypatch.setenv("GRPOFLOW_HTTP_MAX_RESPONSE_MB", "1")
    with HostileServer("huge", size=20_000_000) as server:
        job = make_job(f"{server.url}/hook")
        emit(job, "grpoflow.job.started")
        assert webhooks.flush(DRAIN_S)
    [line] = attempts(job)
    assert line["outcome"] == "failed" and line["status"] is None and server.requests == 1
    assert (
        line["error"]
        == "ResponseTooLarge: a reply over 1 MB, the cap GRPOFLOW_HTTP_MAX_RESPONSE_MB sets; not read further"
    )


def test_hanging_endpoint_does_not_delay_another(receiver, make_job):
    hanging, healthy = receiver(delay=30), receiver()
    job = make_job(hanging.url, healthy.url)

    records = [emit(job, "grpoflow.training.progress", {"step": step}) for step in range(5)]

    assert wait_until(lambda: len(healthy.requests) == 5)
    assert healthy.ids() == [r["id"] for r in records]


def test_order_is_preserved_per_endpoint_across_retries(receiver, make_job):
    r = receiver(statuses=[200, 200, 200, 500, 500])
    job = make_job(r.url)

    ids = [emit(job, "grpoflow.training.progress", {"step": step})["id"] for step in range(20)]

    assert webhooks.flush(DRAIN_S)
    # The fourth event is retried until delivered before the fifth is sent.
    assert r.ids() == ids[:3] + [ids[3]] * 3 + ids[4:]


# --- what is written ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [PLAIN, WHSEC], ids=["plain", "whsec"])
def test_secret_and_signatures_never_written_or_logged(monkeypatch, receiver, make_job, caplog, secret):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(SECRET_ENV, secret)
    r = receiver(statuses=[500, 400])
    job = make_job(r.url, dead_url())

    for event in ("grpoflow.job.started", "grpoflow.training.completed", "grpoflow.job.failed"):
        emit(job, event, {"note": "x"})

    assert webhooks.flush(DRAIN_S)
    signatures = [r.headers["webhook-signature"] for r in r.requests]
    assert len(signatures) == 4
    forbidden = [secret, secret.removeprefix("whsec_"), *signatures, *(s.removeprefix("v1,") for s in signatures)]
    files = [p for p in job.root.rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"spec.yaml", "events.jsonl", "webhooks.jsonl", webhooks.OUTBOX}
    for text in [p.read_text() for p in files] + [caplog.text]:
        assert not [f for f in forbidden if f in text]
    assert all("signature" not in line for line in attempts(job))


def test_log_url_drops_userinfo_and_query(make_job):
    # A spec refuses credentials in the URL (tests/core/test_spec.py); the log still drops any query...
    job = make_job(dead_url() + "?team=do-not-leak")

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert "do-not-leak" not in job.webhooks.read_text()
    assert attempts(job)[0]["url"].endswith("/hook")
    # ...and userinfo, for a URL that reached it some other way
    assert webhooks.safe_url("https://user:pw@h.example/hook?token=t#f") == "https://h.example/hook"


def test_job_without_webhooks_writes_no_delivery_log(make_job):
    job = make_job()

    emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert job.events.exists()
    assert not job.webhooks.exists()


def test_broken_webhook_config_never_fails_emit(tmp_path, caplog):
    job = JobDir(tmp_path / "t-job")
    write_text_atomic(job.spec, "webhooks:\n  - url: ftp://example.invalid/hook\n")

    record = emit(job, "grpoflow.job.started")

    assert json.loads(job.events.read_text())["id"] == record["id"]
    assert "could not queue grpoflow.job.started" in caplog.text


def test_discarded_job_folder_is_not_recreated(receiver, make_job):
    # The answer comes after the folder is gone, as when a rejected job is discarded right after job.failed.
    r = receiver(delay=3600)
    job = make_job(r.url)

    emit(job, "grpoflow.job.failed", {"reason": "rejected"})
    shutil.rmtree(job.root)  # what grpoflow.tasks.bookkeeping.discard_job does for a rejected input
    r.release()

    assert webhooks.flush(DRAIN_S)
    assert len(r.requests) == 1
    assert not job.root.exists()


def test_prefect_still_gets_the_event(isolated, monkeypatch, receiver, make_job):
    # As in a flow run of `grpoflow run`: the event goes through emit_event (outside a run, with a Prefect API set,
    # it is sent at once: tests/integrations/test_events.py).
    monkeypatch.setattr(grpoflow.integrations.events, "prefect_api_configured", lambda: True)
    monkeypatch.setattr(grpoflow.integrations.events, "_in_a_run", lambda: True)
    r = receiver()
    job = make_job(r.url)

    record = emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert [str(e["id"]) for e in isolated] == [record["id"]] == r.ids()


@pytest.mark.usefixtures("prefect_server")
def test_the_secret_comes_from_a_prefect_secret_block_when_the_variable_is_unset(monkeypatch, receiver, make_job):
    # The worker path's mitigation (README, Webhooks): no secret in the worker's environment, which Prefect copies
    # into each run's workspace.json; the block named after the variable holds it instead.
    from prefect.blocks.system import Secret
    from prefect.settings import get_current_settings

    monkeypatch.setenv("PREFECT_API_URL", get_current_settings().api.url)  # as `grpoflow run` sets it: threads too
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setattr(webhooks, "_BLOCK_SECRETS", {})
    Secret(value=WHSEC).save(webhooks.secret_block_name(SECRET_ENV), overwrite=True)
    assert webhooks.secret_block_name(SECRET_ENV) == "grpoflow-test-secret"
    r = receiver()
    job = make_job(r.url)

    emit(job, "grpoflow.training.completed", {"steps": 3})

    assert webhooks.flush(DRAIN_S)
    [request] = r.requests
    Webhook(WHSEC).verify(request.body, request.headers)  # raises on a bad signature
    assert WHSEC not in (job.root / "webhooks.jsonl").read_text()


# A process that points Prefect at a server only in a settings context, as `grpoflow run` does for its temporary
# one (its environment has no PREFECT_API_URL at import), then emits one event to a job's webhook.
CONTEXT_ONLY_PROCESS = """
import sys
from pathlib import Path

from prefect.settings import PREFECT_API_URL, temporary_settings

from grpoflow.integrations import webhooks
from grpoflow.integrations.events import emit
from grpoflow.core.jobdir import JobDir

with temporary_settings(updates={PREFECT_API_URL: sys.argv[2]}):
    emit(JobDir(Path(sys.argv[1])), "grpoflow.training.completed", {"steps": 3})
    assert webhooks.flush(10)
"""


@pytest.mark.usefixtures("prefect_server")
def test_a_delivery_runs_with_the_emitters_prefect_settings(monkeypatch, receiver, make_job):
    # The delivery thread must use the emitter's server (the Secret block is there), not the settings a new thread
    # starts with, which name none.
    from prefect.blocks.system import Secret
    from prefect.settings import get_current_settings

    monkeypatch.delenv(SECRET_ENV, raising=False)
    Secret(value=WHSEC).save(webhooks.secret_block_name(SECRET_ENV), overwrite=True)
    r = receiver()
    job = make_job(r.url)

    argv = [sys.executable, "-c", CONTEXT_ONLY_PROCESS, str(job.root), get_current_settings().api.url]
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=DRAIN_S)
    assert done.returncode == 0, done.stderr
    [request] = r.requests
    Webhook(WHSEC).verify(request.body, request.headers)


# --- at least once: the outbox, a resumed job, `grpoflow webhooks retry` -----------------------------------------

# The first process of a job: it emits EVENTS to the job's webhooks with short timeouts, waits FLUSH_S for them at
# most, and exits (its delivery threads die with it), as `grpoflow run` does at its end.
FIRST_PROCESS = """
import json, sys
from pathlib import Path

from grpoflow.integrations import webhooks
from grpoflow.integrations.events import emit
from grpoflow.core.jobdir import JobDir

webhooks.POLICY = webhooks.Policy(timeout_s=0.3, backoff_s=(0.05,))
job = JobDir(Path(sys.argv[1]))
print(json.dumps([emit(job, event, {"n": n})["id"] for n, event in enumerate(json.loads(sys.argv[2]))]))
webhooks.flush(float(sys.argv[3]))
"""
EVENTS = [
    "grpoflow.job.started",
    "grpoflow.dataset.ingested",
    "grpoflow.training.progress",
    "grpoflow.training.progress",
    "grpoflow.training.completed",
    "grpoflow.adapter.merged",
    "grpoflow.model.published",
    "grpoflow.job.completed",
]
FLUSH_S = 0.5


def environment() -> dict:
    # No Prefect API: the events go to events.jsonl and the webhooks only.
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}


def first_process(job: JobDir) -> list[str]:
    """Runs FIRST_PROCESS on `job`; the ids of the events it emitted."""
    argv = [sys.executable, "-c", FIRST_PROCESS, str(job.root), json.dumps(EVENTS), str(FLUSH_S)]
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=DRAIN_S, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def check_delivered_once(r: Receiver, ids: list[str]) -> None:
    """Each of `ids` answered 200 exactly once, in order, signed, with the first attempt's id and body."""
    delivered = r.delivered()
    assert [d.headers["webhook-id"] for d in delivered] == ids
    first_bodies = {}
    for request in r.requests:
        first_bodies.setdefault(request.headers["webhook-id"], request.body)
    for request in delivered:
        assert Webhook(PLAIN.encode()).verify(request.body, request.headers)["data"]["job_id"] == "t-job"
        assert request.body == first_bodies[request.headers["webhook-id"]]


@pytest.mark.parametrize("fault", ["500", "hang", "close"])
def test_what_a_process_left_undelivered_is_delivered_once_by_webhooks_retry(receiver, make_job, fault):
    r = receiver(fault=fault)
    job = make_job(r.url)

    ids = first_process(job)

    assert [d["event_id"] for d in webhooks.undelivered(job)] == ids  # job.completed included
    assert r.requests and set(r.ids()) <= set(ids) and r.delivered() == []
    r.fault = None  # the endpoint is back
    command = [sys.executable, "-m", "grpoflow.flows.cli", "webhooks", "retry", job.job_id]
    done = subprocess.run(
        [*command, "--output-uri", str(job.root.parent)], env=environment(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split() for line in lines] == [
        [event.removeprefix("grpoflow."), event_id, r.url, "delivered"]
        for event, event_id in zip(EVENTS, ids, strict=True)
    ]
    check_delivered_once(r, ids)
    assert webhooks.undelivered(job) == []

    # A delivered event is never sent again.
    assert cli("webhooks", "retry", job.job_id, "--output-uri", job.root.parent) == (
        0,
        "job t-job: no webhook delivery is undelivered\n",
        "",
    )
    assert len(r.delivered()) == len(ids)


def test_a_resumed_job_first_sends_what_its_earlier_run_left_undelivered(receiver, make_job):
    from grpoflow.jobs.lock import JobLock
    from grpoflow.tasks.bookkeeping import create_job_task

    r = receiver(fault="500")
    job = make_job(r.url)
    ids = first_process(job)
    r.fault = None

    create_job_task.fn(load_spec(job.spec)[0], job.job_id)  # what `grpoflow run --resume JOB_ID` starts with
    JobLock(job.root).release()

    assert webhooks.flush(DRAIN_S)
    started = json.loads(job.events.read_text().splitlines()[-1])
    assert started["event"] == "grpoflow.job.started" and started["id"] not in ids
    check_delivered_once(r, [*ids, started["id"]])  # the earlier run's events first, in their order
    assert webhooks.undelivered(job) == []


@pytest.mark.parametrize(
    ("script", "code", "outcome", "left"),
    [
        ([], 0, "delivered", 0),  # the endpoint is back
        ([500] * 5, 1, "undelivered (failed): HTTP 500", 1),  # still down: gave up again, still in the outbox
        ([404], 0, "failed for good: HTTP 404", 0),  # the receiver's final word: not sent again
    ],
)
def test_webhooks_retry_outcomes(receiver, make_job, script, code, outcome, left):
    r = receiver(fault="close")
    job = make_job(r.url)
    record = emit(job, "grpoflow.job.completed")
    assert webhooks.flush(DRAIN_S)
    r.fault, r.statuses = None, list(script)

    exit_code, out, err = cli("webhooks", "retry", job.job_id, "--output-uri", job.root.parent)

    assert exit_code == code
    assert out == f"job.completed  {record['id']}  {r.url}  {outcome}\n"
    assert len(webhooks.undelivered(job)) == left
    assert ("1 of 1 webhook deliveries still undelivered" in err) is bool(left)


def test_webhooks_retry_of_an_unknown_job_exits_2(tmp_path):
    code, out, err = cli("webhooks", "retry", "no-such-job", "--output-uri", tmp_path)

    assert (code, out) == (2, "")
    assert "unknown job 'no-such-job'" in err


def test_webhooks_retry_leaves_a_job_a_live_run_holds_to_that_run(receiver, make_job):
    from grpoflow.jobs.lock import JobLock

    r = receiver(fault="500")
    job = make_job(r.url)
    emit(job, "grpoflow.job.started")
    assert webhooks.flush(DRAIN_S)
    r.fault = None
    # Taken by another process: this one's own locks are re-entrant.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(job.root)], stdout=subprocess.PIPE, text=True, env=environment()
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        code, _, err = cli("webhooks", "retry", job.job_id, "--output-uri", job.root.parent)
    finally:
        holder.kill()
        holder.wait()

    assert code == 2 and "is being run by pid" in err
    assert r.delivered() == [] and len(webhooks.undelivered(job)) == 1
    assert JobLock(job.root).holder()["pid"] == holder.pid  # the run's lock is left as it was


HOLD_LOCK = """
import sys, time
from grpoflow.jobs.lock import JobLock

JobLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(3600)
"""


def test_resend_never_queues_a_delivery_twice_in_one_process(monkeypatch, receiver, make_job):
    monkeypatch.setattr(webhooks, "POLICY", webhooks.Policy(timeout_s=3600, backoff_s=()))
    r = receiver(delay=3600)
    job = make_job(r.url)
    ids = [emit(job, "grpoflow.training.progress", {"step": step})["id"] for step in range(3)]

    # All three are undelivered, and all three are still queued or under way here: none is queued again.
    assert len(webhooks.undelivered(job)) == 3
    assert webhooks.resend(job) == []

    r.release()
    assert webhooks.flush(DRAIN_S)
    assert r.ids() == ids


@pytest.mark.parametrize(
    ("attempts_logged", "undelivered"),
    [
        ([], True),  # queued, never attempted: its process ended first
        ([("retrying", 500)], True),  # the process ended between two attempts
        ([("retrying", 500), ("failed", 500)], True),  # gave up after its retries
        ([("failed", 429)], True),  # rate limited to the last attempt: gave up too
        ([("failed", None)], True),  # failed before sending (secret_env unset): sent once it is set
        ([("dropped", None)], True),  # its endpoint's queue was full
        ([("retrying", None), ("delivered", 200)], False),
        ([("failed", 404)], False),  # a 4xx other than 429 is the receiver's final word
        ([("failed", 500), ("delivered", 204)], False),  # delivered by a later resend
    ],
)
def test_which_deliveries_are_undelivered(make_job, attempts_logged, undelivered):
    url = dead_url()
    job = make_job(url)
    outbox = {"time": "t", "event_id": "e1", "type": "job.started", "url": url, "body": "{}"}
    (job.root / webhooks.OUTBOX).write_text(json.dumps(outbox) + "\n")
    lines = [
        {"event_id": "e1", "url": url, "outcome": outcome, "status": status} for outcome, status in attempts_logged
    ]
    job.webhooks.write_text("".join(json.dumps({**line, "attempt": 1, "error": "x"}) + "\n" for line in lines))

    assert [d["event_id"] for d in webhooks.undelivered(job)] == (["e1"] if undelivered else [])


def test_a_torn_outbox_line_does_not_swallow_the_next(receiver, make_job):
    r = receiver()
    job = make_job(r.url)
    (job.root / webhooks.OUTBOX).write_text('{"time": "t", "event_id": "torn", "ty')  # a crash mid-write

    record = emit(job, "grpoflow.job.started")

    assert webhooks.flush(DRAIN_S)
    assert r.ids() == [record["id"]]
    assert webhooks.undelivered(job) == []  # its line was read: delivered, settled
    assert json.loads((job.root / webhooks.OUTBOX).read_text().splitlines()[-1])["event_id"] == record["id"]


def test_the_job_end_lists_undelivered_webhooks_in_the_report_until_they_are_delivered(receiver, make_job):
    from grpoflow.tasks.bookkeeping import JobEnding

    r = receiver(fault="500")
    job = make_job(r.url)
    job.report.write_text("# GRPO job report: t-job\n\n## Health\n\n**Verdict:** healthy\n")

    JobEnding(job, load_spec(job.spec)[0], resumed=True).cancelled("stopped")

    [record] = [json.loads(line) for line in job.events.read_text().splitlines()]
    report = job.report.read_text()
    assert report.startswith("# GRPO job report: t-job\n\n## Health\n\n**Verdict:** healthy\n\n")
    assert "## Webhooks not delivered: 1 (run `grpoflow webhooks retry t-job`)" in report
    assert f"| job.failed | `{record['id']}` | {r.url} | failed (attempt 5): HTTP 500 |" in report

    r.fault = None
    assert cli("webhooks", "retry", job.job_id, "--output-uri", job.root.parent)[0] == 0
    assert job.report.read_text() == "# GRPO job report: t-job\n\n## Health\n\n**Verdict:** healthy\n"
