"""Webhooks through a whole pipeline run: every event arrives signed; dead or hanging endpoints cost the run only
the bounded final flush; the secret appears in no file, log line or event."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flows.pipeline import WEBHOOK_FLUSH_S
from tasks.webhooks import verify
from tests.conftest import cli
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]
SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtcGlwZWxpbmUtdGVzdA=="


class Receiver:
    """A real HTTP endpoint on loopback that records each request, or hangs on every one."""

    def __init__(self, hang: bool = False):
        self.requests, receiver = [], self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                if hang:
                    time.sleep(30)
                receiver.requests.append((dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_run(spec) -> tuple[float, JobDir]:
    started = time.monotonic()
    code, out, err = cli("run", spec, "--json")
    assert code == 0, err
    return time.monotonic() - started, JobDir(Path(json.loads(out)["output_dir"]))


def test_signed_delivery_and_bounded_cost(make_spec, monkeypatch, capfd):
    monkeypatch.setenv("GRPOFLOW_TEST_WEBHOOK_SECRET", SECRET)
    good, hanging = Receiver(), Receiver(hang=True)
    try:
        hooks = [
            {"url": good.url, "secret_env": "GRPOFLOW_TEST_WEBHOOK_SECRET"},
            {"url": hanging.url, "secret_env": "GRPOFLOW_TEST_WEBHOOK_SECRET"},
            {"url": f"http://127.0.0.1:{free_port()}/down"},  # nothing listens there
        ]
        plain_seconds, _ = timed_run(make_spec("plain"))
        hooked_seconds, job = timed_run(make_spec("hooked", webhooks=hooks))
    finally:
        good.close()
        hanging.close()

    # Every event of the job reached the healthy endpoint, in order, each with a valid signature.
    emitted = [r["event"].removeprefix("grpoflow.") for r in read_metrics(job.events)]
    received = [json.loads(body)["type"] for _, body in good.requests]
    assert received == emitted and received[-1] == "job.completed"
    assert all(verify(SECRET, headers, body) for headers, body in good.requests)

    # The dead and hanging endpoints cost at most the final, bounded flush.
    assert hooked_seconds <= plain_seconds + WEBHOOK_FLUSH_S + 15

    # The secret is nowhere: job files, the delivery log, stdout/stderr.
    for path in job.root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    out, err = capfd.readouterr()
    assert SECRET not in out + err
    outcomes = {json.loads(line)["url"]: json.loads(line)["outcome"] for line in job.webhooks.read_text().splitlines()}
    assert outcomes[good.url] == "delivered"
