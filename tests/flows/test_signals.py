"""Signals to `grpoflow run`, as a user sends them: Ctrl-C (SIGINT), SIGTERM (kill, systemd, a CI timeout) and
SIGKILL, each once training has started (step 1 in metrics.jsonl) of a 200-step job on builtin:tiny: Ctrl-C with
the real training child, the others with the stand-in (tests/standin_child.py), which the signals reach the same way.

SIGINT and SIGTERM: the command ends within seconds with one line on stderr and no traceback, events.jsonl ends with
`job.failed` (reason cancelled), which a webhook receiver got too, the newest checkpoint saved before the signal is
kept, the flow run is Cancelled (read back from a `prefect server start` on loopback), and no process of the run (the
temporary Prefect server, the training child) is left. SIGKILL: the server and the training child exit with it; the
next `--resume` marks the killed flow run Crashed (read back from a `prefect server start` on loopback) and completes.

Every process a test starts is killed, with its children, at the end; every wait is bounded.
"""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import arithmetic_rows, write_jsonl
from tests.prefect_home import prefect_home

pytestmark = pytest.mark.slow

STEPS = 200
RESUMED_STEPS = 12  # the job killed and resumed: short, so that the resume completes quickly
# A bound on the job's end after the signal (events, webhooks flushed, the server stopped: seconds alone), far below
# what the stand-in's 200 steps of 0.2 s or the real child's run would take, and wide enough for a busy machine.
EXIT_WITHIN_S = 45


def spec_file(tmp_path: Path, max_steps: int = STEPS, webhook: str | None = None) -> Path:
    spec = {
        "name": "signals",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(24)))},
        "rewards": [{"name": "exact_answer"}],
        "hyperparameters": {"max_steps": max_steps, "rollouts_per_prompt": 2, "max_response_length": 4},
        "checkpoint_every": 1,
        "evaluation": {"holdout": 2},
        "output_uri": str(tmp_path / "runs"),
        "webhooks": [{"url": webhook}] if webhook else [],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_env(tmp_path: Path, api_url: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=prefect_home(tmp_path / "prefect-home"), PYTHONUNBUFFERED="1")  # its database migrated
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def start_run(tmp_path: Path, env: dict, max_steps: int = STEPS, webhook: str | None = None) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "grpoflow.flows.cli",
        "run",
        str(spec_file(tmp_path, max_steps, webhook)),
        "--json",
    ]
    out, err = (tmp_path / "run.out").open("ab"), (tmp_path / "run.err").open("ab")
    return subprocess.Popen(command, env=env, stdout=out, stderr=err, cwd=Path(__file__).parents[2])


def job_folder(tmp_path: Path) -> Path | None:
    folders = [p for p in (tmp_path / "runs").glob("signals-*") if p.is_dir()]
    return folders[0] if folders else None


