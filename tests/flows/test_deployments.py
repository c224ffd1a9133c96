"""grpoflow on a real Prefect server, as a user runs it: `prefect server start` on loopback (own PREFECT_HOME),
`grpoflow deployments apply`, `prefect worker start --pool grpo-gpu`; then

(a) `grpoflow submit` runs `grpo-pipeline/retrain` with a spec object, and the job folder has its metrics (a rejected
    spec never reaches the server);
(b) `prefect event emit grpoflow.dataset.landed` with a dataset `uri` and a small `spec` starts `on-new-data` on it;
(c) a file dropped into a watched folder, and one put into an S3 bucket (moto's server on loopback; spec, dataset and
    job folder all on S3), each lead to exactly one completed pipeline run, and a further watcher pass emits nothing;
(d) the nightly deployment carries its cron schedule;
(e) a team's server on PostgreSQL (a real one on loopback: tests/postgres_server.py) runs a submitted job, and 16
    submissions at once become 16 runs there and on SQLite.

Those are marked slow; the fast tests check that the server commands reject a bad spec or a missing server before
anything is sent. Every scenario is started up front, so the training runs (one at a time: the pool's `training`
queue) and the watcher's runs overlap. Every process the test starts is stopped, with its children, at the end.
"""

import asyncio
import base64
import contextlib
import copy
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil
import pytest
import s3fs
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import (
    DeploymentFilter,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterId,
    FlowRunFilterName,
)
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings
from prefect.states import Cancelling
from standardwebhooks import Webhook

from grpoflow.flows.cli import main
from grpoflow.flows.deployments import PROJECT_DIR
from grpoflow.flows.watch import EVENT
from grpoflow.trainers.metrics import read_metrics
from tests.busy_server import answering
from tests.conftest import arithmetic_rows, standin_env, write_jsonl
from tests.postgres_server import chosen_database, postgres
from tests.prefect_form import form_parameters
from tests.prefect_home import prefect_home

PREFECT = str(Path(sys.executable).parent / "prefect")
CANARY_HF_TOKEN = "hf_canaryWorkerTokenQ7x2Lm9"
CANARY_SECRET_ENV, CANARY_WEBHOOK_SECRET = "GRPOFLOW_WEBHOOK_SECRET", "canary-webhook-secret-5k9zR"
RUN_TIMEOUT_S = 900  # one pipeline run takes ~1 min here, but four queue behind one another


def small_spec(name: str, dataset_uri: str, output_uri: str, holdout: int = 0) -> dict:
    """A job of two stand-in steps; no held-out evaluation unless `holdout` asks (its model loads and generation
    cost a flow run here ~6 CPU s of its ~11, and what runs around it is what these tests check: the evaluation's own
    tests are tests/tasks/test_evaluate.py and tests/flows/test_pipeline.py)."""
    return {
        "name": name,
        "base_model": "builtin:tiny",
        "dataset": {"uri": dataset_uri},
        "rewards": [{"name": "exact_answer"}],
        "hyperparameters": {"max_steps": 2, "rollouts_per_prompt": 2, "max_response_length": 4},
        "evaluation": {"holdout": holdout},
        "output_uri": output_uri,
    }


# Jobs whose stand-in child stops at step 1 on purpose, as the real child does: a setup problem (exit 2) and the health
# monitor's stop (exit 4); with the exit code `grpoflow submit --wait` (and `grpoflow run`) ends with, and the error.
ENDINGS = {
    "setup-problem": {"grpo": {"exit_at": 1, "exit_code": 2, "message": "trl 0.0 is too old for this spec"}},
    "diverges": {"grpo": {"exit_at": 1, "exit_code": 4, "message": "loss is nan at step 1"}},
}


# The jobs of the worker-death and crash tests: GRPO slow enough to kill the worker in the middle of; a flow run
# killed (with its training child) after GRPO's checkpoint-2, once or every time.
CRASHES = {
    "outlive": {"grpo": {"step_seconds": 0.5}},
    "crash-once": {"grpo": {"crash_at": 2, "crashes": 1, "kill": "flow"}},
    "crash-always": {"grpo": {"crash_at": 2, "kill": "flow"}},
}


# --- without a server ---------------------------------------------------------------------------------------------


def cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_submit_rejects_locally(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(small_spec("bad", "d.jsonl", "runs") | {"gpu_count": 0}))
    # Nothing listens there: reaching the server would fail differently (exit 1).
    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        code, out, err = cli("submit", spec, "--set", "hyperparameters.rollouts_per_prompt=1")
    assert code == 2 and out == ""
    assert "gpu_count" in err and "rollouts_per_prompt" in err  # every problem at once


def test_server_commands_need_a_server(tmp_path):
    spec = tmp_path / "ok.yaml"
    spec.write_text(yaml.safe_dump(small_spec("ok", "d.jsonl", "runs")))
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        for argv in (["deployments", "apply"], ["submit", spec]):
            code, _, err = cli(*argv)
            assert code == 2 and "PREFECT_API_URL is not set" in err


@pytest.mark.parametrize(
    "statuses, retries, answered",
    [
        ([503, 503], 5, True),  # a SQLite server's "database is locked" is a 503: retried, then answered
        ([429], 5, True),  # rate limited: retried
        ([503, 503, 503], 1, False),  # still busy once the retries are spent: one line that says so
    ],
)
def test_a_busy_server_is_retried_with_backoff(statuses, retries, answered):
    """grpoflow's calls go through Prefect's client, which retries 429 and 503 with exponential backoff and jitter
    (PREFECT_CLIENT_MAX_RETRIES times); what is left after that is one message, not a traceback."""

    from grpoflow.flows.deployments import DeploymentError, server_calls

    with answering(*statuses) as (url, times):
        with temporary_settings({PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: retries}):
            with contextlib.ExitStack() as raised:
                if not answered:
                    failed = raised.enter_context(pytest.raises(DeploymentError))
                with server_calls(url), get_client(sync_client=True) as client:
                    assert client.hello().json() == "Hello, Marvin!"
    tries = min(len(statuses), retries) + 1
    assert len(times) == tries
    waits = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(wait >= 1 for wait in waits), waits  # 2 s, then 4 s ..., each with jitter: never at once
    assert sum(waits) < 20
    if not answered:
        assert str(failed.value).startswith(f"the Prefect server at {url} is busy (HTTP 503 Service Unavailable)")
        assert "PREFECT_CLIENT_MAX_RETRIES" in str(failed.value) and "re-apply" not in str(failed.value)


def test_a_run_the_busy_server_created_is_submitted_even_unrenamed():
    """A server still busy for the rename that follows a run's creation: the run exists, so `submit` returns it named
    after its job (the name its flow takes when it starts) rather than failing, which would have the user submit the
    same job twice."""
    from prefect.client.schemas.objects import FlowRun

    from grpoflow.flows.deployments import name_after_job

    created = FlowRun(id=uuid.uuid4(), name="random-name", flow_id=uuid.uuid4(), expected_start_time=datetime.now(UTC))

    async def rename():
        async with get_client() as client:
            return await name_after_job(client, created, "busy")

    with answering(503, 503, 503) as (url, times):
        with temporary_settings({PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 1}):
            renamed = asyncio.run(rename())
    assert len(times) == 2 and renamed.id == created.id and renamed.name.startswith("busy-")


@pytest.mark.parametrize("command", ["apply", "submit"])
def test_no_server_at_the_url_is_one_line(tmp_path, command):
    """`deployments apply` and `submit` before the server is up: one line naming the URL and what to do, exit 1."""
    spec = tmp_path / "ok.yaml"
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    spec.write_text(yaml.safe_dump(small_spec("ok", str(data), str(tmp_path / "runs"))))
    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    with temporary_settings({PREFECT_API_URL: url}):
        code, out, err = cli(*(["deployments", "apply"] if command == "apply" else ["submit", spec]))
    assert code == 1 and out == ""
    assert err == (
        f"grpoflow: no Prefect server answers at {url}: start one with `prefect server start`, or set "
        "PREFECT_API_URL to the API of a running one\n"
    )


# --- the stack: server, deployments, worker ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, cwd=PROJECT_DIR, stdout=out, stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen]) -> None:
    """Stops each process and everything it started (the worker's flow runs, their training children)."""
    tree = []
    for proc in procs:
        try:
            parent = psutil.Process(proc.pid)
            tree += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=20)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "prefect server exited"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"no healthy Prefect server at {url} after {timeout} s")


