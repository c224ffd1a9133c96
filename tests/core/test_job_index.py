"""The job index (`core/jobdir.py`) and the CLI finding a job by id alone, from another folder."""

import json

import pytest

from grpoflow.core import jobdir as job_index
from tests.conftest import cli


@pytest.fixture
def index(tmp_path, monkeypatch):
    monkeypatch.setenv(job_index.INDEX_ENV, str(tmp_path / "index"))
    return tmp_path / "index"


def test_remember_and_locate(index):
    job_index.remember("a-1", "/data/runs/a-1")
    job_index.remember("b-2", "s3://bucket/runs/b-2")
    assert job_index.locate("a-1") == "/data/runs/a-1"
    assert job_index.locate("missing") is None
    assert job_index.locate("../a-1") is None  # not a job id: never a path out of the index
    assert set(job_index.known_roots()) == {"/data/runs", "s3://bucket/runs"}


def test_an_unwritable_index_costs_only_the_lookup(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(job_index.INDEX_ENV, str(blocker / "index"))  # under a file: cannot be created
    job_index.remember("a-1", "/data/runs/a-1")
    assert job_index.locate("a-1") is None


def finished_job(root, job_id="demo-20261201-000000-abcdef"):
    job = root / job_id
    job.mkdir(parents=True)
    (job / "spec.yaml").write_text("name: demo\n")
    (job / "metrics.jsonl").write_text(json.dumps({"step": 1, "values": {"reward": 0.5}}) + "\n")
    (job / "events.jsonl").write_text(json.dumps({"event": "grpoflow.job.completed"}) + "\n")
    return job


def test_cli_finds_an_indexed_job_from_any_folder(index, tmp_path, monkeypatch):
    job = finished_job(tmp_path / "project" / "runs")
    job_index.remember(job.name, str(job))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.delenv("GRPOFLOW_OUTPUT_URI", raising=False)

    code, out, err = cli("metrics", job.name, "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"] == [{"step": 1, "values": {"reward": 0.5}}]
    code, out, _ = cli("jobs")
    assert code == 0 and job.name in out and str(job.parent) in out


def test_cli_says_where_it_looked(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRPOFLOW_OUTPUT_URI", raising=False)
    code, _, err = cli("metrics", "nowhere-20261201-000000-abcdef")
    assert code == 2
    assert f"under {tmp_path / 'runs'}, nor in the job index {index}" in err
