"""`grpoflow api` on loopback, as a team uses it: a real Prefect server with grpoflow's deployments and a process
worker (the stand-in training child), `grpoflow api keys add` for two teams, and `grpoflow api` started as a command;
then OpenAI's own client uploads a file and runs a reinforcement fine-tuning job to `succeeded`, Veri's API (httpx2 and
`grpoflow.client.Client`) reads the same job's metrics and model, a bad job is one 400 naming every problem and creates
nothing, a missing or wrong key is 401, another team sees none of it (404 for every id, never listed), and a job is
cancelled. Every process the test starts is stopped, with its children, at the end.
"""

import contextlib
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2
import openai
import pytest
import yaml
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from grpoflow.client import ApiError, Client
from grpoflow.flows.deployments import PROJECT_DIR
from tests.conftest import arithmetic_rows, standin_env, write_jsonl
from tests.flows.test_deployments import PREFECT, free_port, start, stop, wait_healthy
from tests.integrations.test_webhooks import SECRET_ENV, WHSEC, Receiver
from tests.postgres_server import chosen_database
from tests.prefect_home import prefect_home

RFT_ROWS = PROJECT_DIR / "examples" / "openai-rft" / "train.jsonl"
RFT_GUIDE = PROJECT_DIR / "docs" / "guides" / "from-openai-rft.md"
GRADER = {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
          "reference": "{{ item.reference_answer }}", "operation": "eq"}  # fmt: skip
pytestmark = pytest.mark.slow


@dataclass
class Api:
    url: str  # http://127.0.0.1:PORT
    keys: dict  # team -> key
    keys_file: Path
    out: Path
    prefect_url: str
    hooks: Receiver  # team a's webhook (the policy's teams.a.webhooks)

    def openai(self, team: str = "a", key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.keys[team], max_retries=0)

    def http(self, team: str | None = "a") -> httpx2.Client:
        headers = {"Authorization": f"Bearer {self.keys[team]}"} if team else {}
        return httpx2.Client(base_url=self.url, headers=headers, timeout=30)

    def flow_runs(self) -> int:
        with temporary_settings({PREFECT_API_URL: self.prefect_url}), get_client(sync_client=True) as client:
            return len(client.read_flow_runs())


def write_policy(path: Path, hook_url: str) -> Path:
    """The tests' policy (tests/conftest.py) with two teams; team a has a webhook, team b's runs may take 5 steps at
    most."""
    policy = yaml.safe_load(Path(os.environ["GRPOFLOW_POLICY"]).read_text())
    policy["teams"] = {"a": {"webhooks": [{"url": hook_url, "secret_env": SECRET_ENV}]},
                       "b": {"limits": {"max_steps": 5}}}  # fmt: skip
    path.write_text(yaml.safe_dump(policy))
    return path


def grpoflow(*argv, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "grpoflow.flows.cli", *map(str, argv)]
    return subprocess.run(command, env=env, cwd=PROJECT_DIR, capture_output=True, text=True, timeout=300)