@dataclass
class Stack:
    env: dict
    api_url: str
    tmp: Path
    applied: str = ""  # what `grpoflow deployments apply` printed
    applied_at: datetime | None = None
    first_watch_runs: list = field(default_factory=list)
    procs: list = field(default_factory=list)  # the server first, then the worker: what the fixture stops

    def stop_server(self) -> None:
        stop([self.procs[0]])

    def start_server(self) -> None:
        """Starts the stopped Prefect server again on the same port and database (its PREFECT_HOME), as an operator's
        restart or an upgrade does."""
        port = self.api_url.split(":")[2][:-4]
        self.procs[0] = start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port], self.env,
                              self.tmp / "server-restarted.log")  # fmt: skip
        wait_healthy(self.api_url, self.procs[0])

    def cli(self, *argv, timeout: float = 300) -> subprocess.CompletedProcess:
        """A command typed in a shell with PREFECT_API_URL set, e.g. `grpoflow submit ...`."""
        command = [str(a) for a in argv]
        if command[0] == "grpoflow":
            command = [sys.executable, "-m", "grpoflow.flows.cli", *command[1:]]
        elif command[0] == "prefect":
            command[0] = PREFECT
        return subprocess.run(command, env=self.env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=timeout)


def stack_env(tmp: Path, s3_env: dict, **more: str) -> dict:
    """The environment of a stack's server, worker and commands, its state under `tmp`; `more` on top."""
    (tmp / "worker-tmp").mkdir()
    return {
        **os.environ,
        **s3_env,
        # A migrated SQLite database to start from (what the PostgreSQL stack, its database elsewhere, leaves unread)
        "PREFECT_HOME": prefect_home(tmp / "prefect-home"),
        "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # default 10: each pickup would wait that long
        "GRPOFLOW_WATCH_STATE_DIR": str(tmp / "watch-state"),
        "GRPOFLOW_STAGING_DIR": str(tmp / "staging"),
        # The worker's temp folder, as an operator may set it: test_worker_secrets_stay_out_of_files reads every file
        # there, which it could not do in a shared /tmp in the time the suite has (the other tests' models)
        "TMPDIR": str(tmp / "worker-tmp"),
        # Secrets in the worker's environment, as an operator sets them: recognizable, so any file holding them is
        # found (test_worker_secrets_stay_out_of_files)
        "HF_TOKEN": CANARY_HF_TOKEN,
        CANARY_SECRET_ENV: CANARY_WEBHOOK_SECRET,
        # The worker's flow runs train with the stand-in child: what is tested is how runs start and end. A worker's
        # run with the real child: tests/flows/test_init.py::test_installed_grpoflow_runs_a_project_of_its_own.
        **standin_env(),
        # The job the cancel test stops trains slowly (200 s if nothing stopped it); the others at once.
        # The jobs of test_submit_wait_exits_as_grpoflow_run_would stop at their first step as the real child stops.
        "GRPOFLOW_STANDIN": json.dumps({"jobs": {"cancel-me": {"step_seconds": 0.5}, **ENDINGS, **CRASHES}}),
        # One automatic resume per crashed job, not the default two: test_a_crashed_run_is_resumed_within_the_bound
        # then sees the bound after one resume.
        "GRPOFLOW_AUTO_RESUME": "1",
        **more,
    }


@contextlib.contextmanager
def running_stack(tmp: Path, env: dict) -> Iterator[Stack]:
    """`prefect server start` (its database as `env` says), `grpoflow deployments apply`, `prefect worker start`;
    every process stopped on leaving."""
    api_url = env["PREFECT_API_URL"]
    procs = []
    try:
        server = start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", api_url.split(":")[2][:-4]], env,
                       tmp / "server.log")  # fmt: skip
        procs.append(server)
        wait_healthy(api_url, server)
        stack = Stack(env, api_url, tmp, procs=procs)
        applied = stack.cli("grpoflow", "deployments", "apply")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        stack.applied, stack.applied_at = applied.stdout, datetime.now(UTC)
        with temporary_settings({PREFECT_API_URL: api_url}):
            # The watcher's first look, which apply starts: noted for test_the_watcher_looks_when_deployed, then
            # removed with the schedule (its default folder is empty here; the tests start their looks themselves).
            stack.first_watch_runs = runs_of("watch-new-data/watch")
            pause_watch_schedule()
            with get_client(sync_client=True) as client:
                for flow_run in stack.first_watch_runs:
                    with contextlib.suppress(ObjectNotFound):  # pausing removed it
                        client.delete_flow_run(flow_run.id)
        procs.append(start([PREFECT, "worker", "start", "--pool", "grpo-gpu"], env, tmp / "worker.log"))
        with temporary_settings({PREFECT_API_URL: api_url}):
            # Two training runs at a time (a GPU machine runs one): these are tiny, mostly process start-up.
            with get_client(sync_client=True) as client:
                queue = client.read_work_queue_by_name("training", work_pool_name="grpo-gpu")
                client.update_work_queue(queue.id, concurrency_limit=2)
            yield stack
    finally:
        stop(procs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, s3_env):
    """grpoflow on a Prefect server as `prefect server start` makes it: SQLite, in the server's PREFECT_HOME (on
    PostgreSQL under `make test-postgres`: tests/postgres_server.py's `chosen_database`)."""
    tmp = tmp_path_factory.mktemp("stack")
    with chosen_database() as database, running_stack(tmp, stack_env(tmp, s3_env, **database)) as stack:
        yield stack


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory, s3_env):
    """grpoflow on a team's Prefect server: its database a real PostgreSQL (tests/postgres_server.py), as the Prefect
    guide sets it up with PREFECT_API_DATABASE_CONNECTION_URL."""
    tmp = tmp_path_factory.mktemp("pg-stack")
    with postgres() as database:
        env = stack_env(tmp, s3_env, PREFECT_API_DATABASE_CONNECTION_URL=database)
        with running_stack(tmp, env) as stack:
            yield stack


# --- talking to the server -----------------------------------------------------------------------------------------


def deployment_id(name: str):
    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(name).id


def pause_watch_schedule() -> None:
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("watch-new-data/watch")
        client.pause_deployment(deployment.id)


def wait_final(flow_run_id, timeout: float = RUN_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state and flow_run.state.is_final():
                return flow_run
            assert time.monotonic() < deadline, f"flow run {flow_run.name} still {flow_run.state.name}"
            time.sleep(0.5)


def runs_of(deployment: str, **parameters) -> list:
    flt = FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id(deployment)]))
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=flt)
    return [r for r in runs if all(r.parameters.get(k) == v for k, v in parameters.items())]


def wait_for_run(deployment: str, timeout: float = 120, **parameters):
    """The one run of `deployment` with these parameters, once the server has created it."""
    deadline = time.monotonic() + timeout
    while not (found := runs_of(deployment, **parameters)):
        assert time.monotonic() < deadline, f"no run of {deployment} with {parameters} after {timeout} s"
        time.sleep(0.5)
    return found


def landed_events(uri: str) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(
        event=EventNameFilter(name=[EVENT]), resource=EventResourceFilter(id=[f"grpoflow.dataset.{uri}"])
    )
    with get_client(sync_client=True) as client:
        return client.read_events(filter=flt, limit=50).events


def watcher_look(uri: str, spec: str, state_dir: Path, settle_seconds: float) -> str:
    """One run of watch-new-data/watch on `uri` that looks once; returns its state message (what the look found)."""
    return look_found(start_look(uri, spec, state_dir, settle_seconds))


def look_found(flow_run_id) -> str:
    """What a look found (its run's state message), once its run has completed."""
    flow_run = wait_final(flow_run_id, timeout=300)
    assert flow_run.state.is_completed(), flow_run.state
    return flow_run.state.message


def start_look(uri: str, spec: str, state_dir: Path, settle_seconds: float, deployment: str = "watch-new-data/watch"):
    """Starts one run of `deployment` (the hourly watcher, or `look`, which is not on its limited queue) on `uri` that
    looks once; returns its flow run's id."""
    parameters = {
        "uri": uri,
        "spec": spec,
        "state_dir": str(state_dir),  # the deployment names one in the project folder: the test keeps its own
        "settle_seconds": settle_seconds,
        "watch_minutes": 0,  # one look (deployed, a run keeps looking for 55 minutes)
    }
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(deployment_id(deployment), parameters=parameters).id


# --- the scenarios, started up front -------------------------------------------------------------------------------


@dataclass
class Scenarios:
    retrain_run_id: str
    retrain_run_name: str  # as `submit --json` printed it, while the run was still scheduled
    retrain_root: Path
    event_dataset: str
    event_root: Path
    folder: Path
    folder_file: str
    folder_spec: str
    folder_looks: list[str]
    bucket: str
    bucket_prefix: str
    bucket_file: str
    bucket_spec: str
    bucket_looks: list[str]


