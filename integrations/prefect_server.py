"""The temporary Prefect server `grpoflow run` uses when no Prefect API is configured.

It is `prefect server start` (Prefect's own command, nothing patched) on a free loopback port, without the UI, the
scheduler or the late-runs service, started by grpoflow rather than by Prefect's client (its ephemeral mode) for
three reasons: it boots while this process still imports Prefect, loads the spec and runs the preflight; it runs in
a session of its own, so the terminal's Ctrl-C reaches only grpoflow, which ends the job through the server and stops
it last; and it dies with grpoflow however grpoflow dies. It starts before Prefect's import whenever the environment
and the active profile configure no API (`_configured_elsewhere`); Prefect's reading of its settings then confirms
that it is needed. The flow talks to it as to any running server, through `PREFECT_API_URL` set for this process and
its children; before it stops, what Prefect still queues is sent and the server is given the time to record it
(`wait_recorded`). With `PREFECT_API_URL` set (or a profile that sets it), or with ephemeral mode turned off, nothing
is started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

# `prefect server start`'s exit codes when startup failed: 1 for a port it found taken, uvicorn's 3 for one taken
# between its check and its bind (then another port may do), or for the app failing to start (then every try fails
# the same way): a few tries, not until the timeout.
STARTUP_FAILED_EXITS = (1, 3)
MAX_LAUNCHES = 3

# What the server runs: the API with its services (they record task runs and events), without what only a lasting
# server needs: the UI, the scheduler of deployments, the late-runs marker.
SERVER_FLAGS = ("--no-ui", "--no-scheduler", "--no-late-runs", "--analytics-off", "--log-level", "ERROR")
# What a temporary server skips unless the environment asks for it: writing Prefect's catalogue of block types into
# the database at each start, which first imports every installed Prefect collection (prefect-kubernetes: ~1.3 s).
# A run writes no block; the next `prefect server start` on this PREFECT_HOME registers the catalogue as usual.
SERVER_DEFAULTS = {  # the names Prefect reads each setting from, the value
    ("PREFECT_SERVER_REGISTER_BLOCKS_ON_START", "PREFECT_API_BLOCKS_REGISTER_ON_START"): "false",
}
# Where the environment or a profile configures the API, or turns Prefect's ephemeral server off.
API_KEYS = ("PREFECT_API_URL",)
EPHEMERAL_KEYS = ("PREFECT_SERVER_EPHEMERAL_ENABLED", "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE")


class ServerError(RuntimeError):
    """The temporary server did not come up; the message says what happened and what to set."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Linux: SIGTERM to the server when the process that started it dies, however it dies (as grpoflow.jobs.launch
    # does for training children).
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class TemporaryServer:
    """A Prefect server on a free loopback port, in a child process; `wait()` until it answers, `stop()` at the end."""

    def __init__(self):
        defaults = {names[0]: value for names, value in SERVER_DEFAULTS.items() if not set(names) & set(os.environ)}
        self._env = {**defaults, **os.environ}
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
        # Its own session: the terminal's Ctrl-C reaches only grpoflow, which then ends the job through this server
        # and stops it last. And it dies with grpoflow (SIGKILL included), never orphaned.
        # -P: the user's folder is not on its path (a `prefect.py` of their own stays theirs).
        command = [sys.executable, "-P", "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port"]
        self.process = subprocess.Popen(
            [*command, str(self.port), *SERVER_FLAGS],
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # its welcome banner; its errors go to stderr
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def wait(self) -> str:
        """Blocks until the server answers /health; returns its API URL. Raises ServerError if it never does."""
        from prefect.settings import get_current_settings

        timeout_s = get_current_settings().server.ephemeral.startup_timeout_seconds
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code in STARTUP_FAILED_EXITS and self.launches < MAX_LAUNCHES:
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
            f"the temporary Prefect server did not answer within {timeout_s:g} s; raise "
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
    if any(os.environ.get(key) for key in API_KEYS):
        return None  # Prefect's settings read the environment first: nothing to import to know
    early = None if _configured_elsewhere() else TemporaryServer()
    from prefect.settings import get_current_settings

    if not _wants_temporary(get_current_settings()):
        if early is not None:  # configured where only Prefect looks (.env, prefect.toml, pyproject.toml)
            early.stop()
        return None
    return early or TemporaryServer()


def needed() -> bool:
    """Whether `start_if_needed` would start a server (no Prefect API configured, ephemeral mode on)."""
    if any(os.environ.get(key) for key in API_KEYS):
        return False
    from prefect.settings import get_current_settings

    return _wants_temporary(get_current_settings())


def _wants_temporary(settings) -> bool:
    return not settings.api.url and settings.server.ephemeral.enabled


def _configured_elsewhere() -> bool:
    """Whether the environment or the active profile names a Prefect API or turns ephemeral mode off: a look that
    imports nothing, at where a Prefect API is usually configured, to start the server before Prefect's import.
    Prefect's own reading of its settings decides in every case."""
    if any(os.environ.get(key) for key in API_KEYS) or any(_off(os.environ.get(key)) for key in EPHEMERAL_KEYS):
        return True
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except FileNotFoundError:
        profiles = {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return True
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    profile = (profiles.get("profiles") or {}).get(active)
    if not isinstance(profile, dict):
        return active != "ephemeral"  # Prefect's built-in profiles: only "ephemeral" configures no API
    return any(profile.get(key) for key in API_KEYS) or any(_off(profile.get(key)) for key in EPHEMERAL_KEYS)


def _off(value) -> bool:
    return value is not None and str(value).strip().lower() in ("0", "false", "f", "no", "n", "off")


@contextlib.contextmanager
def connected(server: TemporaryServer | None):
    """Inside: Prefect's client (and child processes) use `server`, once it answers; nothing changes for None."""
    if server is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    url = server.wait()
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        # No flow run heartbeats: they let a server detect crashed runs, and this server ends with this process.
        # Without them the flow's end does not wait for the heartbeat thread's next wake (up to 1 s).
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            since = datetime.now(UTC)
            try:
                yield
            finally:
                drain_workers()
                wait_recorded(since)
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


def wait_recorded(since: datetime, timeout_s: float = 10.0, poll_s: float = 0.25) -> bool:
    """Waits until the server has recorded the task runs of the flow runs started since `since`, so that stopping it
    loses none.

    Prefect's server builds task runs from the events its client sends, in a service (the task run recorder) that
    writes them one by one, after the client has sent them; stopped meanwhile, the server cancels the write, prints
    "Error flushing 1 events ... CancelledError" (on grpoflow's stderr, which it shares) and the run's last task runs
    never reach its database. The server does not show its backlog, so this waits until every such task run is in a
    final state and none changed over one more look.

    Args:
        since (`datetime`): when the flow runs to wait for started, at the earliest.
        timeout_s (`float`, *optional*, defaults to `10.0`): the most seconds to wait.
        poll_s (`float`, *optional*, defaults to `0.25`): seconds between looks.

    Returns:
        `bool`: True once recorded; False after `timeout_s`, or when the server no longer answers.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime
    from prefect.client.schemas.sorting import TaskRunSort

    runs = FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since))
    deadline, seen = time.monotonic() + timeout_s, None
    try:
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                # Newest first: a long sweep's page of 200 holds the task runs still being recorded.
                task_runs = client.read_task_runs(flow_run_filter=runs, sort=TaskRunSort.EXPECTED_START_TIME_DESC)
                now = {(run.id, run.state_type) for run in task_runs}
                if now == seen and all(run.state is not None and run.state.is_final() for run in task_runs):
                    return True
                seen = now
                time.sleep(poll_s)
    except Exception:  # the server gone (a crash, a kill): nothing left to wait for
        return False
    return False