def wait_api(url: str, key: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "grpoflow api exited"
        try:
            if httpx2.get(f"{url}/v1/files", headers={"Authorization": f"Bearer {key}"}).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"grpoflow api did not answer at {url}")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    prefect_url = f"http://127.0.0.1:{free_port()}/api"
    hooks = Receiver()
    database = contextlib.ExitStack()  # SQLite in its PREFECT_HOME; PostgreSQL under `make test-postgres`
    env = {
        **os.environ,
        **standin_env(),
        **database.enter_context(chosen_database()),
        "PREFECT_HOME": prefect_home(tmp / "prefect-home"),  # its database migrated
        "PREFECT_API_URL": prefect_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "GRPOFLOW_POLICY": str(write_policy(tmp / "policy.yaml", hooks.url)),
        SECRET_ENV: WHSEC,
        # The job the cancel test stops would train for 100 s.
        "GRPOFLOW_STANDIN": json.dumps({"jobs": {"cancel-me": {"step_seconds": 1}}}),
    }
    procs = []
    try:
        server = start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", prefect_url.split(":")[2][:-4]],
                       env, tmp / "server.log")  # fmt: skip
        procs.append(server)
        wait_healthy(prefect_url, server)
        applied = grpoflow("deployments", "apply", env=env)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        with temporary_settings({PREFECT_API_URL: prefect_url}), get_client(sync_client=True) as client:
            watch = client.read_deployment_by_name("watch-new-data/watch")
            client.pause_deployment(watch.id)
            for flow_run in client.read_flow_runs():  # the watcher's first look, which apply started
                client.delete_flow_run(flow_run.id)
        procs.append(start([PREFECT, "worker", "start", "--pool", "grpo-gpu"], env, tmp / "worker.log"))
        keys_file, keys = tmp / "keys" / "api-keys.yaml", {}
        for team in ("a", "b"):
            made = grpoflow("api", "keys", "add", "--team", team, "--name", "ci", "--keys", keys_file, env=env)
            assert made.returncode == 0, made.stderr
            keys[team] = made.stdout.strip()
        url = f"http://127.0.0.1:{free_port()}"
        command = [sys.executable, "-m", "grpoflow.flows.cli", "api", "--port", url.rsplit(":", 1)[1], "--keys",
                   keys_file, "--output-uri", tmp / "out", "--project", PROJECT_DIR]  # fmt: skip
        procs.append(start([str(c) for c in command], env, tmp / "api.log"))
        wait_api(url, keys["a"], procs[-1])
        yield Api(url, keys, keys_file, tmp / "out", prefect_url, hooks)
    finally:
        stop(procs)
        hooks.stop()
        database.close()


@pytest.fixture(scope="module")
def finished(api) -> FineTuningJob:
    """An OpenAI reinforcement fine-tuning job of team a, run to its end with OpenAI's client."""
    client = api.openai()
    with RFT_ROWS.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="fine-tune")
    assert client.files.retrieve(uploaded.id).bytes == RFT_ROWS.stat().st_size
    hyperparameters = {"n_epochs": 1, "batch_size": 16, "rollouts_per_prompt": 2, "max_response_length": 4}
    job = client.fine_tuning.jobs.create(
        model="builtin:tiny",
        training_file=uploaded.id,
        suffix="words",
        seed=7,
        method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": hyperparameters}},
    )
    assert isinstance(job, FineTuningJob) and job.status in ("queued", "running")
    deadline = time.monotonic() + 400
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job.status
        time.sleep(1)
    return job


# --- keys --------------------------------------------------------------------------------------------------------