@pytest.fixture(scope="module")
def scenarios(stack, tmp_path_factory) -> Scenarios:
    tmp = tmp_path_factory.mktemp("scenarios")
    specs = tmp / "specs"
    specs.mkdir()
    rows = arithmetic_rows(12)

    # (a) a person submits a spec; a rejected one first, which must never reach the server
    write_jsonl(tmp / "retrain.jsonl", rows)
    retrain = specs / "retrain.yaml"
    retrain.write_text(yaml.safe_dump(small_spec("retrain", str(tmp / "retrain.jsonl"), str(tmp / "runs-retrain"))))
    rejected = stack.cli("grpoflow", "submit", retrain, "--set", "hyperparameters.rollouts_per_prompt=1")
    assert rejected.returncode == 2 and "rollouts_per_prompt" in rejected.stderr
    assert runs_of("grpo-pipeline/retrain") == []
    submitted = stack.cli("grpoflow", "submit", retrain, "--json")
    assert submitted.returncode == 0, submitted.stderr
    retrain_run_id, retrain_run_name = (json.loads(submitted.stdout)[k] for k in ("flow_run_id", "flow_run_name"))

    # (b) an event, emitted by hand with Prefect's CLI
    event_dataset = str(write_jsonl(tmp / "landed.jsonl", rows))
    event_spec = specs / "event.yaml"
    event_spec.write_text(yaml.safe_dump(small_spec("event", "unused.jsonl", str(tmp / "runs-event"))))
    payload = json.dumps({"uri": event_dataset, "spec": str(event_spec)})
    emitted = stack.cli("prefect", "event", "emit", EVENT, "--resource-id", f"grpoflow.dataset.{event_dataset}",
                        "--payload", payload)  # fmt: skip
    assert emitted.returncode == 0, emitted.stdout + emitted.stderr

    # (c) a watched folder, and a watched bucket whose spec, dataset and output all live on S3
    folder = tmp / "incoming"
    folder.mkdir()
    folder_spec = specs / "folder.yaml"
    folder_spec.write_text(yaml.safe_dump(small_spec("folder", "unused.jsonl", str(tmp / "runs-folder"))))
    folder_file = str(write_jsonl(folder / "prompts.jsonl", rows))

    fs, bucket = s3fs.S3FileSystem(), "grpoflow-e2e"
    fs.mkdir(bucket)
    bucket_spec = f"s3://{bucket}/specs/bucket.yaml"
    fs.pipe(bucket_spec, yaml.safe_dump(small_spec("bucket", "unused.jsonl", f"s3://{bucket}/runs")).encode())
    fs.pipe(f"{bucket}/incoming/prompts.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    prefix, bucket_file = f"s3://{bucket}/incoming", f"s3://{bucket}/incoming/prompts.jsonl"

    # A first look with a settle time longer than the files' age only notes them; then one look announces each file
    # that has settled (its size and version unchanged for settle_seconds), the look that sees it.
    # The folder's looks and the bucket's run side by side, the bucket's as `look` runs (`watch` runs one at a time).
    folder_looks, bucket_looks = [], []
    for settle in (3600, 0):
        looks = [start_look(str(folder), str(folder_spec), tmp / "watch-state", settle),
                 start_look(prefix, bucket_spec, tmp / "watch-state", settle, "watch-new-data/look")]  # fmt: skip
        folder_looks.append(look_found(looks[0]))
        bucket_looks.append(look_found(looks[1]))
    return Scenarios(
        retrain_run_id, retrain_run_name, tmp / "runs-retrain", event_dataset, tmp / "runs-event", folder, folder_file,
        str(folder_spec), folder_looks, bucket, prefix, bucket_file, bucket_spec, bucket_looks,
    )  # fmt: skip


def only_job(root: Path) -> Path:
    [job] = [p for p in root.iterdir() if (p / "spec.yaml").exists()]
    return job


def assert_trained(job: Path, dataset_uri: str) -> None:
    assert [r["step"] for r in read_metrics(job / "metrics.jsonl")] == [1, 2]
    assert yaml.safe_load((job / "spec.yaml").read_text())["dataset"]["uri"] == dataset_uri
    assert [json.loads(line)["event"] for line in (job / "events.jsonl").read_text().splitlines()][-1] == (
        "grpoflow.job.completed"
    )


# --- the checks ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_retrain_runs_a_submitted_spec(stack, scenarios):
    flow_run = wait_final(scenarios.retrain_run_id)
    assert flow_run.state.is_completed(), flow_run.state
    assert flow_run.parameters["spec"]["name"] == "retrain"  # the spec object, as the UI form shows it
    assert_trained(only_job(scenarios.retrain_root), str(scenarios.retrain_root.parent / "retrain.jsonl"))


@pytest.mark.slow
def test_event_starts_on_new_data(stack, scenarios):
    [flow_run] = wait_for_run("grpo-pipeline/on-new-data", dataset_uri=scenarios.event_dataset)
    flow_run = wait_final(flow_run.id)
    assert flow_run.state.is_completed(), flow_run.state
    assert flow_run.parameters["spec"].endswith("event.yaml")
    assert_trained(only_job(scenarios.event_root), scenarios.event_dataset)


@pytest.mark.slow
def test_dropped_file_runs_once(stack, scenarios):
    assert (
        scenarios.folder_looks[0].startswith("0 new dataset file(s)")
        and "1 waiting to settle" in scenarios.folder_looks[0]
    )
    assert scenarios.folder_looks[1].startswith("1 new dataset file(s)")
    [flow_run] = wait_for_run("grpo-pipeline/on-new-data", dataset_uri=scenarios.folder_file)
    flow_run = wait_final(flow_run.id)
    assert flow_run.state.is_completed(), flow_run.state
    assert_trained(only_job(Path(scenarios.folder_spec).parent.parent / "runs-folder"), scenarios.folder_file)

    third = watcher_look(str(scenarios.folder), scenarios.folder_spec, scenarios.folder.parent / "watch-state", 0)
    assert third == f"0 new dataset file(s) under {scenarios.folder}"
    assert len(landed_events(scenarios.folder_file)) == 1
    assert len(runs_of("grpo-pipeline/on-new-data", dataset_uri=scenarios.folder_file)) == 1


@pytest.mark.slow
def test_file_put_in_a_bucket_runs_once(stack, scenarios):
    assert (
        scenarios.bucket_looks[0].startswith("0 new dataset file(s)")
        and "1 waiting to settle" in scenarios.bucket_looks[0]
    )
    assert scenarios.bucket_looks[1].startswith("1 new dataset file(s)")
    [flow_run] = wait_for_run("grpo-pipeline/on-new-data", dataset_uri=scenarios.bucket_file)
    flow_run = wait_final(flow_run.id)
    assert flow_run.state.is_completed(), flow_run.state

    # The job folder was uploaded to the spec's s3:// output_uri.
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    [job] = fs.ls(f"{scenarios.bucket}/runs")
    metrics = [json.loads(line) for line in fs.cat(f"{job}/metrics.jsonl").decode().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert yaml.safe_load(fs.cat(f"{job}/spec.yaml"))["dataset"]["uri"] == scenarios.bucket_file
    events = [json.loads(line)["event"] for line in fs.cat(f"{job}/events.jsonl").decode().splitlines()]
    assert events[-1] == "grpoflow.job.completed"
    assert fs.exists(f"{job}/merged/model.safetensors")

    third = watcher_look(scenarios.bucket_prefix, scenarios.bucket_spec, scenarios.folder.parent / "watch-state", 0)
    assert third == f"0 new dataset file(s) under {scenarios.bucket_prefix}"
    assert len(landed_events(scenarios.bucket_file)) == 1
    assert len(runs_of("grpo-pipeline/on-new-data", dataset_uri=scenarios.bucket_file)) == 1


@pytest.mark.slow
def test_nightly_schedule(stack):
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("grpo-pipeline/nightly")
        upcoming = client.read_flow_runs(deployment_filter=DeploymentFilter(id={"any_": [nightly.id]}))
    [schedule] = nightly.schedules
    assert schedule.active and schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "UTC"
    assert nightly.parameters == {"spec": "deployments/nightly.yaml"}
    assert upcoming and all(r.state.is_scheduled() for r in upcoming)
    assert {(r.expected_start_time.hour, r.expected_start_time.minute) for r in upcoming} == {(2, 0)}


# --- what a Prefect user meets: the watcher's first look, the form as it opens, run names, cancelling ------------


@pytest.mark.slow
def test_the_watcher_looks_when_deployed(stack):
    """`deployments apply` starts the watcher's first look now: its hourly schedule, anchored at deploy time, would
    make the first one an hour later."""
    # Prefect's scheduler may have added the schedule's own runs by then: an hour apart, from an hour after deploy.
    [first] = [r for r in stack.first_watch_runs if (r.expected_start_time - stack.applied_at).total_seconds() < 60]
    assert first.state.is_scheduled()
    assert f"watcher watch-new-data/watch: first look now (flow run {first.name})" in stack.applied


@pytest.mark.slow
def test_the_form_as_it_opens_runs(stack):
    """Deployments > retrain > Run, submitted as the form opens: the deployment's example spec with every default
    of the schema filled in (tests/prefect_form.py) runs to completion, named after its job."""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("grpo-pipeline/retrain")
        parameters = form_parameters(deployment.parameter_openapi_schema, deployment.parameters)
        assert parameters["spec"]["hyperparameters"]["use_unsloth"] is False  # the form's own defaults are in
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
    flow_run = wait_final(flow_run.id)
    job = PROJECT_DIR / "runs" / flow_run.name  # the example spec's output_uri, relative to the project
    try:
        assert flow_run.state.is_completed(), flow_run.state
        assert flow_run.name.startswith("retrain-example-") and (job / "evaluation.json").is_file()
    finally:
        shutil.rmtree(job, ignore_errors=True)


@pytest.mark.slow
def test_every_run_is_named_after_its_job(stack, scenarios, tmp_path):
    """Runs of retrain, on-new-data (an event, a dropped file, a bucket) and nightly are named after their job id
    once the job exists, a submitted one from the start; the watcher's runs after what they watch."""
    dataset = str(write_jsonl(tmp_path / "nightly.jsonl", arithmetic_rows(12)))
    (tmp_path / "nightly.yaml").write_text(yaml.safe_dump(small_spec("nightly", dataset, str(tmp_path / "runs"))))
    with get_client(sync_client=True) as client:
        nightly = client.create_flow_run_from_deployment(
            deployment_id("grpo-pipeline/nightly"), parameters={"spec": str(tmp_path / "nightly.yaml")}
        )
    runs = {
        "retrain": (scenarios.retrain_run_id, scenarios.retrain_root),
        "event": (wait_for_run("grpo-pipeline/on-new-data", dataset_uri=scenarios.event_dataset)[0].id,
                  scenarios.event_root),
        "folder": (wait_for_run("grpo-pipeline/on-new-data", dataset_uri=scenarios.folder_file)[0].id,
                   Path(scenarios.folder_spec).parent.parent / "runs-folder"),
        "nightly": (nightly.id, tmp_path / "runs"),
    }  # fmt: skip
    for name, (run_id, root) in runs.items():
        flow_run = wait_final(run_id)
        assert flow_run.state.is_completed(), (name, flow_run.state)
        assert flow_run.name == only_job(root).name, name
        assert ("-new-data-" in flow_run.name) == (name in ("event", "folder")), name  # what started it
    assert scenarios.retrain_run_name == only_job(scenarios.retrain_root).name
    [bucket_run] = wait_for_run("grpo-pipeline/on-new-data", dataset_uri=scenarios.bucket_file)
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    assert wait_final(bucket_run.id).name == fs.ls(f"{scenarios.bucket}/runs")[0].rsplit("/", 1)[-1]
    # a scheduled run keeps the server's random name until it starts: only finished runs count
    watchers = [r for name in ("watch", "look") for r in runs_of(f"watch-new-data/{name}") if r.state.is_final()]
    assert watchers and all(r.name.startswith("watch-incoming-") for r in watchers), watchers


@pytest.mark.slow
def test_cancel_from_the_ui(stack, tmp_path):
    """Cancel, as the UI's button does it (the flow run set Cancelling) while GRPO trains: training stops, no
    process of the run is left, and the flow run and the train task end Cancelled, not Crashed. The run is Cancelled
    within seconds of its processes ending: it stayed Cancelling 25-45 s more (here: gone after 8 s, Cancelled after
    41 s) while the worker imported the flow again in a new process to run on_cancellation hooks it has none of."""
    spec = small_spec("cancel-me", str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))), str(tmp_path / "runs"))
    spec["hyperparameters"]["max_steps"] = 400  # 0.5 s a step (the stack's stand-in request for this job)
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(
            deployment_id("grpo-pipeline/retrain"), parameters={"spec": spec}
        )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (metrics := list(tmp_path.glob("runs/*/metrics.jsonl"))) or not metrics[0].read_text():
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        job = metrics[0].parent
        running = client.read_flow_run(flow_run.id)
        processes = [p for p in psutil.process_iter(["cmdline"]) if str(job) in " ".join(p.info["cmdline"] or [])]
        flow_process = psutil.Process(int(running.infrastructure_pid.rsplit(":", 1)[-1]))
        assert processes, "no training child found"
        cancelled_at = time.monotonic()
        client.set_flow_run_state(flow_run.id, Cancelling(message="cancelled from the UI"))
        # The run's processes end and its state turns Cancelled within seconds of each other (it stayed Cancelling
        # 25-45 s after the processes had gone).
        gone_at = None
        while not (state := client.read_flow_run(flow_run.id).state).is_final():
            if gone_at is None and not [p for p in (*processes, flow_process) if p.is_running()]:
                gone_at = time.monotonic()
            assert time.monotonic() - cancelled_at < 120, f"still {state.name} 120 s after the cancel"
            time.sleep(0.2)
    done_at = time.monotonic()
    _, alive = psutil.wait_procs([*processes, flow_process], timeout=30)
    assert alive == [], alive  # no process of the run is left
    gone_at = gone_at or time.monotonic()
    flow_run = wait_final(flow_run.id, timeout=10)
    assert flow_run.state.is_cancelled(), flow_run.state
    took = f"processes gone {gone_at - cancelled_at:.1f} s, Cancelled {done_at - cancelled_at:.1f} s after the cancel"
    print(f"cancel: {took}")
    assert done_at - gone_at < 15, took
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [flow_run.id]}))
    states = {t.name.rsplit("-", 1)[0]: t.state.type.value for t in tasks}
    assert states["train"] == "CANCELLED" and "CRASHED" not in states.values(), states
    steps = [r["step"] for r in read_metrics(job / "metrics.jsonl")]
    assert steps and steps[-1] < 400
    ends = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    assert ends[-1]["event"] == "grpoflow.job.failed" and ends[-1]["payload"]["reason"] == "cancelled"


