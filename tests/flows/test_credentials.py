"""Credentials never reach Prefect (docs/guides/security.md), on a real Prefect server on loopback:

(a) a run of the `grpo-pipeline` deployment whose spec holds a URL with `user:password@` in a typed field is refused
    by the server itself (its parameter schema, enforced before the run is stored): 409, a message without the
    secret, and the secret nowhere in the server's database. The UI's form posts to the same endpoint, after its own
    check (/ui/schemas/validate), which answers without the secret too.
(b) a secret the schema cannot see (a free-form reward kwarg) is stored with the run, but the run, refused by the
    spec's own rules, ends Rejected with the secret in none of its log lines, grpoflow's or Prefect's.
"""

import logging
from pathlib import Path

import httpx
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId, LogFilter, LogFilterFlowRunId
from prefect.exceptions import PrefectHTTPStatusError
from prefect.flow_engine import run_flow
from prefect.logging.handlers import APILogWorker
from prefect.logging.loggers import flow_run_logger
from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL

from grpoflow.core.spec.fields import CREDENTIALS_REFUSED
from grpoflow.flows.pipeline import grpo_pipeline

SECRET = "sEcReT123"  # in the refused specs of (a)
JUDGE_SECRET = "jUdGeSeCrEt456"  # in the spec of (b), which the server stores
SPEC = {
    "name": "creds",
    "base_model": "builtin:tiny",
    "dataset": {"uri": "d.jsonl"},
    "rewards": [{"name": "exact_answer"}],  # a built-in: the schema refuses any other name without a function
}


@pytest.fixture(scope="module")
def deployment(prefect_server):
    """`grpo-pipeline` deployed as `prefect deploy` deploys it (a RunnerDeployment: the flow's parameter schema,
    enforced, as prefect.yaml asks of every deployment)."""
    deployment_id = grpo_pipeline.to_deployment(name="credentials").apply()
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
    assert deployment.enforce_parameter_schema
    return deployment


@pytest.mark.parametrize(
    "field, changes",
    [
        # the job folder's root
        ("output_uri", {"output_uri": f"s3://AKIAEXAMPLE:{SECRET}@bucket/runs"}),
        # the dataset
        ("dataset.uri", {"dataset": {"uri": f"s3://AKIAEXAMPLE:{SECRET}@bucket/prompts.jsonl"}}),
        # a webhook receiver
        ("webhooks[0].url", {"webhooks": [{"url": f"https://hooks:{SECRET}@127.0.0.1:9/hook"}]}),
        # a vLLM server (an optional field: the check stands beside its null)
        ("generation.vllm_server_url", {"generation": {"vllm_server_url": f"http://u:{SECRET}@127.0.0.1:8000"}}),
        # the base model, and a reward model, given as URLs
        ("base_model", {"base_model": f"https://u:{SECRET}@127.0.0.1/model"}),
        ("rewards[0].model", {"rewards": [{"model": f"https://u:{SECRET}@127.0.0.1/rm"}]}),
        # a held-out metric's own entry (one branch of a union)
        ("evaluation.metric.model", {"evaluation": {"metric": {"model": f"https://u:{SECRET}@127.0.0.1/rm"}}}),
    ],
)
def test_the_server_refuses_credentials_before_storing_the_run(deployment, field, changes):
    with get_client(sync_client=True) as client:
        with pytest.raises(PrefectHTTPStatusError) as refused:
            client.create_flow_run_from_deployment(deployment.id, parameters={"spec": SPEC | changes})
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id]))
        )
    response = refused.value.response
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert f"Validation failed for field 'spec.{field}'" in detail and CREDENTIALS_REFUSED in detail
    assert SECRET not in response.text and SECRET not in str(refused.value)
    assert not [r for r in runs if SECRET in r.model_dump_json()]
    # Nor anywhere in the server's SQLite database (its write-ahead log included).
    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split("///", 1)[1])
    files = [p for p in database.parent.glob(database.name + "*") if p.is_file()]
    assert files and not [p for p in files if SECRET.encode() in p.read_bytes()]


def test_the_forms_own_check_answers_without_the_secret(deployment):
    """The UI's form asks the server to check what it holds (/ui/schemas/validate) before it posts the run, and shows
    the answer beside the field. (Every error, not the best: a metric entry holding the URL, one branch of a union,
    is quoted whole in the union's error, back to the browser that typed it; nothing is stored.)"""
    spec = SPEC | {"output_uri": f"s3://AKIAEXAMPLE:{SECRET}@bucket/runs"}
    checked = httpx.post(
        f"{PREFECT_API_URL.value()}/ui/schemas/validate",
        json={"schema": deployment.parameter_openapi_schema, "values": {"spec": spec}},
    )
    assert checked.json()["valid"] is False
    assert CREDENTIALS_REFUSED in checked.text and SECRET not in checked.text


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(logging.Formatter().format(record))  # the message, and any traceback


@pytest.mark.filterwarnings("ignore:Logger 'prefect.flow_runs' attempted to send logs")
def test_a_secret_the_schema_cannot_see_reaches_no_log(deployment):
    """A judge's base_url sits in the reward's free-form kwargs: the server stores the run, and the worker's engine
    (run here as a worker runs it) refuses the spec; no line of its log holds the secret."""
    judge = {"base_url": f"http://judge:{JUDGE_SECRET}@127.0.0.1:9/v1", "model": "m", "rubric": "{completion}"}
    spec = SPEC | {"rewards": [{"name": "llm_judge", "kwargs": judge}]}
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters={"spec": spec})
    records, root = Records(), logging.getLogger()
    root.addHandler(records)
    try:
        run_flow(grpo_pipeline, flow_run=flow_run, error_logger=flow_run_logger(flow_run), return_type="state")
    finally:
        root.removeHandler(records)
    APILogWorker.drain_all(timeout=10)  # the logs still queued for the server
    with get_client(sync_client=True) as client:
        logs = [
            log.message
            for log in client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
        ]
        state = client.read_flow_run(flow_run.id).state
    assert state.name == "Rejected" and "rewards[0].kwargs.base_url: holds credentials" in state.message
    assert any("rewards[0].kwargs.base_url: holds credentials" in line for line in logs), logs
    assert not [line for line in [*logs, *records.lines, state.message] if JUDGE_SECRET in line]