def test_the_keys_file_holds_only_digests(api):
    text = api.keys_file.read_text()
    records = yaml.safe_load(text)["keys"]
    assert [(r["team"], r["name"]) for r in records] == [("a", "ci"), ("b", "ci")]
    assert [r["sha256"] for r in records] == [hashlib.sha256(api.keys[t].encode()).hexdigest() for t in "ab"]
    assert all(key not in text for key in api.keys.values()) and all(k.startswith("gf-") for k in api.keys.values())
    assert stat.S_IMODE(api.keys_file.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no key
        {"Authorization": "Bearer gf-not-a-key"},  # a key the file lacks
        {"Authorization": "Basic YTpi"},  # another scheme
    ],
)
def test_a_request_without_a_known_key_is_401(api, headers):
    for method, path in (("GET", "/v1/training_jobs"), ("POST", "/v1/fine_tuning/jobs"), ("GET", "/v1/files/x")):
        response = httpx2.request(method, f"{api.url}{path}", headers=headers, json={})
        assert response.status_code == 401, (path, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_client_sees_a_wrong_key_as_its_authentication_error(api):
    with pytest.raises(openai.AuthenticationError):
        api.openai(key="gf-wrong").fine_tuning.jobs.list()


# --- a job, through OpenAI's client and Veri's API ---------------------------------------------------------------


def test_an_openai_job_runs_to_succeeded(api, finished):
    assert finished.status == "succeeded", finished.error
    assert finished.fine_tuned_model == f"ft:builtin:tiny:a:words:{finished.id}"
    assert finished.finished_at >= finished.created_at and finished.seed == 7 and finished.model == "builtin:tiny"
    assert finished.method.type == "reinforcement" and finished.method.reinforcement.grader.type == "string_check"
    assert finished.id in [job.id for job in api.openai().fine_tuning.jobs.list()]
    events = list(api.openai().fine_tuning.jobs.list_events(finished.id, limit=100))
    assert all(isinstance(e, FineTuningJobEvent) for e in events)
    assert events[0].message.startswith("job.completed") and events[-1].message == "Created fine-tuning job"
    assert any(e.type == "metrics" for e in events)
    checkpoints = list(api.openai().fine_tuning.jobs.checkpoints.list(finished.id))
    assert checkpoints[0].fine_tuned_model_checkpoint == finished.fine_tuned_model
    assert checkpoints[0].step_number == 3 and checkpoints[0].metrics.step == 3
    # the mapping: 48 rows minus the held-out 10 % (5), one epoch at 16 prompts a step: 3 steps, the seed
    spec = yaml.safe_load((api.out / "a" / finished.id / "spec.yaml").read_text())
    assert spec["hyperparameters"]["max_steps"] == 3 and spec["hyperparameters"]["prompts_per_step"] == 16
    assert spec["hyperparameters"]["seed"] == 7 and spec["rewards"][0]["grader"] == GRADER


def test_veri_api_reads_the_same_job(api, finished):
    with api.http() as http:
        job = http.get(f"/v1/training_jobs/{finished.id}").json()
        assert job["status"] == "succeeded" and job["evaluation"]["after"] is not None
        metrics = http.get(f"/v1/training_jobs/{finished.id}/metrics", params={"keys": "reward,loss"}).json()
        assert [m["step"] for m in metrics["metrics"]] == [1, 2, 3]
        assert all(set(m["values"]) == {"reward", "loss"} for m in metrics["metrics"])
        model = http.get(f"/v1/training_jobs/{finished.id}/model").json()
        events = http.get(f"/v1/training_jobs/{finished.id}/events").json()["data"]
        not_paused = http.post(f"/v1/training_jobs/{finished.id}/approve", json={"approve": True})
    assert not_paused.status_code == 409  # only a job awaiting approval takes a decision
    assert model["artifact_type"] in ("adapter", "full") and model["merged_files"]
    assert events[0]["event"] == "grpoflow.job.started" and events[-1]["event"] == "grpoflow.job.completed"
    with Client(api.url, api.keys["a"]) as client:
        assert client.training_jobs.get(finished.id)["status"] == "succeeded"
        assert client.training_jobs.model(finished.id) == model
        assert client.training_jobs.metrics(finished.id, keys=["reward", "loss"]) == metrics["metrics"]
        assert finished.id in [job["id"] for job in client.training_jobs.list()]


# --- refused -----------------------------------------------------------------------------------------------------


def test_a_bad_job_is_one_400_naming_every_problem_and_creates_nothing(api):
    runs, listed = api.flow_runs(), api.http().get("/v1/training_jobs").json()["data"]
    spec = {"name": "bad", "base_model": "job:bad-20261206-000000-000000", "dataset": "file-000000000000000000000000",
            "rewards": [{"name": "exact_answer"}], "gpu_count": 0,
            "hyperparameters": {"rollouts_per_prompt": 1}, "output_uri": "/elsewhere"}  # fmt: skip
    with api.http() as http:
        response = http.post("/v1/training_jobs", json=spec)
    assert response.status_code == 400
    params = {p["param"] for p in response.json()["error"]["problems"]}
    assert {"base_model", "dataset.uri", "output_uri", "gpu_count", "hyperparameters.rollouts_per_prompt"} <= params
    # the policy, with the team's own limits (team b: 5 steps)
    small = {
        **spec,
        "base_model": "builtin:tiny",
        "gpu_count": 1,
        "hyperparameters": {"max_steps": 6},
        "rewards": [{"grader": GRADER}],
        "dataset": {"uri": str(RFT_ROWS), "prompt_column": "messages"},
    }
    del small["output_uri"]
    with Client(api.url, api.keys["b"]) as client, pytest.raises(ApiError) as refused:
        client.training_jobs.create(small)
    assert refused.value.status == 400
    assert [p["param"] for p in refused.value.problems] == ["hyperparameters.max_steps"]
    # OpenAI's request: each field with no equivalent named
    with pytest.raises(openai.BadRequestError) as bad:
        api.openai().fine_tuning.jobs.create(
            model="builtin:tiny", training_file="file-000000000000000000000000", validation_file="file-x",
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": {
                "reasoning_effort": "low", "n_epochs": 1, "max_steps": 2, "beta": 1}}},
        )  # fmt: skip
    params = {p["param"] for p in bad.value.body["problems"]}
    hp = "method.reinforcement.hyperparameters"
    assert {"training_file", "validation_file", f"{hp}.reasoning_effort", f"{hp}.n_epochs", f"{hp}.beta"} <= params
    with pytest.raises(openai.BadRequestError, match="reinforcement fine-tuning only"):
        api.openai().fine_tuning.jobs.create(model="builtin:tiny", training_file="file-x", method={"type": "dpo"})
    assert api.flow_runs() == runs and api.http().get("/v1/training_jobs").json()["data"] == listed


