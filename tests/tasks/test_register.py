"""Deployment registration (`grpoflow deploy`); the server it registers for is tested in tests/flows/test_serve.py."""

import json
import shutil

import pytest

from tests.conftest import arithmetic_rows, cli, write_jsonl
from trainers.dataset import ingest_dataset
from trainers.jobdir import JobDir
from trainers.spec import load_spec, to_yaml
from trainers.tiny import build_tiny


@pytest.fixture
def finished_job(tmp_path) -> JobDir:
    """A job folder as a finished full fine-tune leaves it; the weights are builtin:tiny's."""
    job = JobDir(tmp_path / "runs" / "reg-20261130-000000-abcdef")
    spec, _ = load_spec(
        {
            "name": "reg",
            "base_model": "builtin:tiny",
            "dataset": {"uri": "x.jsonl"},
            "rewards": [{"name": "exact_answer"}],
        }
    )
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(10))), job.dataset, holdout=2)
    shutil.copytree(build_tiny(), job.merged)
    job.model_json.write_text(json.dumps({"artifact_type": "full", "files": [], "merged_files": []}))
    return job


@pytest.mark.usefixtures("prefect_server")
def test_deploy_is_ready_after_smoke_test_and_idempotent(finished_job):
    root = finished_job.root.parent
    code, out, err = cli("--output-uri", root, "deploy", finished_job.job_id, "--name", "tiny", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["status"] == "ready" and first["artifact_path"] == str(finished_job.merged)
    assert first["smoke"]["prompt"].startswith("What is") and isinstance(first["smoke"]["completion"], str)

    code, out, _ = cli("--output-uri", root, "deploy", finished_job.job_id, "--name", "tiny", "--json")
    second = json.loads(out)
    assert code == 0 and second["created"] == first["created"] and second["updated"] >= first["updated"]
    assert [p.name for p in (root / "deployments").iterdir()] == ["tiny.json"]  # one record per name
    events = [json.loads(line)["event"] for line in finished_job.events.read_text().splitlines()]
    assert events.count("grpoflow.deployment.registered") == 2


@pytest.mark.usefixtures("prefect_server")
def test_deploy_mistakes(finished_job):
    root = finished_job.root.parent
    code, _, err = cli("--output-uri", root, "deploy", "no-such-job")
    assert code == 1 and "unknown job" in err
    code, _, err = cli("--output-uri", root, "deploy", finished_job.job_id, "--name", "Bad Name")
    assert code == 2 and "--name" in err
    shutil.rmtree(finished_job.merged)
    code, _, err = cli("--output-uri", root, "deploy", finished_job.job_id)
    assert code == 1 and "merged" in err
    code, _, err = cli("--output-uri", root, "serve", "nothing-here")
    assert code == 1 and "unknown deployment" in err
