"""The jobs API's application in this process, without a Prefect server: what it answers before any job reaches
Prefect (keys, files, a refused spec), and the client's imports."""

import ast
import json
import os
import re
import sys
from pathlib import Path

import openai
import pytest
import yaml
from fastapi.testclient import TestClient
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from grpoflow.api.app import create_app
from grpoflow.api.errors import ApiError
from grpoflow.api.jobs import Settings, checked_spec
from grpoflow.api.store import TeamStore
from grpoflow.core.apikeys import add_key
from grpoflow.core.policy import deployment_check
from grpoflow.flows.deployments import PROJECT_DIR
from tests.busy_server import answering
from tests.trainers.test_judge import Stub


@pytest.fixture
def app(tmp_path):
    keys = tmp_path / "keys.yaml"
    team_keys = {team: add_key(keys, team) for team in ("a", "b")}
    client = TestClient(create_app(Settings(keys=keys, output_uri=tmp_path / "out", project=PROJECT_DIR)))
    return client, {team: {"Authorization": f"Bearer {key}"} for team, key in team_keys.items()}, tmp_path / "out"


def test_a_key_is_needed_and_the_error_is_openais(app):
    client, _, _ = app
    for headers in ({}, {"Authorization": "Bearer gf-x"}, {"Authorization": "gf-x"}):
        response = client.get("/v1/fine_tuning/jobs", headers=headers)
        assert response.status_code == 401
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_teams_files_are_its_own(app):
    client, headers, out = app
    sent = client.post("/v1/files", headers=headers["a"], files={"file": ("t.jsonl", b'{"messages": []}\n')},
                       data={"purpose": "fine-tune"})  # fmt: skip
    file = sent.json()
    assert sent.status_code == 200 and file["object"] == "file" and file["bytes"] == 17
    assert (out / "files" / "a" / f"{file['id']}.jsonl").read_bytes() == b'{"messages": []}\n'
    assert client.get(f"/v1/files/{file['id']}", headers=headers["a"]).json() == file
    assert client.get(f"/v1/files/{file['id']}", headers=headers["b"]).status_code == 404
    assert client.get("/v1/files", headers=headers["b"]).json()["data"] == []
    wrong = client.post("/v1/files", headers=headers["a"], files={"file": ("t.jsonl", b"{}")}, data={"purpose": "x"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"


def test_an_upload_past_the_limit_is_refused_and_leaves_no_file(tmp_path):
    """The upload is streamed to the files folder and refused as soon as it passes the limit (64 bytes here): a 413,
    and nothing of it left there; one at the limit is taken whole, through OpenAI's client."""
    keys = tmp_path / "keys.yaml"
    settings = Settings(keys=keys, output_uri=tmp_path / "out", project=PROJECT_DIR, max_upload_bytes=64)
    key, client = add_key(keys, "a"), TestClient(create_app(settings))
    headers, folder = {"Authorization": f"Bearer {key}"}, tmp_path / "out" / "files" / "a"
    for size in (65, 4 * 2**20):
        sent = client.post("/v1/files", headers=headers, files={"file": ("t.jsonl", b"x" * size)},
                           data={"purpose": "fine-tune"})  # fmt: skip
        assert sent.status_code == 413 and sent.json()["error"]["param"] == "file", sent.text
        assert list(folder.iterdir()) == []
    wrong = client.post("/v1/files", headers=headers, files={"file": ("t.jsonl", b"{}")}, data={"purpose": "x"})
    assert wrong.status_code == 400 and list(folder.iterdir()) == []
    garbled = client.post("/v1/files", headers={**headers, "content-type": "multipart/form-data; boundary=zz"},
                          content=b"--zz\r\nnot a part")  # fmt: skip
    assert garbled.status_code == 400 and list(folder.iterdir()) == []
    # what is not the file is bounded too: a part's headers (by python-multipart), the number of parts
    boundary = b"multipart/form-data; boundary=zz"
    long_header = (
        b"--zz\r\nContent-Disposition: form-data; name=purpose; x=" + b"a" * 10_000 + b"\r\n\r\nfine-tune\r\n"
    )
    many = b"".join(b"--zz\r\nContent-Disposition: form-data; name=f%d\r\n\r\nv\r\n" % i for i in range(100))
    for body, said in ((long_header + b"--zz--\r\n", "Maximum header size"), (many + b"--zz--\r\n", "over 8 parts")):
        refused = client.post("/v1/files", headers={**headers, "content-type": boundary.decode()}, content=body)
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
        assert list(folder.iterdir()) == []
    rows = b'{"messages": [{"role": "user", "content": "2+2?"}]}\n'.ljust(64, b" ")
    uploaded = openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0).files
    made = uploaded.create(file=("rows.jsonl", rows), purpose="fine-tune")
    assert made.bytes == 64 and (folder / f"{made.id}.jsonl").read_bytes() == rows
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{made.id}.jsonl", f"{made.id}.json"])


def test_a_refused_spec_names_every_problem_before_prefect(app):
    client, headers, out = app
    spec = {"name": "Bad Name", "base_model": "builtin:tiny", "dataset": "file-000000000000000000000000",
            "rewards": [], "gpu_count": 0}  # fmt: skip
    response = client.post("/v1/training_jobs", headers=headers["a"], json=spec)
    assert response.status_code == 400
    assert {"name", "dataset.uri", "rewards", "gpu_count"} <= {
        p["param"] for p in response.json()["error"]["problems"]
    }
    assert not (out / "a").exists()


def test_a_prefect_server_still_busy_after_the_retries_is_a_503(app):
    """Prefect's server answers 503 ("database is locked") however often it is asked: Prefect's client retries it
    (PREFECT_CLIENT_MAX_RETRIES, here 1), then the API answers 503 in OpenAI's shape, which OpenAI's client retries in
    turn; never a 500."""
    client, headers, out = app
    TeamStore(out, "a").add_job("busy-20261206-000000-abcdef", "00000000-0000-4000-8000-000000000000")
    with answering(*[503] * 5) as (url, times):
        with temporary_settings({PREFECT_API_URL: url, PREFECT_CLIENT_MAX_RETRIES: 1}):
            response = client.get("/v1/training_jobs/busy-20261206-000000-abcdef", headers=headers["a"])
    assert response.status_code == 503 and len(times) == 2, response.text
    error = response.json()["error"]
    assert error["code"] == "server_busy" and error["type"] == "server_error"
    assert error["message"].startswith(f"the Prefect server at {url} is busy (HTTP 503 Service Unavailable) after 1 ")


def test_the_client_imports_only_httpx2():
    tree = ast.parse((Path(__file__).parents[2] / "grpoflow" / "client.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - set(sys.stdlib_module_names) == {"httpx2"}


def test_an_openai_request_is_one_400_in_its_own_names(app):
    client, headers, _ = app
    request = {"model": "builtin:tiny", "training_file": "/etc/passwd", "suffix": "Not A Slug",
               "hyperparameters": {"n_epochs": 1}, "method": {"type": "reinforcement", "reinforcement": {
                   "grader": {"type": "string_check"}, "hyperparameters": {"reasoning_effort": "low"}}}}  # fmt: skip
    response = client.post("/v1/fine_tuning/jobs", headers=headers["a"], json=request)
    assert response.status_code == 400
    params = {p["param"] for p in response.json()["error"]["problems"]}
    expected = {"training_file", "suffix", "hyperparameters", "method.reinforcement.hyperparameters.reasoning_effort",
                "method.reinforcement.grader.name", "method.reinforcement.grader.reference"}  # fmt: skip
    assert expected <= params and not any(p.startswith(("dataset", "rewards", "name")) for p in params if p)


EXACT = {"type": "string_check", "name": "exact", "operation": "eq", "input": "{{ sample.output_text }}",
         "reference": "{{ item.answer }}"}  # fmt: skip
PYTHON = {"type": "python", "name": "length", "source": "def grade(sample, item):\n"
          "    return len(sample['output_text']) / item['n']\n"}  # fmt: skip


def openai_client(app, team="a"):
    """OpenAI's own client, talking to the app in this process."""
    client, headers, _ = app
    return openai.OpenAI(base_url="http://testserver/v1", api_key=headers[team]["Authorization"].split()[1],
                         http_client=client, max_retries=0)  # fmt: skip


@pytest.mark.parametrize(
    "grader, sample, item, reward",
    [
        (EXACT, "4", {"answer": "4"}, 1.0),  # the sample is the reference
        (EXACT, "5", {"answer": "4"}, 0.0),
        (PYTHON, "abcd", {"n": 8}, 0.5),  # grade() in the sandbox
    ],
)
def test_openais_client_runs_a_grader(app, grader, sample, item, reward):
    ran = openai_client(app).fine_tuning.alpha.graders.run(grader=grader, model_sample=sample, item=item)
    assert ran.reward == reward and ran.metadata.name == grader["name"] and ran.metadata.type == grader["type"]
    assert ran.metadata.scores == {grader["name"]: reward} and not ran.metadata.errors.python_grader_runtime_error


def test_a_multi_graders_run_shows_each_sub_graders_reward(app):
    multi = {"type": "multi", "name": "both", "calculate_output": "0.25 * exact + 0.75 * length",
             "graders": {"exact": EXACT, "length": PYTHON}}  # fmt: skip
    ran = openai_client(app).fine_tuning.alpha.graders.run(
        grader=multi, model_sample="4", item={"answer": "5", "n": 1}
    )
    assert ran.sub_rewards == {"exact": 0.0, "length": 1.0} and ran.reward == 0.75
    broken = {**multi, "calculate_output": "exact / (length - 1)"}  # divides by zero: no reward, the formula's error
    ran = openai_client(app).fine_tuning.alpha.graders.run(
        grader=broken, model_sample="4", item={"answer": "5", "n": 1}
    )
    assert ran.reward == 0.0 and ran.metadata.errors.formula_parse_error


def test_a_grader_that_raises_is_a_runtime_error_not_a_500(app):
    ran = openai_client(app).fine_tuning.alpha.graders.run(grader=PYTHON, model_sample="x", item={})
    errors = ran.metadata.errors
    assert ran.reward == 0.0 and errors.python_grader_runtime_error
    assert "KeyError" in errors.python_grader_runtime_error_details


def test_openais_client_validates_a_grader(app):
    graders = openai_client(app).fine_tuning.alpha.graders
    assert graders.validate(grader=EXACT).grader.name == "exact"
    with pytest.raises(openai.BadRequestError) as bad:
        graders.validate(grader={**EXACT, "operation": "equals"})
    assert bad.value.body["problems"][0]["param"] == "grader.operation"
    assert graders.validate(grader=JUDGE).grader.name == "judge"  # the object is right; its endpoint the operator's
    with pytest.raises(openai.BadRequestError, match=re.escape("from_deployments.model_graders: {base_url")):
        graders.run(grader=JUDGE, model_sample="x")  # the tests' policy sets no endpoint for model graders


JUDGE = {"type": "score_model", "name": "judge", "model": "gpt-4o-mini",
         "input": [{"role": "user", "content": "Rate {{ sample.output_text }} for {{ item.answer }}"}]}  # fmt: skip


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    """An OpenAI-compatible server on loopback that answers 0.75, as the operator's endpoint for model graders (the
    tests' policy with `from_deployments.model_graders`), its key in GRADER_TEST_KEY."""
    stub = Stub([(200, "0.75", {}, 0.0)])
    policy = yaml.safe_load(Path(os.environ["GRPOFLOW_POLICY"]).read_text())
    policy.setdefault("from_deployments", {})["model_graders"] = {"base_url": stub.base_url,
                                                                  "api_key_env": "GRADER_TEST_KEY"}  # fmt: skip
    policy["teams"] = {"a": {"paths": [str(tmp_path / "out" / "files" / "a")]}}
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    monkeypatch.setenv("GRPOFLOW_POLICY", str(tmp_path / "policy.yaml"))
    monkeypatch.setenv("GRADER_TEST_KEY", "sk-grader-test-1")
    yield stub
    stub.close()


def test_a_model_grader_runs_against_the_operators_endpoint(app, endpoint):
    ran = openai_client(app).fine_tuning.alpha.graders.run(grader=JUDGE, model_sample="4", item={"answer": "4"})
    assert ran.reward == 0.75 and ran.metadata.scores == {"judge": 0.75} and not ran.metadata.errors.other_error
    (sent,) = endpoint.requests
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == "gpt-4o-mini"
    assert sent["headers"]["Authorization"] == "Bearer sk-grader-test-1"
    assert "Rate 4 for 4" in json.dumps(sent["body"])


def test_a_jobs_model_grader_is_sent_to_the_operators_endpoint(app, endpoint, tmp_path, monkeypatch):
    """The job's spec, as the deployment run gets it: the grader's kwargs name the operator's (loopback) endpoint,
    which the policy then allows; with no endpoint set, the request is one 400 naming the setting."""
    data = tmp_path / "out" / "files" / "a" / "rows.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}\n' * 4)
    store = TeamStore(tmp_path / "out", "a")
    settings = Settings(keys=tmp_path / "keys.yaml", output_uri=tmp_path / "out", project=PROJECT_DIR)
    request = {"name": "judged", "base_model": "builtin:tiny", "rewards": [{"grader": JUDGE}],
               "dataset": {"uri": str(data), "prompt_column": "messages"}}  # fmt: skip
    spec, _ = checked_spec(request, settings, store)
    assert spec.rewards[0].kwargs == {"base_url": endpoint.base_url, "api_key_env": "GRADER_TEST_KEY"}
    assert deployment_check(spec, PROJECT_DIR, "a") == []
    elsewhere = {**request, "rewards": [{"grader": JUDGE, "kwargs": {"base_url": "http://127.0.0.1:9/v1"}}]}
    with pytest.raises(ApiError, match="on loopback"):  # the operator's endpoint only, no other loopback URL
        checked_spec(elsewhere, settings, store)
    (tmp_path / "none.yaml").write_text("{}")
    monkeypatch.setenv("GRPOFLOW_POLICY", str(tmp_path / "none.yaml"))
    client, headers, _ = app
    rft = {"model": "gpt-4o-mini", "training_file": "file-000000000000000000000000",
           "method": {"type": "reinforcement", "reinforcement": {"grader": JUDGE}}}  # fmt: skip
    refused = client.post("/v1/fine_tuning/jobs", headers=headers["a"], json=rft).json()["error"]
    assert any(p["param"] == "method.reinforcement.grader" and "from_deployments.model_graders" in p["message"]
               for p in refused["problems"])  # fmt: skip


def test_the_policy_turns_api_python_graders_off(app, monkeypatch, tmp_path):
    (tmp_path / "policy.yaml").write_text("from_deployments: {python_graders: 'off'}\n")
    monkeypatch.setenv("GRPOFLOW_POLICY", str(tmp_path / "policy.yaml"))
    with pytest.raises(openai.BadRequestError, match="python_graders: off"):
        openai_client(app).fine_tuning.alpha.graders.run(grader=PYTHON, model_sample="x", item={"n": 1})