def test_another_team_sees_nothing_of_a_team(api, finished):
    other = api.openai("b")
    for call in (lambda: other.fine_tuning.jobs.retrieve(finished.id),
                 lambda: other.fine_tuning.jobs.cancel(finished.id),
                 lambda: list(other.fine_tuning.jobs.list_events(finished.id)),
                 lambda: other.files.retrieve(finished.training_file)):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    with api.http("b") as http:
        for path in ("", "/metrics", "/events", "/model"):
            assert http.get(f"/v1/training_jobs/{finished.id}{path}").status_code == 404
        assert http.post(f"/v1/training_jobs/{finished.id}/cancel").status_code == 404
        assert finished.id not in http.get("/v1/training_jobs").text
        assert finished.training_file not in http.get("/v1/files").text
    assert finished.id not in [job.id for job in other.fine_tuning.jobs.list()]
    with pytest.raises(openai.BadRequestError) as refused:  # a's file and model are none of b's
        other.fine_tuning.jobs.create(
            model=finished.fine_tuned_model, training_file=finished.training_file,
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER}},
        )  # fmt: skip
    assert "training_file" in {p["param"] for p in refused.value.body["problems"]}
    with pytest.raises(openai.BadRequestError, match="model: no job"):
        other.fine_tuning.jobs.create(
            model=f"job:{finished.id}", training_file=other.files.create(file=RFT_ROWS, purpose="fine-tune").id,
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER}},
        )  # fmt: skip


def test_a_running_job_is_cancelled(api, finished, tmp_path):
    """A Veri job, started from the OpenAI job's model, trains (slowly: the stand-in's `cancel-me`); its rollouts are
    read while it runs, it is paused and resumed through grpoflow's client (a new run of the same job; OpenAI's client
    sees it paused and is refused a second pause and resume), then cancelled, and its flow run ends Cancelled."""
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(12))
    spec = {"name": "cancel-me", "base_model": finished.fine_tuned_model, "dataset": str(data),
            "rewards": [{"name": "exact_answer"}], "evaluation": {"holdout": 2},
            "hyperparameters": {"max_steps": 100, "rollouts_per_prompt": 2, "max_response_length": 4}}  # fmt: skip
    with Client(api.url, api.keys["a"]) as client:
        job = client.training_jobs.create(spec)
        assert job["status"] in ("queued", "running") and job["parent"] == finished.id
        deadline = time.monotonic() + 300
        while len(client.training_jobs.metrics(job["id"])) < 2:
            assert time.monotonic() < deadline, client.training_jobs.get(job["id"])["status"]
            time.sleep(1)
        assert client.training_jobs.get(job["id"])["status"] == "running"
        with api.http() as http:
            best = http.get(f"/v1/training_jobs/{job['id']}/rollouts", params={"best": 1}).json()["rollouts"]
            no_step = http.get(f"/v1/training_jobs/{job['id']}/rollouts", params={"step": 99})
        assert len(best) == 1 and best[0]["reward"] == 1.0 and best[0]["completion"]
        assert no_step.status_code == 400 and no_step.json()["error"]["param"] == "step"
        first_run = job_record(api, job["id"])["flow_run_id"]
        fine_tuning = api.openai().fine_tuning.jobs  # Veri's pause and resume, and OpenAI's, are one mechanism
        assert client.training_jobs.pause(job["id"])["status"] == "paused"
        assert fine_tuning.retrieve(job["id"]).status == "paused"
        with pytest.raises(openai.ConflictError, match="not running"):
            fine_tuning.pause(job["id"])
        deadline = time.monotonic() + 120
        while True:  # resumable once the first run has ended
            try:
                resumed = client.training_jobs.resume(job["id"])
                break
            except ApiError as e:
                assert e.status == 409 and e.code == "still_stopping" and time.monotonic() < deadline, e
                time.sleep(1)
        assert resumed["status"] in ("queued", "running") and job_record(api, job["id"])["flow_run_id"] != first_run
        deadline = time.monotonic() + 120
        while client.training_jobs.get(job["id"])["status"] != "running":
            assert time.monotonic() < deadline, client.training_jobs.get(job["id"])["status"]
            time.sleep(1)
        with pytest.raises(openai.ConflictError, match="not paused"):
            fine_tuning.resume(job["id"])
        client.training_jobs.cancel(job["id"])
        deadline = time.monotonic() + 120
        while (status := client.training_jobs.get(job["id"])["status"]) != "cancelled":
            assert time.monotonic() < deadline, status
            time.sleep(1)
    openai_view = api.openai().fine_tuning.jobs.retrieve(job["id"])
    assert openai_view.status == "cancelled" and openai_view.fine_tuned_model is None
    with temporary_settings({PREFECT_API_URL: api.prefect_url}), get_client(sync_client=True) as prefect:
        deadline = time.monotonic() + 120
        while not (state := prefect.read_flow_run(job_record(api, job["id"])["flow_run_id"]).state).is_final():
            assert time.monotonic() < deadline, state
            time.sleep(1)
    assert state.is_cancelled(), state
    started_from = yaml.safe_load((api.out / "a" / job["id"] / "spec.yaml").read_text())["base_model"]
    assert started_from == str(api.out / "a" / finished.id / "merged")