# --- a person's approval (evaluation.gate.approval) ------------------------------------------------------------


def wait_paused(flow_run_id, timeout: float = RUN_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while not (flow_run := client.read_flow_run(flow_run_id)).state.is_paused():
            assert not flow_run.state.is_final(), flow_run.state
            assert time.monotonic() < deadline, f"flow run {flow_run.name} never paused"
            time.sleep(0.5)
    return flow_run


def artifact_keys(flow_run_id) -> set[str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key for a in artifacts if a.key}


def approval_spec(name: str, tmp_path: Path, **gate) -> dict:
    tmp_path.mkdir(exist_ok=True)
    spec = small_spec(name, str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))), str(tmp_path / "runs"), 2)
    # No minimum gain: the stand-in's model scores as its start did, which the default gate (min_gain 0) keeps back
    # before anyone is asked.
    spec["evaluation"]["gate"] = {"approval": True, "min_gain": None, **gate}
    spec["deploy"] = {"name": name}
    return spec


@pytest.mark.slow
def test_approval_approved_deploys(stack, tmp_path):
    """A deployment run pauses after the evaluation, its report, scores and held-out completions already shown; the
    UI's Resume form (approve, note) approves it, and the model is deployed as its spec says."""
    from prefect.flow_runs import resume_flow_run

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(
            deployment_id("grpo-pipeline/retrain"), parameters={"spec": approval_spec("approve-me", tmp_path)}
        )
    paused = wait_paused(flow_run.id)
    kinds = {key.rsplit("-", 1)[-1] for key in artifact_keys(flow_run.id)}
    assert {"report", "evaluation", "samples"} <= kinds, kinds
    with temporary_settings({PREFECT_API_URL: stack.api_url}):
        resume_flow_run(paused.id, run_input={"approve": True, "note": "reads fine"})
    flow_run = wait_final(flow_run.id)
    assert flow_run.state.is_completed(), flow_run.state
    job = only_job(tmp_path / "runs")
    gate = json.loads((job / "gate.json").read_text())
    assert gate["promote"] and gate["approval"] == {"approve": True, "note": "reads fine", "reason": "approved"}
    assert "not promoted" not in flow_run.state.message
    events = [json.loads(line)["event"] for line in (job / "events.jsonl").read_text().splitlines()]
    assert "grpoflow.deployment.registered" in events and "grpoflow.model.rejected" not in events


