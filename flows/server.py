"""The temporary Prefect server `grpoflow run` uses when no Prefect API is configured.

It is Prefect's own ephemeral server (the same uvicorn command, app and settings as
`prefect.server.api.server.SubprocessASGIServer`), started by grpoflow instead of by Prefect's client so that it
boots while this process still runs the preflight and imports the pipeline (Prefect, datasets, the tasks): they
overlap on a multi-core machine instead of adding up, and this process never imports the server's own modules
(FastAPI, SQLAlchemy, ~2.6 s).
The flow then talks to it as to any running server, through `PREFECT_API_URL` set for this process and its children.
With `PREFECT_API_URL` set (or a profile that sets it), or with ephemeral mode turned off, nothing is started.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# uvicorn's exit code when startup failed: its port taken between our check and its bind (then another port may do),
# or the app itself failing to start (then every try fails the same way): a few tries, not until the timeout.
STARTUP_FAILED_EXIT = 3
MAX_LAUNCHES = 3


class ServerError(RuntimeError):
    """The temporary server did not come up; the message says what happened and what to set."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Linux: SIGTERM to the server when the process that started it dies, however it dies (as trainers.launch does
    # for training children).
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class TemporaryServer:
    """A Prefect server on a free loopback port, in a child process; `wait()` until it answers, `stop()` at the end."""

    def __init__(self):
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        self.timeout_s = settings.server.ephemeral.startup_timeout_seconds
        # What Prefect's ephemeral server passes on: the settings from the active profile, the UI off.
        self._env = {
            **os.environ,
            **settings.to_environment_variables(exclude_unset=True),
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        self._env.pop("PREFECT_API_URL", None)
        self.process: subprocess.Popen | None = None
        self.launches = 0
        self._launch()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _launch(self) -> None:
        self.launches += 1
        self.port = _free_port()
        prefect_dir = Path(importlib.util.find_spec("prefect").origin).parent
        command = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_dir.parent), "--factory"]
        command += ["prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--log-level", "error", "--lifespan", "on"]
        # Its own session: the terminal's Ctrl-C reaches only grpoflow, which then ends the job through this server
        # and stops it last. And it dies with grpoflow (SIGKILL included), never orphaned.
        self.process = subprocess.Popen(
            command, env=self._env, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent
        )

    def wait(self) -> str:
        """Blocks until the server answers /health; returns its API URL. Raises ServerError if it never does."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == STARTUP_FAILED_EXIT and self.launches < MAX_LAUNCHES:
                self._launch()
            elif code is not None:
                raise ServerError(
                    f"the temporary Prefect server exited with code {code} before it answered ({self.launches} "
                    "tries; its error is above); start one with `prefect server start` and set PREFECT_API_URL, or "
                    "check the Prefect settings it read (PREFECT_HOME, PREFECT_API_DATABASE_CONNECTION_URL)"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        # Said once it answers: a job the preflight rejects stops it unannounced.
                        print(
                            f"grpoflow: temporary Prefect server on http://127.0.0.1:{self.port} "
                            "(set PREFECT_API_URL to use a running one)",
                            file=sys.stderr,
                        )
                        return self.api_url
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerError(
            f"the temporary Prefect server did not answer within {self.timeout_s:g} s; raise "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or set PREFECT_API_URL to a running server"
        )

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def start_if_needed() -> TemporaryServer | None:
    """Starts a temporary server when Prefect has no API URL and ephemeral mode is on (Prefect's default)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return None
    return TemporaryServer()


@contextlib.contextmanager
def connected(server: TemporaryServer | None):
    """Inside: Prefect's client (and child processes) use `server`, once it answers; nothing changes for None."""
    if server is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = server.wait()
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            try:
                yield
            finally:
                drain_workers()
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous


def drain_workers(timeout_s: float = 10.0) -> None:
    """Sends the logs and events Prefect still queues to the server, before the server goes away (as Prefect's own
    ephemeral server gets them at exit, because it stops last)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout_s)