def test_a_teams_webhook_gets_openais_events_of_the_jobs_openais_client_created(api, finished):
    """Team a's webhook (the operator's policy) gets the OpenAI job's end as OpenAI's event, signed, and nothing else:
    no grpoflow event, nothing of the Veri job (cancelled by now) or of team b."""
    deadline = time.monotonic() + 60
    while not api.hooks.delivered():
        assert time.monotonic() < deadline, "no webhook delivery"
        time.sleep(0.5)
    time.sleep(1)  # anything else would have come by now: the jobs have ended
    (request,) = api.hooks.requests
    event = openai.OpenAI(api_key="unused").webhooks.unwrap(request.body, request.headers, secret=WHSEC)
    assert event.type == "fine_tuning.job.succeeded" and event.data.id == finished.id
    spec = yaml.safe_load((api.out / "a" / finished.id / "spec.yaml").read_text())
    assert spec["webhooks"] == [{"url": api.hooks.url, "secret_env": SECRET_ENV, "openai_events": "only"}]


def test_the_rft_guide_runs_as_written(api):
    """docs/guides/from-openai-rft.md's python blocks, in order, as one script from the project folder, with the two
    variables it tells the reader to set: its job runs to succeeded, and its grader scores the sample."""
    blocks = re.findall(r"^```python\n(.*?)^```", RFT_GUIDE.read_text(), re.S | re.M)
    assert len(blocks) >= 3 and "openai.OpenAI(" in blocks[0]
    env = {**os.environ, "GRPOFLOW_API_URL": f"{api.url}/v1", "GRPOFLOW_API_KEY": api.keys["a"]}
    ran = subprocess.run([sys.executable, "-c", "\n".join(blocks)], env=env, cwd=PROJECT_DIR, capture_output=True,
                         text=True, timeout=400)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert re.fullmatch(r"succeeded ft:builtin:tiny:a:word-problems:word-problems-\S+", lines[0]), ran.stdout
    assert lines[-1] == "1.0 {'exact': 1.0, 'close': 1.0}"


def job_record(api: Api, job_id: str) -> dict:
    """The API's record of team a's job: where a restarted API finds its flow run."""
    return json.loads((api.out / "a" / ".api-jobs" / f"{job_id}.json").read_text())


def test_keys_reach_no_log_file_or_database(api):
    """The keys went to the API only: none is in its log, the server's or the worker's, the jobs' and files'
    folders, or Prefect's database."""
    home = api.out.parent
    places = [*home.glob("*.log"), *(home / "prefect-home").rglob("*"), *api.out.rglob("*")]
    files = [p for p in places if p.is_file()]
    assert any(p.suffix == ".db" for p in files) and any(p.name == "events.jsonl" for p in files)
    for path in files:
        content = path.read_bytes()
        assert not any(key.encode() in content for key in api.keys.values()), path