@pytest.mark.slow
def test_approval_rejected_or_timed_out_from_grpoflow_run(stack, tmp_path):
    """`grpoflow run` against the server: rejected with a note, then (another job) no decision before the timeout;
    each ends completed, not deployed, with grpoflow.model.rejected (reason and note) delivered to the webhook."""
    from prefect.flow_runs import resume_flow_run

    received = []

    class Receiver(_Receiver):
        requests = received

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = [{"url": f"http://127.0.0.1:{server.server_port}/hook"}]
    try:
        specs = {
            "reject": approval_spec("reject-me", tmp_path / "a"),
            "timeout": approval_spec("late-decision", tmp_path / "b"),
        }
        specs["timeout"]["evaluation"]["gate"]["approval_timeout_hours"] = 0.002  # 7 s
        procs = {}
        for kind, spec in specs.items():
            (tmp_path / f"{kind}.yaml").write_text(yaml.safe_dump({**spec, "webhooks": hook}))
            command = [sys.executable, "-m", "grpoflow.flows.cli", "run", str(tmp_path / f"{kind}.yaml")]
            procs[kind] = subprocess.Popen(command, env=stack.env, cwd=tmp_path, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True)  # fmt: skip
        [run] = wait_for_run_named("reject-me")
        wait_paused(run.id)
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            resume_flow_run(run.id, run_input={"approve": False, "note": "answers padded with text"})
        said = {}
        for kind, proc in procs.items():
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            assert proc.returncode == 0, (kind, err[-3000:])
            said[kind] = out + err
        assert "not promoted (not published, not deployed): rejected by a person: answers padded" in said["reject"]
        assert "model not promoted (not published, not deployed): no decision within 0.002 h" in said["timeout"]
        for kind, reason, note in (("reject", "rejected", "answers padded with text"), ("timeout", "timeout", "")):
            job = only_job(Path(specs[kind]["output_uri"]))
            gate = json.loads((job / "gate.json").read_text())
            assert not gate["promote"] and gate["approval"] == {"approve": False, "note": note, "reason": reason}
            events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
            [rejected] = [e for e in events if e["event"] == "grpoflow.model.rejected"]
            assert rejected["payload"]["reason"] == reason and rejected["payload"]["note"] == note
            assert "grpoflow.deployment.registered" not in [e["event"] for e in events]
            assert events[-1]["event"] == "grpoflow.job.completed"
            delivered = [json.loads(body) for _, body in received]
            assert {"type": "model.rejected", "reason": reason} in [
                {"type": d["type"], "reason": d["data"].get("reason")} for d in delivered
            ]
        # The timed-out run never passed through Failed (an automation on Failed fired for it, then it completed).
        [late] = wait_for_run_named("late-decision")
        with get_client(sync_client=True) as client:
            history = [s.type.value for s in client.read_flow_run_states(late.id)]
        assert "PAUSED" in history and "FAILED" not in history and history[-1] == "COMPLETED", history
    finally:
        server.shutdown()


def wait_for_run_named(prefix: str, timeout: float = RUN_TIMEOUT_S) -> list:
    """The runs whose names start with `prefix` (Prefect's `like_` matches anywhere in a name: "late" is in another
    test's generated "chocolate-...")."""
    from prefect.client.schemas.filters import FlowRunFilterName

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=prefix)))
            if runs := [run for run in runs if run.name.startswith(prefix)]:
                return runs
            assert time.monotonic() < deadline, f"no flow run named {prefix}..."
            time.sleep(0.5)


# --- secrets: the worker's environment stays out of every file the run touches -----------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.requests.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def new_since(path: Path, since: float) -> bool:
    """Whether `path` (a file, or a folder whose entries changed) changed since `since`; pytest's own folder
    (every test's tmp_path, this one's among the roots already) is not."""
    try:
        return not path.name.startswith("pytest-of-") and path.lstat().st_mtime >= since
    except OSError:  # gone meanwhile
        return False


def files_holding(roots: list[Path], needles: list[str], since: float) -> list[str]:
    """Every file under `roots` written since `since` that holds one of `needles` (unreadable ones skipped)."""
    found = []
    for root in roots:
        paths = [root] if root.is_file() else []
        for folder, _, names in os.walk(root):  # folders vanishing under the walk (other runs' temp) are skipped
            paths += [Path(folder) / name for name in names]
        for path in paths:
            try:
                if path.is_symlink() or not path.is_file() or path.stat().st_mtime < since:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


@pytest.mark.slow
def test_worker_secrets_stay_out_of_files(stack, tmp_path):
    """`grpoflow submit` through the worker, whose environment holds HF_TOKEN and the webhook secret: the flow run
    resolves the secret there (its deliveries verify), and after the run no file under the worker's temp folder (its
    TMPDIR; Prefect's prefect-workspace-attempt-* folders included), what appeared in /tmp meanwhile, the job folder,
    PREFECT_HOME or the worker's folder holds either.

    While the run lasts, Prefect's own `workspace.json` (mode 0600, removed at the run's end) does hold the worker's
    environment, secrets included (README, Webhooks: keep them in Secret blocks to avoid even that); the test notes
    it, and asserts that nothing is left."""
    since = time.time() - 1
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hook = {"url": f"http://127.0.0.1:{server.server_port}/hook", "secret_env": CANARY_SECRET_ENV}
        # With the held-out evaluation: its files are searched too.
        spec = small_spec(
            "secrets", str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))), str(tmp_path / "runs"), 2
        )
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec | {"webhooks": [hook]}))
        submitted = stack.cli("grpoflow", "submit", tmp_path / "spec.yaml", "--json")
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout)["flow_run_id"]
        canaries = [CANARY_HF_TOKEN, CANARY_WEBHOOK_SECRET]
        workspaces = Path(stack.env["TMPDIR"])
        seen_in_workspace = set()
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not (state := client.read_flow_run(run_id).state) or not state.is_final():
                for manifest in workspaces.glob("prefect-workspace-attempt-*/workspace.json"):
                    with contextlib.suppress(OSError):
                        seen_in_workspace |= {c for c in canaries if c in manifest.read_text()}
                assert time.monotonic() < deadline, "the submitted run did not end"
                time.sleep(0.5)
        assert state.is_completed(), state.message
        print(f"while the run lasted, Prefect's workspace.json held: {sorted(seen_in_workspace) or 'nothing'}")

        key = "whsec_" + base64.b64encode(CANARY_WEBHOOK_SECRET.encode()).decode()  # a plain secret's UTF-8 bytes
        assert _Receiver.requests, "no webhook delivery"
        for headers, body in _Receiver.requests:
            Webhook(key).verify(body, {k.lower(): v for k, v in headers.items()})  # raises on a bad signature

        project = [p for p in PROJECT_DIR.iterdir() if p.name not in (".venv", ".git")]
        # and whatever appeared at the system temp folder's top level since, where a path written as /tmp/... would
        # land (a file written into one of its older subfolders is not read)
        shared_tmp = [p for p in Path(tempfile.gettempdir()).iterdir() if new_since(p, since)]
        roots = [tmp_path, stack.tmp, Path(stack.env["PREFECT_HOME"]), *project, *shared_tmp]  # stack.tmp: TMPDIR
        # Prefect's workspaces (this run's and the other tests' runs, which may still be ending) are removed after
        # the runs' final states are set: wait for that, bounded.
        deadline = time.monotonic() + 120
        while (left := files_holding(roots, canaries, since)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == []
        with get_client(sync_client=True) as client:  # nor the server's records of the run and its deployment
            flow_run = client.read_flow_run(run_id)
            deployment = client.read_deployment(flow_run.deployment_id)
        stored = flow_run.model_dump_json() + deployment.model_dump_json()
        # nor any block: on open-source Prefect anyone who reaches the API reads every block's secrets in plain text
        blocks = httpx.post(f"{stack.api_url}/block_documents/filter", json={"include_secrets": True}).text
        assert not [c for c in canaries if c in stored or c in blocks]
    finally:
        server.shutdown()


@pytest.mark.slow
def test_prefect_deployment_run_refuses_credentials(stack):
    """`prefect deployment run grpo-pipeline/retrain --params` with a spec whose output_uri holds a key and secret:
    the server refuses the run with the deployed schema (enforced), saying what to do without the secret."""
    secret = "sEcReTcLi789"
    spec = small_spec("creds-cli", "d.jsonl", f"s3://AKIAEXAMPLE:{secret}@bucket/runs")
    refused = stack.cli(
        "prefect", "deployment", "run", "grpo-pipeline/retrain", "--params", json.dumps({"spec": spec})
    )
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1 and "Validation failed for field 'spec.output_uri'" in said, said
    assert "user:password@" in said and secret not in said
    assert runs_of("grpo-pipeline/retrain", spec=spec) == []
    with get_client(sync_client=True) as client:
        assert client.read_deployment_by_name("grpo-pipeline/retrain").enforce_parameter_schema


# --- mistakes named where they are made: at run creation, or Rejected (issue 39) -----------------------------------


def retrain_form(name: str = "grpo-pipeline/retrain") -> tuple:
    """The retrain deployment (or deployment `name`) and what its launch form submits as it opens."""
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(name)
    return deployment, form_parameters(deployment.parameter_openapi_schema, deployment.parameters)


@pytest.mark.slow
def test_the_form_refuses_a_misspelt_builtin_reward_at_creation(stack):
    """The retrain form with its reward's name typed `exact_answr` (the name field also takes a custom function's
    label): the form's own check and the server refuse it when the run is created, naming the field and the
    built-ins; no run is stored to wait in the queue and fail. With a function beside it, a label is any name."""
    deployment, parameters = retrain_form()
    assert parameters["spec"]["rewards"][0]["function"] is None  # the form sends the entry's every field
    parameters["spec"]["rewards"][0]["name"] = "exact_answr"
    checked = httpx.post(
        f"{stack.api_url}/ui/schemas/validate",
        json={"schema": deployment.parameter_openapi_schema, "values": parameters},
    ).json()
    assert checked["valid"] is False and "exact_answr" in json.dumps(checked["errors"])
    with get_client(sync_client=True) as client:
        with pytest.raises(PrefectHTTPStatusError) as refused:
            client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
    detail = refused.value.response.json()["detail"]
    assert refused.value.response.status_code == 409, detail
    assert "Validation failed for field 'spec.rewards[0].name'" in detail, detail
    assert "'exact_answr' is not one of ['answer_format', 'exact_answer'" in detail, detail
    assert runs_of("grpo-pipeline/retrain", spec=parameters["spec"]) == []
    labelled = copy.deepcopy(parameters)
    labelled["spec"]["rewards"][0]["function"] = "grpoflow.examples.rewards.arithmetic:close_answer_reward"
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=labelled)  # stored: the form's
        client.delete_flow_run(flow_run.id)  # schema lets a labelled function through


