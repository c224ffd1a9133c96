"""The temporary Prefect server `grpoflow run` starts when no Prefect API is configured
(integrations/prefect_server.py).

Each case runs in a child process with its own environment and PREFECT_HOME, as a `grpoflow run` would: Prefect's
settings are read once per process.
"""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.common import REPO_ROOT
from tests.prefect_home import prefect_home

FLOW_SCRIPT = """
import json, os
import httpx
from prefect import flow, get_run_logger
from grpoflow.integrations import prefect_server as server

@flow
def hello():
    get_run_logger().info("hello from the flow")
    return 42

temporary = server.start_if_needed()
assert temporary is not None
with server.connected(temporary):
    from prefect.settings import get_current_settings

    inside = os.environ["PREFECT_API_URL"]
    heartbeat = get_current_settings().flows.heartbeat_frequency
    state = hello(return_state=True)
url = temporary.api_url
block_types = httpx.post(f"{url}/block_types/filter", json={}).json()
# Leaving `connected` drained Prefect's log and event workers: the server has the flow's log line before it stops.
flow_run = str(state.state_details.flow_run_id)
logs = httpx.post(f"{url}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run]}}}).json()
process = temporary.process
command = process.args[2:]
temporary.stop()
print(json.dumps({
    "result": state.result(),
    "inside": inside,
    "url": url,
    "after": os.environ.get("PREFECT_API_URL"),
    "messages": [log["message"] for log in logs],
    "server_exit": process.returncode,
    "heartbeat": heartbeat,
    "block_types": len(block_types),
    "command": [str(a) for a in command],
}))
"""

NOTHING_TO_START = """
from grpoflow.integrations import prefect_server as server
print(server.start_if_needed() is None)
"""