def wait_for_step(tmp_path: Path, proc: subprocess.Popen, step: int = 1, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "run.err").read_text()
        job = job_folder(tmp_path)
        metrics = job / "metrics.jsonl" if job else None
        # and a whole checkpoint (trainer_state.json is written last), which the signal must leave in place
        saved = job and list((job / "checkpoints").glob("checkpoint-*/trainer_state.json"))
        if metrics and metrics.exists() and len(metrics.read_text().splitlines()) >= step and saved:
            return job
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {timeout} s:\n{(tmp_path / 'run.err').read_text()[-3000:]}")


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    parent = psutil.Process(proc.pid)
    return [parent, *parent.children(recursive=True)]


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def alive(procs: list[psutil.Process], within: float) -> list[psutil.Process]:
    _, left = psutil.wait_procs(procs, timeout=within)
    return [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def checkpoints(job: Path) -> list[str]:
    return [p.parent.name for p in (job / "checkpoints").glob("checkpoint-*/trainer_state.json")]


def step_of(checkpoint: str) -> int:
    return int(checkpoint.rsplit("-", 1)[1])


def events(job: Path) -> list[dict]:
    return [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "sig, own_server, child",
    [
        (signal.SIGINT, False, "real"),  # Ctrl-C, with the temporary Prefect server, the real training child
        (signal.SIGTERM, False, "stand-in"),
        # with PREFECT_API_URL set: the flow run's final state is read back from that server
        (signal.SIGINT, True, "stand-in"),
    ],
    ids=["SIGINT", "SIGTERM", "SIGINT-server"],
)
def test_a_signal_ends_the_run_cleanly(tmp_path, request, receiver, sig, own_server, child):
    if child == "stand-in":  # tests/standin_child.py: 200 steps of 0.2 s, which the signal cuts short
        request.getfixturevalue("standin")(step_seconds=0.2)
    api_url = request.getfixturevalue("prefect_server") if own_server else None
    proc = start_run(tmp_path, run_env(tmp_path, api_url), webhook=receiver.url)
    procs = []
    try:
        job = wait_for_step(tmp_path, proc)
        procs, newest = tree(proc), max(map(step_of, checkpoints(job)))
        if not own_server:
            # the temporary server (`prefect server start`), to be stopped
            assert any("-m prefect server start" in " ".join(p.cmdline()) for p in procs)
        assert any("grpoflow.trainers.grpo" in " ".join(p.cmdline()) for p in procs)  # the training child
        proc.send_signal(sig)
        signalled = time.monotonic()
        code = proc.wait(timeout=EXIT_WITHIN_S + 15)
        took = time.monotonic() - signalled
        err = (tmp_path / "run.err").read_text()
        assert took < EXIT_WITHIN_S, err
        assert code == 128 + sig, err
        assert "Traceback" not in err and "ConnectError" not in err
        assert "Crash detected" not in err  # Prefect's report of the stop stays in the API's logs
        assert f"grpoflow: stopped by {sig.name}" in err
        last = events(job)[-1]
        assert last["event"] == "grpoflow.job.failed" and last["payload"]["reason"] == "cancelled"
        assert receiver.types[-1] == "job.failed"  # delivered before the command ended
        # Training goes on until the signal lands, and the trainer keeps only its newest checkpoints
        # (save_total_limit): the newest one seen before the signal, or a newer one, is there, whole.
        assert max(map(step_of, checkpoints(job))) >= newest, "the checkpoints saved before the signal are gone"
        assert not (job / ".lock").exists()
        assert alive(procs, within=30) == []  # no server, no training child left (waited for as they end)
        if own_server:
            run_id = json.loads((job / "flow_run.json").read_text())["flow_run_id"]
            assert flow_run_state(api_url, run_id) == "CANCELLED"
    finally:
        if proc.poll() is None:
            procs = procs or tree(proc)
        kill_all(procs)


class _Hooks(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.types.append(json.loads(body)["type"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    """A webhook receiver on loopback: `.url`, and `.types`, the event types delivered, in order."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    server.types, server.url = [], f"http://127.0.0.1:{server.server_port}/hook"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prefect_server(tmp_path):
    """`prefect server start` on a loopback port with this test's PREFECT_HOME: the API the killed run and its
    resume both use, and the test reads the flow run's state from."""
    port = free_port()
    env = run_env(tmp_path)
    command = [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--no-services"]
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    try:
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, (tmp_path / "server.log").read_text()
                time.sleep(0.3)
        yield url
    finally:
        kill_all(tree(server) if server.poll() is None else [])


def flow_run_state(api_url: str, flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state.type.value


def test_sigkill_leaves_nothing_behind_and_resume_marks_the_run_crashed(tmp_path, standin):
    standin(step_seconds=0.2)
    proc = start_run(tmp_path, run_env(tmp_path))
    procs = []
    try:
        wait_for_step(tmp_path, proc)
        procs = tree(proc)
        assert len(procs) >= 3  # grpoflow, the temporary server, the training child
        proc.kill()
        proc.wait(timeout=10)
        assert alive(procs, within=15) == []  # the server and the child die with their parent
    finally:
        kill_all(procs)


def test_resume_after_sigkill_marks_the_flow_run_crashed(tmp_path, prefect_server, standin):
    standin(step_seconds=0.2)
    env = run_env(tmp_path, prefect_server)
    proc = start_run(tmp_path, env, max_steps=RESUMED_STEPS)
    procs = []
    try:
        job = wait_for_step(tmp_path, proc)
        procs = tree(proc)
        proc.kill()
        proc.wait(timeout=10)
        assert alive(procs, within=15) == []
        record = json.loads((job / "flow_run.json").read_text())
        assert flow_run_state(prefect_server, record["flow_run_id"]) == "RUNNING"  # what a SIGKILL leaves

        command = [
            sys.executable,
            "-m",
            "grpoflow.flows.cli",
            "run",
            str(tmp_path / "spec.yaml"),
            "--resume",
            job.name,
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert flow_run_state(prefect_server, record["flow_run_id"]) == "CRASHED"
        assert json.loads((job / "flow_run.json").read_text())["flow_run_id"] != record["flow_run_id"]
        assert events(job)[-1]["event"] == "grpoflow.job.completed"
    finally:
        kill_all(procs)
