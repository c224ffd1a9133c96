"""The spec-file entry flow of `grpo-pipeline/nightly` and `grpo-pipeline/on-new-data` (`flows/triggered.py`): which
spec it loads, that the event's `uri` becomes `dataset.uri`, and that a rejected spec or dataset ends the run as
rejected before any model is loaded. The runs here end at the ingest, so no training happens."""

import pytest
import s3fs
import yaml
from prefect import get_client

from grpoflow.flows.triggered import DEFAULT_SPEC, grpo_pipeline_from_file
from grpoflow.integrations.stages import REJECTED
from grpoflow.tasks.bookkeeping import new_job_id
from tests.hostile_server import HostileServer

pytestmark = pytest.mark.usefixtures("prefect_server")


def write_spec(path, output_uri, **changes) -> str:
    spec = {
        "name": "triggered",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "never-used.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "output_uri": str(output_uri),
        **changes,
    }
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def rejection(state) -> str:
    assert state.is_failed() and state.name == REJECTED, state
    return state.message


def test_event_uri_becomes_the_dataset(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", tmp_path / "runs")
    missing = str(tmp_path / "landed" / "gone.jsonl")
    state = grpo_pipeline_from_file(spec=spec, dataset_uri=missing, return_state=True)
    assert f"dataset not found: {missing}" in rejection(state)  # the event's uri, not the spec's
    assert not any((tmp_path / "runs").iterdir())  # a rejected job leaves no folder


@pytest.mark.parametrize(
    "landed, name",
    [
        (True, "triggered-new-data"),  # on-new-data: the event's dataset started it, and its name says so
        (False, "triggered"),  # nightly: the spec's own dataset, a run named like any retrain
    ],
)
def test_a_run_new_data_started_is_named_so_after_its_job(tmp_path, landed, name):
    spec = write_spec(tmp_path / "spec.yaml", tmp_path / "runs", dataset={"uri": str(tmp_path / "gone.jsonl")})
    dataset_uri = str(tmp_path / "landed.jsonl") if landed else None
    state = grpo_pipeline_from_file(spec=spec, dataset_uri=dataset_uri, return_state=True)
    assert "dataset not found" in rejection(state)  # after the job was created: the run has its job's name
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.name == new_job_id(name, run.id, run.expected_start_time)


def test_default_spec_without_a_spec(tmp_path):
    default = write_spec(tmp_path / "default.yaml", tmp_path / "runs", name="the-default")
    state = grpo_pipeline_from_file(spec=None, dataset_uri=str(tmp_path / "x.jsonl"), default_spec=default,
                                    return_state=True)  # fmt: skip
    assert "x.jsonl" in rejection(state)
    assert DEFAULT_SPEC == "deployments/default-spec.yaml"


def test_rejected_spec_names_every_problem(tmp_path):
    bad = {"rollout_per_prompt": 4, "kl_coef": -1}  # a misspelt key and a value out of range
    spec = write_spec(tmp_path / "bad.yaml", tmp_path / "runs", hyperparameters=bad)
    message = rejection(grpo_pipeline_from_file(spec=spec, return_state=True))
    assert "did you mean 'rollouts_per_prompt'" in message and "kl_coef" in message


def test_spec_on_s3(bucket, tmp_path):
    fs = s3fs.S3FileSystem()
    spec = f"s3://{bucket}/specs/job.yaml"
    content = {"name": "from-s3", "base_model": "builtin:tiny", "rewards": [{"name": "exact_answer"}]}
    fs.pipe(spec, yaml.safe_dump({**content, "output_uri": str(tmp_path / "runs")}).encode())
    # The spec file has no dataset: the event's uri completes it.
    state = grpo_pipeline_from_file(spec=spec, dataset_uri=f"s3://{bucket}/landed/none.jsonl", return_state=True)
    assert f"dataset not found: s3://{bucket}/landed/none.jsonl" in rejection(state)
    missing = rejection(grpo_pipeline_from_file(spec=f"s3://{bucket}/specs/nope.yaml", return_state=True))
    assert f"spec file not found: s3://{bucket}/specs/nope.yaml" in missing


def test_a_spec_at_a_web_address_is_refused_before_any_request():
    # An event's payload names the spec: anyone who can emit one would have the worker fetch any address it reaches
    # (the cloud's metadata service answers JSON whose keys the rejection would list).
    with HostileServer("huge", size=10) as server:
        spec = f"{server.url}/latest/meta-data/iam/security-credentials/role"
        message = rejection(grpo_pipeline_from_file(spec=spec, return_state=True))
        assert server.requests == 0
    assert message.startswith(f"{spec}: http:// is refused: a local path, or a URL of s3://")