def run(script: str, tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # A home whose database is migrated: what is tested is when the server starts and stops, not its migrations.
    environ |= {"PREFECT_HOME": prefect_home(tmp_path / "prefect-home"), "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_a_flow_runs_against_the_temporary_server_and_its_logs_arrive(tmp_path):
    proc = run(FLOW_SCRIPT, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == 42
    assert out["inside"] == out["url"] and out["url"].startswith("http://127.0.0.1:")
    assert out["after"] is None  # PREFECT_API_URL is this run's only
    assert "hello from the flow" in out["messages"]
    assert out["server_exit"] is not None  # stopped, not left behind
    # Prefect's own command, nothing of Prefect's replaced: no UI, no scheduler, no late-runs marker.
    assert out["command"][:4] == ["-m", "prefect", "server", "start"] and "--no-ui" in out["command"]
    assert "grpoflow: temporary Prefect server on http://127.0.0.1:" in proc.stderr
    # What a temporary server skips: flow run heartbeats (no one outlives it to detect a crash from them) and the
    # block catalogue (~1.3 s of its boot; the next `prefect server start` on this home registers it).
    assert out["heartbeat"] is None
    assert out["block_types"] == 0


# A run's end is task runs (a job's uploads) just before the server stops; Prefect's server records them from the
# events the client sent, after it sent them. Thirty quick ones leave it a backlog to record on any machine.
RECORDED_SCRIPT = """
import json
import httpx
from prefect import flow, task
from grpoflow.integrations import prefect_server as server

@task
def step(i):
    return i

@flow
def steps():
    return [step(i) for i in range(30)]

temporary = server.start_if_needed()
with server.connected(temporary):
    state = steps(return_state=True)
flow_run = str(state.state_details.flow_run_id)
runs = httpx.post(f"{temporary.api_url}/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run]}}}).json()
temporary.stop()
print(json.dumps([run["state_type"] for run in runs]))
"""


@pytest.mark.slow
def test_the_server_stops_once_it_has_recorded_the_runs_task_runs(tmp_path):
    proc = run(RECORDED_SCRIPT, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Stopped earlier, the server had recorded a few of them, and printed "Error flushing 1 events (1 to retry, 0
    # dropped)" with a CancelledError traceback for the write it was cancelled in.
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["COMPLETED"] * 30
    assert "Error flushing" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "env",
    [
        {"PREFECT_API_URL": "http://127.0.0.1:9/api"},  # a configured server: use it
        {"PREFECT_SERVER_EPHEMERAL_ENABLED": "false"},  # ephemeral mode off: Prefect's own rule applies
    ],
    ids=["api-url-set", "ephemeral-off"],
)
def test_nothing_is_started_when_prefect_is_configured_otherwise(tmp_path, env):
    proc = run(NOTHING_TO_START, tmp_path, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "True"
    assert "temporary Prefect server" not in proc.stderr


LOOKS = """
import json
from grpoflow.integrations import prefect_server as server
early = server._configured_elsewhere()
from prefect.settings import get_current_settings
settings = get_current_settings()
print(json.dumps([early, bool(settings.api.url) or not settings.server.ephemeral.enabled]))
"""

API = 'PREFECT_API_URL = "http://127.0.0.1:9/api"'


@pytest.mark.parametrize(
    "profiles, env, configured",
    [
        (None, {}, False),  # no profiles file: Prefect's built-in "ephemeral" profile
        ('active = "ephemeral"\n[profiles.ephemeral]\nPREFECT_SERVER_EPHEMERAL_ENABLED = "true"\n', {}, False),
        ('active = "mine"\n[profiles.mine]\nPREFECT_SERVER_ALLOW_EPHEMERAL_MODE = "true"\n', {}, False),
        (f'active = "mine"\n[profiles.mine]\n{API}\n', {}, True),
        ('active = "mine"\n[profiles.mine]\nPREFECT_SERVER_EPHEMERAL_ENABLED = "false"\n', {}, True),
        (f'active = "ephemeral"\n[profiles.mine]\n{API}\n', {"PREFECT_PROFILE": "mine"}, True),
        (None, {"PREFECT_SERVER_EPHEMERAL_ENABLED": "false"}, True),
        (None, {"PREFECT_API_URL": "http://127.0.0.1:9/api"}, True),
    ],
    ids=[
        "none",
        "ephemeral",
        "allow-alias",
        "api-url",
        "ephemeral-off",
        "PREFECT_PROFILE",
        "env-off",
        "env-url",
    ],
)
def test_the_early_look_agrees_with_prefects_settings(tmp_path, profiles, env, configured):
    # `_configured_elsewhere` decides whether the server starts before Prefect's import: it must read the
    # environment and the active profile as Prefect does (Prefect's own reading decides in the end either way).
    if profiles is not None:
        (tmp_path / "prefect-home").mkdir()
        (tmp_path / "prefect-home" / "profiles.toml").write_text(profiles)
    proc = run(LOOKS, tmp_path, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [configured, configured]


def test_a_server_started_early_stops_when_prefect_finds_an_api_the_early_look_does_not_read(tmp_path):
    # prefect.toml in the working folder: only Prefect's settings read it. The server started before Prefect's
    # import is stopped unannounced, and no process is left.
    (tmp_path / "prefect.toml").write_text('[api]\nurl = "http://127.0.0.1:9/api"\n')
    script = (
        "import json, psutil\nfrom grpoflow.integrations import prefect_server as server\n"
        "assert not server._configured_elsewhere()\n"
        "result = server.start_if_needed()\n"
        "print(json.dumps([result is None, [p.cmdline() for p in psutil.Process().children(recursive=True)]]))"
    )
    proc = run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, []]
    assert "temporary Prefect server" not in proc.stderr


def test_run_starts_the_server_before_it_imports_prefect_or_the_spec_modules(tmp_path, make_spec):
    # Its boot is the longest part of a run's start: it starts first, and the rest imports beside it.
    script = (
        "import json, sys\nfrom grpoflow.integrations import prefect_server as server\n"
        "from grpoflow.flows.cli import main\nseen = []\n"
        "def launch(self):\n"
        "    seen.append([name for name in ('prefect', 'grpoflow.core.spec') if name in sys.modules])\n"
        "    raise KeyboardInterrupt\n"
        "server.TemporaryServer._launch = launch\n"
        f"code = main(['run', {str(make_spec('s'))!r}])\n"
        "print(json.dumps({'code': code, 'seen': seen}))"
    )
    proc = run(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"code": 130, "seen": [[]]}


@pytest.mark.slow
def test_a_server_that_cannot_start_ends_the_run_with_a_message(tmp_path, make_spec):
    # Its database cannot be created: uvicorn exits at startup (code 3, as for a taken port), a few times over.
    bad_db = f"sqlite+aiosqlite:///{tmp_path / 'no-such-dir' / 'prefect.db'}"
    script = f"import sys; from grpoflow.flows.cli import main; sys.exit(main(['run', {str(make_spec('s'))!r}]))"
    proc = run(script, tmp_path, PREFECT_API_DATABASE_CONNECTION_URL=bad_db)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "grpoflow: the temporary Prefect server exited with code 3 before it answered (3 tries" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr.split("grpoflow: the temporary")[1]
    assert not (tmp_path / "runs").exists()  # no job folder: nothing ran


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dataset": {"uri": "no-such-data.jsonl"}}, "not found"),  # the preflight's
        ({"hyperparameters": {"learning_rate": -1}}, "learning_rate"),  # the spec's own (it loads beside the boot)
    ],
    ids=["preflight", "spec"],
)
def test_a_job_that_cannot_run_stops_the_server_booting_beside_it(tmp_path, make_spec, changes, message):
    # The server starts first (its boot overlaps loading the spec and the preflight); a rejected job stops it
    # unannounced and leaves no process.
    if "dataset" in changes:
        changes = {"dataset": {"uri": str(tmp_path / changes["dataset"]["uri"])}}
    spec = make_spec("s", **changes)
    script = (
        "import json, psutil; from grpoflow.flows.cli import main; "
        f"code = main(['run', {str(spec)!r}]); "
        "print(json.dumps({'code': code, 'left': [p.cmdline() for p in psutil.Process().children(recursive=True)]}))"
    )
    proc = run(script, tmp_path)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"code": 2, "left": []}, proc.stderr[-3000:]
    assert message in proc.stderr
    assert "temporary Prefect server" not in proc.stderr
    assert not (tmp_path / "runs").exists()
