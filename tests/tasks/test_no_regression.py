"""DESIGN's "No regression" end to end, with the default gate (`evaluation.gate.min_gain: 0`, nothing set): a job whose
GRPO result does not beat the model it started from completes, says so, raises `no_improvement`, and publishes and
deploys nothing."""

import json

import pytest

from grpoflow.core.jobdir import JobDir
from tests.conftest import cli


@pytest.mark.usefixtures("prefect_server", "standin")
def test_a_job_where_nothing_beat_the_start_publishes_nothing(make_spec, tmp_path):
    # The stand-in child saves the start's weights as its result: after == before, no gain. No `gate:` in the spec;
    # were publish attempted it would fail (no Hub here), were deploy, runs/deployments/ would exist.
    spec = make_spec(
        "nogain",
        hyperparameters={"max_steps": 2},
        evaluation={"holdout": 4},
        publish={"repo_id": "grpo-org/never-published"},
        deploy={"name": "nogain"},
    )
    code, out, err = cli("run", spec)
    assert code == 0, err
    [job] = [JobDir(p) for p in (tmp_path / "runs").iterdir() if (p / "spec.yaml").exists()]
    evaluation = json.loads(job.evaluation.read_text())
    assert evaluation["improved"] is False and evaluation["after"] == evaluation["before"]
    assert "model not promoted (not published, not deployed): no checkpoint beat the starting model" in out
    assert "evaluation.gate.min_gain 0 promotes only a gain" in out
    events = [json.loads(line) for line in job.events.read_text().splitlines()]
    names = [e["event"] for e in events]
    assert "grpoflow.model.published" not in names and "grpoflow.deployment.registered" not in names
    assert names[-2:] == ["grpoflow.model.rejected", "grpoflow.job.completed"]
    assert events[-2]["payload"]["reason"] == "no_improvement" and events[-2]["payload"]["min_gain"] == 0.0
    assert [e["payload"]["kind"] for e in events if e["event"] == "grpoflow.training.alert"] == ["no_improvement"]
    assert not (job.root / "published.json").exists() and not (tmp_path / "runs" / "deployments").exists()