def run_logs(flow_run_id, until: str, timeout: float = 60) -> list[str]:
    """The messages the server holds for a flow run, once one of them starts with `until` (and a few seconds more,
    for what the run's process sent after it)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    deadline, seen_at = time.monotonic() + timeout, None
    while True:
        with get_client(sync_client=True) as client:
            messages = [log.message for log in client.read_logs(log_filter=flt)]
        if seen_at is None and any(m.startswith(until) for m in messages):
            seen_at = time.monotonic()
        if (seen_at is not None and time.monotonic() - seen_at > 5) or time.monotonic() > deadline:
            return messages
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo-pipeline/retrain", "grpo-sweep/sweep"])
def test_a_spec_the_schema_lets_through_ends_rejected(stack, name):
    """A rule no schema can check (two rewards of one name) submitted from a deployment's form (a job's, a sweep's):
    the run ends in a state named Rejected whose message names the problem, before any task runs, not Failed by
    Prefect's parameter check."""
    deployment, parameters = retrain_form(name)
    parameters["spec"]["rewards"].append(copy.deepcopy(parameters["spec"]["rewards"][0]))
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
    flow_run = wait_final(flow_run.id, timeout=300)
    assert flow_run.state.name == "Rejected", flow_run.state
    assert "rewards[1].name: duplicate reward name 'exact_answer'" in flow_run.state.message
    with get_client(sync_client=True) as client:
        ran = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    assert ran == []
    # The run's Logs tab: the reason, and no engine traceback after it (the flow's process sends its last logs as it
    # exits, after the final state: waited for)
    logs = run_logs(flow_run.id, until="Finished in state Rejected")
    assert any("duplicate reward name 'exact_answer'" in m for m in logs), logs
    assert [m for m in logs if "Traceback" in m] == []
    if name == "grpo-sweep/sweep":
        assert flow_run.name.startswith("sweep-example-"), flow_run.name  # named after its spec, as a sweep id


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, code, error", [("setup-problem", 2, "TrainingSetupError"), ("diverges", 4, "TrainingStopped")]
)
def test_submit_wait_exits_as_grpoflow_run_would(stack, tmp_path, name, code, error):
    """`grpoflow submit --wait` ends with the code `grpoflow run` gives the same end (2 a setup problem no retry
    fixes, 4 the health monitor's stop), not 1 for any run that did not complete: a script tells them apart."""
    spec = tmp_path / f"{name}.yaml"
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    spec.write_text(yaml.safe_dump(small_spec(name, str(data), str(tmp_path / "runs"))))
    waited = stack.cli("grpoflow", "submit", spec, "--wait")
    assert waited.returncode == code, waited.stdout + waited.stderr
    assert f": Failed (Flow run encountered an exception: {error}: " in waited.stdout
    assert ENDINGS[name]["grpo"]["message"] in waited.stdout and waited.stderr == ""


def start_hourly_watcher(parameters: dict):
    """A run of watch-new-data/watch with `parameters`, once it is running (its flow run as then read)."""
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(deployment_id("watch-new-data/watch"), parameters=parameters)
        deadline = time.monotonic() + 120
        while not (run := client.read_flow_run(run.id)).state.is_running():
            assert time.monotonic() < deadline, f"the hourly watcher's run never started: {run.state}"
            time.sleep(0.5)
    return run


@pytest.mark.slow
def test_one_look_does_not_wait_for_the_hourly_watcher(stack, tmp_path):
    """`prefect deployment run watch-new-data/look` while an hour-long `watch` run looks at the same folder: the
    look runs at once (the watcher's queue, limited to 1, would hold a second `watch` run until the first ended),
    announces the file, and the hourly run, sharing its state, does not announce it again."""
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    hourly = {"uri": str(incoming), "state_dir": state, "settle_seconds": 1, "watch_minutes": 3, "poll_seconds": 2}
    long_run = start_hourly_watcher(hourly)
    write_jsonl(incoming / "prompts.jsonl", arithmetic_rows(4))
    os.utime(incoming / "prompts.jsonl", (time.time() - 60, time.time() - 60))  # settled already
    # The way the README gave before: a one-look run of `watch` itself, which the deployment's limit holds back.
    queued = stack.cli(
        "prefect", "deployment", "run", "watch-new-data/watch", "--param", f"uri={incoming}",
        "--param", f"state_dir={state}", "--param", "watch_minutes=0",
    )  # fmt: skip
    assert queued.returncode == 0, queued.stdout + queued.stderr
    try:
        started = time.monotonic()
        ran = stack.cli(
            "prefect", "deployment", "run", "watch-new-data/look", "--param", f"uri={incoming}",
            "--param", f"state_dir={state}", "--watch", timeout=240,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stdout + ran.stderr
        [look] = runs_of("watch-new-data/look", uri=str(incoming))
        look = wait_final(look.id, timeout=60)
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(long_run.id).state.is_running()  # the look did not wait for it
        assert look.state.is_completed() and time.monotonic() - started < 180, look.state
        events = landed_events(str(incoming / "prompts.jsonl"))
        assert len(events) == 1, events
        [waiting] = [r for r in runs_of("watch-new-data/watch", uri=str(incoming)) if r.id != long_run.id]
        assert not waiting.state.is_running() and not waiting.state.is_final(), waiting.state  # still held back
    finally:
        with get_client(sync_client=True) as client:
            for flow_run in runs_of("watch-new-data/watch", uri=str(incoming)):
                client.set_flow_run_state(flow_run.id, Cancelling(), force=True)


# --- an attacker who may only start deployment runs (issue 49: the operator's policy) -------------------------------


class _Counting(http.server.BaseHTTPRequestHandler):
    """An attacker's server: counts every request and keeps its Authorization header."""

    seen: list = []

    def do_POST(self):
        type(self).seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"choices": [{"message": {"content": "1"}}]}')

    def log_message(self, *args):
        pass


def remote_code_model(folder: Path, marker: Path) -> Path:
    """A model folder whose config.json maps its architecture to its own evil.py, which writes `marker` when imported
    (transformers imports it only with trust_remote_code)."""
    folder.mkdir(parents=True)
    config = {"architectures": ["Evil"], "model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig",
              "AutoModelForCausalLM": "evil.Evil"}}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"import os\nopen({str(marker)!r}, 'w').write(str(dict(os.environ)))\n")
    return folder


@pytest.mark.slow
def test_a_deployment_run_cannot_reach_the_worker(stack, tmp_path):
    """Each way a person who may only start deployment runs reached the worker's secrets or machine, tried through
    the server and the worker as they did: remote code, a worker variable sent to their host, job variables that
    switch the policy off or replace the command, a job sized to take the machine, another job's deployment name.
    Each run ends Rejected before anything of it runs, and nothing reached them."""
    marker = tmp_path / "owned"
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    out = tmp_path / "runs"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    attacker = f"http://127.0.0.1:{server.server_address[1]}/v1"
    base = small_spec("attack", str(data), str(out))
    judge = {"name": "llm_judge", "kwargs": {"base_url": attacker, "model": "m", "rubric": "Rate {completion}",
                                             "api_key_env": "AWS_SECRET_ACCESS_KEY"}}  # fmt: skip
    # a deployment name another job registered first
    (out / "deployments").mkdir(parents=True)
    (out / "deployments" / "shared.json").write_text(json.dumps({"name": "shared", "owner": "team-a", "versions": []}))
    attacks = {
        "remote code": ({"base_model": str(remote_code_model(tmp_path / "evil", marker)),
                         "trl": {"trust_remote_code": True}}, None, "trl.trust_remote_code: runs a model's own code"),
        "key to their host": ({"rewards": [judge]}, None, "rewards[0].kwargs.api_key_env: the value of "
                              "AWS_SECRET_ACCESS_KEY may not be sent"),
        "policy off by env": ({}, {"env": {"GRPOFLOW_ALLOW_SPEC_CODE": "unsandboxed", "GRPOFLOW_POLICY": "/dev/null",
                                           "PATH": "/usr/bin"}}, "job variable 'env': this run sets it"),
        "own command": ({}, {"command": f"sh -c 'env > {marker}'"}, "job variable 'command': this run sets it"),
        "huge": ({"hyperparameters": {"max_steps": 2, "rollouts_per_prompt": 4096, "prompts_per_step": 64,
                                      "max_response_length": 100000000}}, None, "is over the limit of 64"),
        "takeover": ({"name": "team-b", "deploy": {"name": "shared"}}, None,
                     "serving name 'shared' belongs to the jobs named 'team-a'"),
    }  # fmt: skip
    runs = {}
    try:
        with get_client(sync_client=True) as client:
            retrain = client.read_deployment_by_name("grpo-pipeline/retrain")
            for what, (changes, job_variables, _) in attacks.items():
                spec = {**copy.deepcopy(base), "name": base["name"] + "-" + what.replace(" ", "-"), **changes}
                runs[what] = client.create_flow_run_from_deployment(
                    retrain.id, parameters={"spec": spec}, job_variables=job_variables
                ).id
        for what, (_, _, message) in attacks.items():
            flow_run = wait_final(runs[what], timeout=300)
            assert flow_run.state.name == "Rejected", (what, flow_run.state)
            assert message in flow_run.state.message, (what, flow_run.state.message)
        assert not marker.exists()  # no code of theirs ran, no environment of the worker's written out
        assert _Counting.seen == []  # no request reached their server, with or without the key
        assert sorted(p.name for p in out.iterdir()) == ["deployments"]  # no job folder of any of them
    finally:
        server.shutdown()


