"""`grpoflow api` with no Prefect server configured: it starts a temporary server, deploys the project to it and runs
a worker of its own; SIGTERM stops the API, the worker and the server, and nothing of them is left."""

import os
import signal
import subprocess
import sys
import time

import httpx2
import psutil
import pytest

from grpoflow.flows.deployments import PROJECT_DIR
from tests.flows.test_deployments import free_port
from tests.prefect_home import prefect_home

pytestmark = pytest.mark.slow


def test_alone_it_brings_its_own_server_and_worker_and_takes_them_down(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": prefect_home(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    grpoflow = [sys.executable, "-m", "grpoflow.flows.cli", "api"]
    keys = tmp_path / "keys.yaml"
    made = subprocess.run([*grpoflow, "keys", "add", "--team", "a", "--keys", keys], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    key, port = made.stdout.strip(), free_port()
    command = [*grpoflow, "--keys", keys, "--port", port, "--output-uri", tmp_path / "out", "--project", PROJECT_DIR]
    with (tmp_path / "api.log").open("wb") as log:
        api = subprocess.Popen([str(c) for c in command], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline, answer = time.monotonic() + 240, None
        while answer is None or answer.status_code != 200:
            assert api.poll() is None and time.monotonic() < deadline, (tmp_path / "api.log").read_text()
            time.sleep(1)
            try:
                answer = httpx2.get(f"http://127.0.0.1:{port}/v1/files", headers={"Authorization": f"Bearer {key}"})
            except httpx2.TransportError:
                pass
        started = psutil.Process(api.pid).children()
        names = sorted(" ".join(p.cmdline()[3:5]) for p in started)
        assert names == ["prefect server", "prefect worker"], names
        api.send_signal(signal.SIGTERM)
        assert api.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(started, timeout=30)
        assert alive == []
    finally:
        if api.poll() is None:
            api.kill()
