"""s3:// wherever grpoflow takes a path, against moto's S3 server on loopback through the real s3fs: datasets (also
offline), spec files, job folders (staged locally, uploaded at the end, downloaded again to resume), the CLI reading
jobs back, and credentials from a Prefect `RemoteFileSystem` block instead of the AWS environment variables."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import s3fs
import yaml
from prefect.filesystems import RemoteFileSystem

from grpoflow.core.spec import SpecError, load_spec
from grpoflow.flows.cli import main
from grpoflow.integrations import storage
from grpoflow.integrations.checkpoint_sync import restore_checkpoint
from grpoflow.integrations.job_folders import job_dir, job_location, upload_job
from grpoflow.tasks.bookkeeping import create_job_task, unlock_remote
from grpoflow.trainers.dataset import ingest_dataset, load_ingested
from tests.conftest import arithmetic_rows

ROWS = "".join(json.dumps(r) + "\n" for r in arithmetic_rows(10)).encode()


def cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def spec_dict(output_uri: str) -> dict:
    return {
        "name": "s3-job",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "examples/data/arithmetic.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "output_uri": output_uri,
    }


@pytest.mark.parametrize(
    "uri, remote",
    [
        ("s3://bucket/prefix", True),
        ("S3://bucket/key.jsonl", True),  # schemes are case-insensitive
        ("runs", False),  # a relative folder
        ("/abs/runs", False),
        ("file:///abs/runs", False),  # file:// is local
    ],
)
def test_is_remote(uri, remote):
    assert storage.is_remote(uri) is remote


def test_dataset_from_s3_offline(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # `datasets` alone refuses URLs then; the ingest fetches the file
    s3fs.S3FileSystem().pipe(f"{bucket}/prompts.jsonl", ROWS)
    result = ingest_dataset(f"s3://{bucket}/prompts.jsonl", tmp_path / "dataset", holdout=2)
    assert (result.num_train, result.num_eval) == (8, 2)
    assert load_ingested(tmp_path / "dataset")["train"].num_rows == 8


def test_spec_file_on_s3(bucket):
    fs = s3fs.S3FileSystem()
    fs.pipe(f"{bucket}/specs/job.yaml", yaml.safe_dump(spec_dict("runs")).encode())
    spec, _ = load_spec(f"s3://{bucket}/specs/job.yaml", ["hyperparameters.max_steps=5"])
    assert spec.name == "s3-job" and spec.hyperparameters.max_steps == 5
    with pytest.raises(SpecError, match=f"spec file not found: s3://{bucket}/specs/missing.yaml"):
        load_spec(f"s3://{bucket}/specs/missing.yaml")


@pytest.mark.usefixtures("prefect_server")
def test_job_folder_staged_uploaded_and_resumed(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / "staging"))
    spec, _ = load_spec(spec_dict(f"s3://{bucket}/runs"))
    job = create_job_task(spec, "s3-job-1")
    assert job.root == tmp_path / "staging" / "s3-job-1"  # runs locally ...
    assert job_location(job, spec) == f"s3://{bucket}/runs/s3-job-1"  # ... and ends up here
    (job.root / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (job.root / "checkpoints" / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    (job.root / "checkpoints" / "checkpoint-2").mkdir(parents=True)  # torn (no trainer_state.json): stays here
    job.metrics.write_text('{"step": 1, "values": {}}\n')

    assert upload_job(job, spec) == f"s3://{bucket}/runs/s3-job-1"
    fs = s3fs.S3FileSystem()
    remote = f"{bucket}/runs/s3-job-1"
    assert {p.removeprefix(remote + "/") for p in fs.find(remote)} == {
        ".lease.json",  # the run's lease (integrations/leases.py), held to the job's end: no second machine takes it
        "spec.yaml",
        "events.jsonl",
        "metrics.jsonl",
        "checkpoints/checkpoint-1/trainer_state.json",
        "checkpoints/checkpoint-1/grpoflow-checkpoint.json",  # its manifest, written last: it is intact
    }
    # The last events only: what the pipeline sends again after job.completed.
    job.events.write_text(job.events.read_text() + '{"event": "grpoflow.job.completed"}\n')
    job.metrics.write_text("changed but not sent\n")
    upload_job(job, spec, names=("events.jsonl", "webhooks.jsonl"))
    fs.invalidate_cache()
    assert fs.cat(f"{remote}/events.jsonl").decode().endswith('"grpoflow.job.completed"}\n')
    assert fs.cat(f"{remote}/metrics.jsonl") == b'{"step": 1, "values": {}}\n'

    # Resumed, once that run ended, on a machine without the staging folder: the job folder comes back from S3.
    unlock_remote(job)
    assert not fs.exists(f"{remote}/.lease.json")
    monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / "elsewhere"))
    resumed = create_job_task(spec, "s3-job-1")
    assert not (resumed.root / ".lease.json").exists()  # the lease is no job file
    assert resumed.root == tmp_path / "elsewhere" / "s3-job-1"
    # Checkpoints come when training needs one: the newest intact, checked against its manifest.
    assert not resumed.checkpoints.exists()
    assert restore_checkpoint(resumed, job_location(resumed, spec)) == "checkpoint-1"
    assert (resumed.checkpoints / "checkpoint-1" / "trainer_state.json").exists()
    assert resumed.metrics.read_text() == '{"step": 1, "values": {}}\n'
    unlock_remote(resumed)


def test_local_output_is_not_uploaded(tmp_path):
    spec, _ = load_spec(spec_dict(str(tmp_path / "runs")))
    job = job_dir(spec.output_uri, "local-1")
    assert job.root == tmp_path / "runs" / "local-1" and job_location(job, spec) == str(job.root)
    assert upload_job(job, spec) is None


@pytest.mark.usefixtures("prefect_server")
def test_credentials_from_a_prefect_block(bucket, s3_env, tmp_path, monkeypatch):
    s3fs.S3FileSystem().pipe(f"{bucket}/prompts.jsonl", ROWS)
    settings = {
        "key": s3_env["AWS_ACCESS_KEY_ID"],
        "secret": s3_env["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": s3_env["AWS_ENDPOINT_URL"]},
    }
    RemoteFileSystem(basepath=f"s3://{bucket}", settings=settings).save("grpoflow-test-s3", overwrite=True)
    # Nothing in the environment points at the server now: only the block can.
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv(storage.STORAGE_BLOCK_ENV, "grpoflow-test-s3")
    storage._block_settings.cache_clear()
    try:
        uri = f"s3://{bucket}/prompts.jsonl"
        assert storage.storage_options(uri) == settings
        assert storage.storage_options(str(tmp_path)) == {}  # local paths take no options
        fs, path = storage.filesystem(uri)
        assert fs.cat(path) == ROWS
        result = ingest_dataset(uri, Path(tmp_path / "dataset"), storage_options=storage.storage_options(uri))
        assert result.num_train == 10
    finally:
        storage._block_settings.cache_clear()


def test_cli_reads_jobs_on_s3(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / "staging"))
    fs, root = s3fs.S3FileSystem(), f"s3://{bucket}/runs"
    spec, _ = load_spec(spec_dict(root))
    job = f"{bucket}/runs/s3-job-20261130-000000-abcdef"
    fs.pipe(f"{job}/spec.yaml", yaml.safe_dump(spec.model_dump(mode="json")).encode())
    metrics = [{"step": 1, "values": {"reward": 0.5}}, {"step": 2, "values": {"reward": 1.0}}]
    fs.pipe(f"{job}/metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics).encode())
    fs.pipe(f"{job}/events.jsonl", b'{"event": "grpoflow.job.started"}\n{"event": "grpoflow.job.completed"}\n')
    fs.pipe(f"{job}/model.json", b'{"artifact_type": "full", "files": [], "merged_files": ["model.safetensors"]}')
    fs.pipe(f"{job}/merged/model.safetensors", b"weights")
    job_id = job.rsplit("/", 1)[-1]

    code, out, _ = cli("jobs", "--output-uri", root, "--json")
    assert code == 0 and json.loads(out)["jobs"] == [
        {"job_id": job_id, "status": "completed", "steps": 2, "stopped_by": None}
    ]
    code, out, _ = cli("metrics", job_id, "--output-uri", root, "--keys", "reward", "--json")
    assert code == 0 and [m["values"]["reward"] for m in json.loads(out)["metrics"]] == [0.5, 1.0]
    code, out, _ = cli("model", job_id, "--output-uri", root, "--json")
    assert code == 0 and json.loads(out)["merged_dir"] == f"s3://{job}/merged"  # the weights stay on S3
    # `--output-uri s3://...` reaches the spec intact (not folded into a local "s3:/..." folder).
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_dict("runs")))
    code, out, _ = cli("validate", tmp_path / "spec.yaml", "--output-uri", root, "--json")
    assert code == 0 and json.loads(out)["output_uri"] == root


def test_resume_checks_a_job_on_s3(bucket, tmp_path, monkeypatch):
    from grpoflow.core.spec import to_yaml
    from grpoflow.flows.cli.run import UsageError, check_resume
    from grpoflow.integrations.job_folders import BadJobReference

    root = f"s3://{bucket}/runs"
    spec, _ = load_spec(spec_dict(root))
    s3fs.S3FileSystem().pipe(f"{bucket}/runs/s3-job-1/spec.yaml", to_yaml(spec).encode())

    check_resume(spec, "s3-job-1")  # its own spec: fine (this said "unknown job" before)
    with pytest.raises(UsageError, match=r"unknown job 'no-such-job' under s3://"):
        check_resume(spec, "no-such-job")
    changed, _ = load_spec(spec_dict(root), ["hyperparameters.max_steps=7"])
    with pytest.raises(UsageError, match="spec.yaml in: checkpoint_every, hyperparameters"):
        check_resume(changed, "s3-job-1")
    with pytest.raises(BadJobReference, match="--resume: not a job id: '../x'"):  # exit 2, as a UsageError
        check_resume(spec, "../x")


@pytest.mark.usefixtures("prefect_server", "standin")
def test_run_resume_on_s3_from_a_fresh_machine(bucket, tmp_path, monkeypatch, make_spec):
    monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / "staging"))
    root = f"s3://{bucket}/runs"
    spec = make_spec("s3-resume")
    code, out, err = cli("run", spec, "--output-uri", root, "--json")
    assert code == 0, err
    job_id = json.loads(out)["job_id"]
    fs = s3fs.S3FileSystem()
    fs.rm(f"{bucket}/runs/{job_id}/report.md")
    # Another machine: an empty staging folder, so the job folder comes from S3.
    monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / "other-machine"))

    code, out, err = cli("run", spec, "--output-uri", root, "--resume", job_id, "--json")

    assert code == 0, err
    assert json.loads(out)["output_dir"] == f"{root}/{job_id}"
    events = [json.loads(line) for line in fs.cat(f"{bucket}/runs/{job_id}/events.jsonl").decode().splitlines()]
    names = [e["event"] for e in events]
    assert names.count("grpoflow.training.completed") == 1  # GRPO was not redone on the other machine
    assert names.count("grpoflow.job.completed") == 2
    assert fs.exists(f"{bucket}/runs/{job_id}/report.md")