def flow_run_processes(flow_run_id) -> list[psutil.Process]:
    """The processes of a flow run (the one the worker started for it, and all it started), by the variable the
    process worker sets for it."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("PREFECT__FLOW_RUN_ID") == str(flow_run_id):
                found.append(process)
    return found


@pytest.mark.slow
def test_a_grader_flooding_its_output_costs_the_flow_nothing(stack, tmp_path):
    """A python grader that writes 256 MiB to stderr for each completion it grades, run from a deployment (the
    reward dry run at ingest calls it in the flow process, on several completions at once): the run goes on with the
    grader's own score, and no process of it holds the flood (the flow process held 2.4 GB when a sandbox's whole
    stderr was read)."""
    flood = "import sys\ndef grade(sample, item):\n    chunk = 'x' * (1 << 20)\n"
    flood += "    for _ in range(256):\n        sys.stderr.write(chunk)\n    return 1.0\n"
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    spec = small_spec("flood", str(data), str(tmp_path / "runs"))
    spec["rewards"] = [{"grader": {"type": "python", "name": "flood", "source": flood}}]
    with get_client(sync_client=True) as client:
        retrain = client.read_deployment_by_name("grpo-pipeline/retrain")
        run_id = client.create_flow_run_from_deployment(retrain.id, parameters={"spec": spec}).id
    peak, deadline = 0, time.monotonic() + 300
    with get_client(sync_client=True) as client:
        while not (state := client.read_flow_run(run_id).state).is_final():
            assert time.monotonic() < deadline, state
            for process in flow_run_processes(run_id):
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, process.memory_info().rss)
            time.sleep(0.2)
    assert state.is_completed(), state.message
    assert 0 < peak < 1_000_000_000, peak  # the flow process and the grader's, never the gigabyte


# --- a worker's death, a crashed run ------------------------------------------------------------------------------


@dataclass
class Hooks:
    """A webhook receiver on loopback: the (event id, job id) of each delivery, in order."""

    url: str
    sent: list

    def ids(self, job: Path) -> list[str]:
        return [event_id for event_id, job_id in self.sent if job_id == job.name]

    def events(self, job: Path) -> list[dict]:
        """The job's events.jsonl, once the receiver has each of its events (the deliveries end with the job)."""
        deadline = time.monotonic() + 60
        while True:
            records = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
            if set(self.ids(job)) >= {r["id"] for r in records} or time.monotonic() > deadline:
                return records
            time.sleep(0.2)


@pytest.fixture
def hooks():
    sent = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            sent.append((self.headers["webhook-id"], body["data"]["job_id"]))  # the id: the same on every resend
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Hooks(f"http://127.0.0.1:{server.server_port}/hook", sent)
    server.shutdown()


def crash_spec(name: str, tmp_path: Path, hooks: Hooks, max_steps: int) -> dict:
    spec = small_spec(name, str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))), str(tmp_path / "runs"))
    spec["hyperparameters"]["max_steps"] = max_steps
    return spec | {"checkpoint_every": 2, "webhooks": [{"url": hooks.url}]}


def assert_each_once(job: Path, hooks: Hooks, steps: int) -> list[dict]:
    """Every step in metrics.jsonl once (none before the last checkpoint redone), every event in events.jsonl once,
    and each delivered to the webhook once; returns the events."""
    assert [r["step"] for r in read_metrics(job / "metrics.jsonl")] == list(range(1, steps + 1))
    events = hooks.events(job)
    ids = [r["id"] for r in events]
    assert len(set(ids)) == len(ids) and sorted(hooks.ids(job)) == sorted(ids), (ids, hooks.ids(job))
    assert [r["event"] for r in events].count("grpoflow.job.completed") == 1
    assert "grpoflow.job.failed" not in [r["event"] for r in events]
    return events


@pytest.mark.slow
def test_a_worker_killed_mid_grpo_ends_no_run(stack, tmp_path, hooks):
    """The process worker SIGKILLed while its run trains, then a new worker started: the run, whose console went to
    the dead worker through a pipe, goes on with its training child and ends Completed, each step and event once. (It
    ended Crashed, "Execution was aborted by Python system exit call", at its first console line after the kill.)"""
    with get_client(sync_client=True) as client:  # a pool of its own, so no other test's run lands on this worker
        grpo_gpu = client.read_work_pool("grpo-gpu")
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(name="doomed", type="process",
                                                   base_job_template=grpo_gpu.base_job_template))  # fmt: skip
        retrain = client.read_deployment_by_name("grpo-pipeline/retrain")
        doomed = client.create_deployment(
            flow_id=retrain.flow_id,
            name="retrain-doomed",
            work_pool_name="doomed",
            entrypoint=retrain.entrypoint,
            path=retrain.path,
            pull_steps=retrain.pull_steps,
            parameter_openapi_schema=retrain.parameter_openapi_schema,
            tags=retrain.tags,
        )
        run = client.create_flow_run_from_deployment(doomed, parameters={"spec": crash_spec("outlive", tmp_path,
                                                                                             hooks, 10)})  # fmt: skip
    worker = start([PREFECT, "worker", "start", "--pool", "doomed"], stack.env, tmp_path / "worker.log")
    new_worker = None
    try:
        metrics = lambda: list((tmp_path / "runs").glob("outlive-*/metrics.jsonl"))  # noqa: E731
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (metrics() and len(metrics()[0].read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline and worker.poll() is None, (tmp_path / "worker.log").read_text()
            time.sleep(0.2)
        children = flow_run_processes(run.id)
        worker.kill()  # SIGKILL: the worker's end of the run's stdout and stderr pipes closes with it
        worker.wait()
        new_worker = start([PREFECT, "worker", "start", "--pool", "doomed"], stack.env, tmp_path / "worker2.log")
        assert len(children) >= 2 and all(p.is_running() for p in children)  # the flow run's process, its child
        final = wait_final(run.id)
        assert final.state.is_completed(), final.state.message
        assert final.name.startswith("outlive-") and "resume" not in final.name
        job = metrics()[0].parent
        assert_each_once(job, hooks, 10)
    finally:
        stop([worker, *([new_worker] if new_worker else [])])


def state_names(job_id: str) -> list[str]:
    return sorted(f"{r.name} {r.state.name}" for r in job_runs(job_id))


def job_runs(job_id: str) -> list:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=job_id)))
    return [r for r in runs if r.name.startswith(job_id)]


