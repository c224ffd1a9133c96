"""Webhooks through a whole pipeline run: every event arrives signed and in order; a dead endpoint and one that never
answers hold up no stage (the run's end waits only for its bounded final flush); the secret appears in no file, log
line or event.

"No stage waits" is shown by counting, not timing: the hanging endpoint holds its first request until the test
closes it, so if any stage waited for a delivery the run could not end before that.
"""

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from grpoflow.core.jobdir import JobDir
from grpoflow.integrations import webhooks
from grpoflow.trainers.metrics import read_events
from tests.conftest import cli

# The training child is the stand-in (tests/standin_child.py): what is tested is the deliveries around the stages.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server", "standin")]
SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtcGlwZWxpbmUtdGVzdA=="
SECRET_ENV = "GRPOFLOW_TEST_WEBHOOK_SECRET"
# How long the hanging endpoint holds a request at most: many times a whole test run on a loaded machine. Only a
# regression (a stage waiting for a delivery) makes the run last that long, and then the test fails, not hangs.
HOLD_S = 600


class Receiver:
    """A real HTTP endpoint on loopback that records each request as it arrives; `hold` answers none before `close`
    (or `HOLD_S`)."""

    def __init__(self, hold: bool = False):
        self.requests, self.released, receiver = [], threading.Event(), self
        if not hold:
            self.released.set()
        self._timer = threading.Timer(HOLD_S, self.released.set)
        self._timer.daemon = True
        self._timer.start()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append((dict(self.headers), body))
                receiver.released.wait()
                try:
                    self.send_response(204)
                    self.end_headers()
                except OSError:  # the sender gave up
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self._timer.cancel()
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_of_webhooks():
    """The warnings `grpoflow.integrations.webhooks` logs (its own logger: a pipeline run reconfigures the root's)."""
    handler, logger = Records(), logging.getLogger(webhooks.__name__)
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_signed_delivery_and_no_stage_waits_for_a_bad_endpoint(make_spec, monkeypatch, capfd, warnings_of_webhooks):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    # A held attempt must not end by the sender's timeout either; short backoffs drain the queues fast afterwards.
    monkeypatch.setattr(webhooks, "POLICY", webhooks.Policy(timeout_s=HOLD_S + 60, backoff_s=(0.05,)))
    good, hanging = Receiver(), Receiver(hold=True)
    dead = f"http://127.0.0.1:{free_port()}/down"  # nothing listens there
    try:
        hooks = [
            {"url": good.url, "secret_env": SECRET_ENV},
            {"url": hanging.url, "secret_env": SECRET_ENV},
            {"url": dead},
        ]
        code, out, err = cli("run", make_spec("hooked", webhooks=hooks), "--json")
        assert code == 0, err
        job = JobDir(Path(json.loads(out)["output_dir"]))
        held = list(hanging.requests)
        lines = [json.loads(line) for line in job.webhooks.read_text().splitlines()]
    finally:
        good.close()
        hanging.close()
    assert webhooks.flush(60)  # what the closed endpoints still had queued: nothing runs into the next test

    # Every event of the job reached the healthy endpoint, in order, each with a valid signature.
    records = read_events(job.events)
    received = [json.loads(body)["type"] for _, body in good.requests]
    assert received == [r["event"].removeprefix("grpoflow.") for r in records] and received[-1] == "job.completed"
    assert all(Webhook(SECRET).verify(body, headers) for headers, body in good.requests)
    assert all(webhooks.verify(SECRET, headers, body) for headers, body in good.requests)

    # The hanging endpoint got the first event and still held it when the run had ended: no attempt to it finished,
    # so no stage waited for one. The run's end waited for it only as long as its final flush allows, then went on.
    assert [h["webhook-id"] for h, _ in held] == [records[0]["id"]]
    outcomes = {}
    for line in lines:
        outcomes.setdefault(line["url"], []).append(line["outcome"])
    assert hanging.url not in outcomes
    assert any("deliveries still under way after" in m for m in warnings_of_webhooks)
    # The dead endpoint: tried, failed, and never a stage's concern either.
    assert set(outcomes[dead]) <= {"retrying", "failed"} and "failed" in outcomes[dead]
    assert outcomes[good.url] == ["delivered"] * len(records)

    # The secret is nowhere: job files, the delivery log, stdout/stderr.
    for path in job.root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    out, err = capfd.readouterr()
    assert SECRET not in out + err + "".join(warnings_of_webhooks)
