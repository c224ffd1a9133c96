"""A Prefect server busy for a while, on 127.0.0.1: `answering(503, 503)` answers the first requests with those
statuses (what a server's "database is locked" is), then 200, noting when each request came. For the tests of what
grpoflow's calls to Prefect do with a busy server (tests/flows/test_deployments.py, tests/api/test_app.py)."""

import contextlib
import http.server
import json
import threading
import time


class Answers(http.server.BaseHTTPRequestHandler):
    """A loopback HTTP server's handler that answers each request with the next status of `statuses` (then 200),
    noting when each came: a Prefect server busy for a while."""

    statuses: list[int] = []
    times: list[float] = []

    def do_GET(self):
        type(self).times.append(time.monotonic())
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        body = json.dumps("Hello, Marvin!" if status == 200 else {"exception_message": "Service Unavailable"})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_PATCH = do_GET

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def answering(*statuses: int):
    """A loopback server answering `statuses` in turn, then 200; yields its API URL and the times of the requests."""
    handler = type("Busy", (Answers,), {"statuses": list(statuses), "times": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api", handler.times
    finally:
        server.shutdown()
        server.server_close()