def wait_resumes(job_ids: list[str], timeout: float = RUN_TIMEOUT_S) -> dict:
    """grpo-pipeline/resume's runs, by the name of the crashed run each answered, once every run of these jobs has
    ended and each crashed one has been answered."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for job_id in job_ids for r in job_runs(job_id)]
        resumes = {
            r.parameters["flow_run"].removeprefix("prefect.flow-run."): r for r in runs_of("grpo-pipeline/resume")
        }
        crashed = {str(r.id): r.name for r in runs if r.state.is_crashed()}
        answered = {name: resumes[i] for i, name in crashed.items() if i in resumes and resumes[i].state.is_final()}
        if crashed and len(answered) == len(crashed) and all(r.state.is_final() for r in runs):
            return answered
        assert time.monotonic() < deadline, ([(r.name, r.state.name) for r in runs], list(resumes))
        time.sleep(1)


@pytest.mark.slow
def test_a_crashed_run_is_resumed_within_the_bound(stack, tmp_path, hooks):
    """A run killed with its training child after GRPO's checkpoint-2, as when its machine is lost, ends Crashed;
    grpo-pipeline/resume then resumes its job from that checkpoint as `<job id>-resume-1`, which completes with no
    step before the checkpoint redone, `grpoflow.job.resumed` and every event once. A job whose every run is killed
    is resumed GRPOFLOW_AUTO_RESUME times (1 in this stack) and then left Crashed, the resume's log saying why."""
    runs = {}
    with get_client(sync_client=True) as client:
        retrain = client.read_deployment_by_name("grpo-pipeline/retrain")
        for name in ("crash-once", "crash-always"):
            (tmp_path / name).mkdir()
            spec = crash_spec(name, tmp_path / name, hooks, 4)
            runs[name] = client.create_flow_run_from_deployment(retrain.id, parameters={"spec": spec})
    job_ids = {name: job_id_of(run.id, name) for name, run in runs.items()}
    answered = wait_resumes(list(job_ids.values()))

    once = job_ids["crash-once"]
    assert state_names(once) == [f"{once} Crashed", f"{once}-resume-1 Completed"]
    assert answered[once].state.name == "Completed"
    assert answered[once].state.message.startswith(f"job {once} resumed as {once}-resume-1 (1 of 1)")
    events = assert_each_once(tmp_path / "crash-once" / "runs" / once, hooks, 4)
    [resumed] = [r for r in events if r["event"] == "grpoflow.job.resumed"]
    assert resumed["payload"] == {"resume": 1, "max_resumes": 1, "checkpoint": "checkpoint-2"}

    always = job_ids["crash-always"]
    assert state_names(always) == [f"{always} Crashed", f"{always}-resume-1 Crashed"]
    assert answered[f"{always}-resume-1"].state.name == "ResumeLimit"
    message = answered[f"{always}-resume-1"].state.message
    assert f"job {always} crashed again" in message and "GRPOFLOW_AUTO_RESUME=1" in message
    assert f"--resume {always}" in message
    # and the job ends failed, as nothing else would say (events.jsonl, its webhook, once each)
    job = tmp_path / "crash-always" / "runs" / always
    events = hooks.events(job)
    ids = [r["id"] for r in events]
    assert len(set(ids)) == len(ids) and sorted(hooks.ids(job)) == sorted(ids), (ids, hooks.ids(job))
    [failed] = [r["payload"] for r in events if r["event"] == "grpoflow.job.failed"]
    assert failed["reason"] == "crashed" and failed["error"] == message


def job_id_of(flow_run_id, name: str) -> str:
    """The job id a run of retrain for the spec `name` takes: its name, once its flow has started."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with get_client(sync_client=True) as client:
        while not (run := client.read_flow_run(flow_run_id)).name.startswith(f"{name}-"):
            assert time.monotonic() < deadline, run.state
            time.sleep(0.5)
    return run.name


# --- the platform around a run (issue 51) --------------------------------------------------------------------------


def settled_file(path: Path) -> Path:
    write_jsonl(path, arithmetic_rows(4))
    os.utime(path, (time.time() - 60, time.time() - 60))  # settled already
    return path


def wait_landed(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(landed_events(str(path))) != 1:
        assert time.monotonic() < deadline, f"{path.name} not announced after {timeout} s"
        time.sleep(1)


@pytest.mark.slow
def test_the_watcher_outlives_a_server_restart(stack, tmp_path):
    """The hourly watcher's run while the Prefect server is stopped and started again (same port, same database):
    the run goes on, and announces the file dropped while the server was down and the one dropped after, once each.
    It ended Crashed ("Concurrency lease renewal failed"): the deployment's concurrency_limit made Prefect hold a lease
    for the run, renewed every 225 s, which the restarted server (its leases live in memory) no longer knew. The
    hourly runs are now kept one at a time by their work queue's limit, which holds no lease."""
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    hourly = {"uri": str(incoming), "state_dir": state, "settle_seconds": 1, "watch_minutes": 10, "poll_seconds": 1}
    run = start_hourly_watcher(hourly)
    assert run.state.state_details.deployment_concurrency_lease_id is None  # nothing the server can forget
    try:
        wait_landed(settled_file(incoming / "before.jsonl"))
        stack.stop_server()
        settled_file(incoming / "during.jsonl")
        time.sleep(3)  # a few looks while the server is down
        stack.start_server()
        wait_landed(settled_file(incoming / "after.jsonl"))
        wait_landed(incoming / "during.jsonl")
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(run.id).state.is_running()
        assert [len(landed_events(str(incoming / f))) for f in ("before.jsonl", "during.jsonl")] == [1, 1]
    finally:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)


# --- many submissions at once, and a team's server on PostgreSQL --------------------------------------------------


@contextlib.contextmanager
def training_paused():
    """The pool's `training` queue paused for the block: what is submitted meanwhile stays scheduled."""
    with get_client(sync_client=True) as client:
        queue = client.read_work_queue_by_name("training", work_pool_name="grpo-gpu")
        client.update_work_queue(queue.id, is_paused=True)
        try:
            yield
        finally:
            client.update_work_queue(queue.id, is_paused=False)


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """A real Prefect server (SQLite, as `prefect server start` makes it) with grpoflow's deployments, no worker:
    what is submitted stays scheduled. Not the module's `stack`: its worker asks every second (the tests' setting,
    Prefect's default is 10 s) and its runs write meanwhile, and on that SQLite one of 16 submissions at once has
    found the server still locked after Prefect's five retries."""
    tmp = tmp_path_factory.mktemp("applied")
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env = {**os.environ, "PREFECT_HOME": prefect_home(tmp / "prefect-home"), "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # fmt: skip
    server = start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", api_url.split(":")[2][:-4]], env,
                   tmp / "server.log")  # fmt: skip
    try:
        wait_healthy(api_url, server)
        stack = Stack(env, api_url, tmp)
        done = stack.cli("grpoflow", "deployments", "apply")
        assert done.returncode == 0, done.stdout + done.stderr
        yield stack
    finally:
        stop([server])


SUBMISSIONS = 16


@pytest.mark.slow
@pytest.mark.parametrize("server", ["applied", "pg_stack"])  # SQLite, as `prefect server start` makes it; PostgreSQL
def test_submissions_at_once_all_become_runs(request, server, tmp_path):
    """`grpoflow submit` SUBMISSIONS times at once: every one exits 0, and the server holds that many runs, on either
    database. On SQLite the writes meet "database is locked" (a 503, which Prefect's client retries). The pool's
    training queue is paused meanwhile (the PostgreSQL stack has a worker), and the runs are deleted after."""
    stack, name = request.getfixturevalue(server), f"many-{server.replace('_', '-')}"
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    spec = tmp_path / "many.yaml"
    spec.write_text(yaml.safe_dump(small_spec(name, str(data), str(tmp_path / "runs"))))
    # Without the preflight (model and dataset checks, seconds of CPU each): what is tested is the server's writes.
    command = [sys.executable, "-m", "grpoflow.flows.cli", "submit", str(spec), "--json", "--no-preflight"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with temporary_settings({PREFECT_API_URL: stack.api_url}), training_paused():
        procs = [subprocess.Popen(command, env=stack.env, cwd=PROJECT_DIR, **pipes) for _ in range(SUBMISSIONS)]
        ended = [p.communicate(timeout=600) for p in procs]
        runs = [r for r in runs_of("grpo-pipeline/retrain") if (r.parameters["spec"] or {}).get("name") == name]
        with get_client(sync_client=True) as client:
            for flow_run in runs:  # none is to train: the queue is resumed without them
                client.delete_flow_run(flow_run.id)
    assert [p.returncode for p in procs] == [0] * SUBMISSIONS, [err for _, err in ended if err]
    submitted = {json.loads(out)["flow_run_id"] for out, _ in ended}
    assert len(submitted) == SUBMISSIONS and {str(r.id) for r in runs} == submitted
    assert all(r.state.is_scheduled() for r in runs)  # the paused queue kept them from the worker


@pytest.mark.slow
def test_a_run_completes_on_postgresql(pg_stack, tmp_path):
    """A job submitted to a team's server on PostgreSQL runs end to end on its worker (the stand-in child): `grpoflow
    submit --wait` exits 0 with the run Completed, and the job folder holds its steps and its completed event."""
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    spec = tmp_path / "team.yaml"
    spec.write_text(yaml.safe_dump(small_spec("team", str(data), str(tmp_path / "runs"))))
    # Without the preflight (model and dataset checks, seconds of CPU): the worker's run checks the same
    waited = pg_stack.cli("grpoflow", "submit", spec, "--wait", "--no-preflight", timeout=RUN_TIMEOUT_S)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert waited.stdout.splitlines()[-1].startswith("flow run team-") and ": Completed (" in waited.stdout
    assert_trained(only_job(tmp_path / "runs"), str(data))
