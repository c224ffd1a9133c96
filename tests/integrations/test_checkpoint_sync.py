"""Checkpoints that survive losing the machine (`integrations/checkpoint_sync.py`), against moto's S3 server on
loopback through the real s3fs: each checkpoint goes up with a manifest last, a half-uploaded one is never taken, a
fresh machine downloads the newest intact one; and (slow) a real training job whose machine is lost mid-run resumes
from S3 with every step in metrics.jsonl exactly once, and a job whose store goes down mid-run and comes back ends as
promptly as any, on its own Prefect server, with the whole job folder in the store."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import s3fs
from moto.server import ThreadedMotoServer

from grpoflow.core.jobdir import JobDir
from grpoflow.integrations import storage
from grpoflow.integrations.checkpoint_sync import (
    MANIFEST,
    CheckpointSync,
    FileMirror,
    job_files,
    newest_remote_checkpoint,
    remote_manifest,
    restore_checkpoint,
    upload_checkpoint,
)
from grpoflow.trainers.metrics import read_metrics
from tests.conftest import cli
from tests.prefect_home import prefect_home
from tests.tasks.test_train import training_child


def fake_checkpoint(job: JobDir, step: int, weights: bytes = b"w" * 1000) -> Path:
    """A checkpoint folder as `Trainer` leaves it: weights, optimizer, and trainer_state.json (written last)."""
    path = job.checkpoints / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights + str(step).encode())
    (path / "optimizer.pt").write_bytes(b"o" * 500)
    (path / "nested").mkdir()
    (path / "nested" / "rng_state.pth").write_bytes(b"r" * 10)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


@pytest.fixture
def job(tmp_path) -> JobDir:
    job = JobDir(tmp_path / "staging" / "job-1")
    job.root.mkdir(parents=True)
    return job


def test_a_checkpoint_goes_up_and_comes_back(bucket, job, tmp_path):
    fs, remote = s3fs.S3FileSystem(), f"{bucket}/runs/job-1"
    manifest = upload_checkpoint(fs, fake_checkpoint(job, 4), f"{remote}/checkpoints/checkpoint-4")
    assert set(manifest["files"]) == {
        "model.safetensors",
        "optimizer.pt",
        "nested/rng_state.pth",
        "trainer_state.json",
    }
    assert remote_manifest(fs, f"{remote}/checkpoints/checkpoint-4") == manifest
    assert json.loads(fs.cat(f"{remote}/checkpoints/checkpoint-4/{MANIFEST}"))["step"] == 4

    fresh = JobDir(tmp_path / "other-machine" / "job-1")  # an empty staging folder
    assert restore_checkpoint(fresh, f"s3://{remote}") == "checkpoint-4"
    for name in manifest["files"]:
        local = job.checkpoints / "checkpoint-4" / name
        assert (fresh.checkpoints / "checkpoint-4" / name).read_bytes() == local.read_bytes()
    assert [p.name for p in fresh.checkpoints.iterdir()] == ["checkpoint-4"]  # no download folder left behind
    assert restore_checkpoint(fresh, f"s3://{remote}") is None  # the local one is as new: nothing to fetch


class BrokenStore(s3fs.S3FileSystem):
    """The real s3fs, whose connection dies at the `fail_at`-th file opened for writing (a lost machine mid-upload)."""

    fail_at, opened = 3, 0

    def open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            BrokenStore.opened += 1
            if BrokenStore.opened >= BrokenStore.fail_at:
                raise ConnectionError("machine lost")
        return super().open(path, mode, **kwargs)


class RotatingStore(s3fs.S3FileSystem):
    """The real s3fs, while the child's `save_total_limit` removes the local checkpoint as its second file goes up."""

    local, opened = None, 0

    def open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            RotatingStore.opened += 1
            if RotatingStore.opened == 2:
                shutil.rmtree(RotatingStore.local)
        return super().open(path, mode, **kwargs)


def damage(fs, ckpt: str, how: str) -> None:
    if how == "file missing":
        fs.rm_file(f"{ckpt}/optimizer.pt")
    elif how == "file shorter":
        fs.pipe(f"{ckpt}/optimizer.pt", b"o" * 499)
    elif how == "same size, other bytes":
        fs.pipe(f"{ckpt}/optimizer.pt", b"x" * 500)
    elif how == "manifest missing":
        fs.rm_file(f"{ckpt}/{MANIFEST}")
    elif how == "manifest of another step":
        manifest = json.loads(fs.cat(f"{ckpt}/{MANIFEST}"))
        fs.pipe(f"{ckpt}/{MANIFEST}", json.dumps({**manifest, "step": 2}).encode())


@pytest.mark.parametrize(
    "how",
    [
        "killed mid-upload",  # the connection dies after two files: no trainer_state.json, no manifest
        "rotated away mid-upload",  # the local folder removed while it went up: no manifest
        "manifest missing",  # every file there, the manifest never written
        "file missing",  # a manifest whose file is gone (a rotation racing the upload, a store's hiccup)
        "file shorter",  # a truncated object: its size is not the manifest's
        "same size, other bytes",  # caught on download by the sha256
        "manifest of another step",  # copied from elsewhere
    ],
)
def test_torn_uploads_are_never_taken(bucket, job, tmp_path, how):
    fs, remote = s3fs.S3FileSystem(), f"{bucket}/runs/job-1"
    upload_checkpoint(fs, fake_checkpoint(job, 2), f"{remote}/checkpoints/checkpoint-2")
    newer, ckpt = fake_checkpoint(job, 4), f"{remote}/checkpoints/checkpoint-4"
    if how == "killed mid-upload":
        BrokenStore.opened = 0
        with pytest.raises(ConnectionError):
            upload_checkpoint(BrokenStore(skip_instance_cache=True), newer, ckpt)
        fs.invalidate_cache()
        assert len(fs.find(ckpt)) == 2 and not fs.exists(f"{ckpt}/trainer_state.json")  # the marker goes last
    elif how == "rotated away mid-upload":
        RotatingStore.local, RotatingStore.opened = newer, 0
        with pytest.raises(FileNotFoundError):
            upload_checkpoint(RotatingStore(skip_instance_cache=True), newer, ckpt)
        assert not fs.exists(f"{ckpt}/{MANIFEST}")
    else:
        upload_checkpoint(fs, newer, ckpt)
        damage(fs, ckpt, how)

    fresh = JobDir(tmp_path / "other-machine" / "job-1")
    assert restore_checkpoint(fresh, f"s3://{remote}") == "checkpoint-2"  # the newest intact one
    assert sorted(p.name for p in fresh.checkpoints.iterdir()) == ["checkpoint-2"]
    if how != "same size, other bytes":  # that one a listing cannot tell: the download's sha256 does
        assert newest_remote_checkpoint(fs, f"{remote}/checkpoints")[0].endswith("checkpoint-2")


def test_the_sync_thread_mirrors_a_training_job(bucket, job):
    """A stand-in for the training child writes what `grpoflow.trainers.grpo` writes (metrics, logs, checkpoints every
    2 steps, `save_total_limit: 2`); the thread mirrors it while it runs."""
    fs, remote = s3fs.S3FileSystem(), f"{bucket}/runs/job-1"
    job.spec.write_text("name: job\n")
    (job.root / ".lock").write_text("{}")
    sync = CheckpointSync(job, f"s3://{remote}")
    sync.start()
    try:
        for step in range(1, 7):
            with job.metrics.open("a") as f:
                f.write(json.dumps({"step": step, "values": {"loss": 0.1}}) + "\n")
            job.logs.mkdir(exist_ok=True)
            (job.logs / "train.log").write_text(f"step {step}\n")
            if step % 2 == 0:
                fake_checkpoint(job, step)
                for old in sorted(job.checkpoints.glob("checkpoint-*"), key=lambda p: int(p.name[11:]))[:-2]:
                    shutil.rmtree(old)  # what the Trainer's rotation does
                deadline = time.monotonic() + 60
                while sync.uploaded != f"checkpoint-{step}" and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert sync.uploaded == f"checkpoint-{step}"
                # Its metrics went up before it: the remote never holds a checkpoint newer than its metrics.
                steps = [json.loads(line)["step"] for line in fs.cat(f"{remote}/metrics.jsonl").splitlines()]
                assert steps[-1] >= step
    finally:
        sync.stop()
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{remote}/checkpoints")) == ["checkpoint-4", "checkpoint-6"]
    assert fs.cat(f"{remote}/metrics.jsonl") == job.metrics.read_bytes()
    assert fs.cat(f"{remote}/logs/train.log") == b"step 6\n"
    assert not fs.exists(f"{remote}/.lock")
    assert [u["checkpoint"] for u in sync.uploads] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert sync.summary()["checkpoints"] == 3 and sync.errors == 0


def test_unchanged_files_are_not_sent_again(bucket, job):
    fs, remote = s3fs.S3FileSystem(), f"{bucket}/runs/job-1"
    job.spec.write_text("name: job\n")
    job.metrics.write_text('{"step": 1, "values": {}}\n')
    assert FileMirror(fs, job, remote).push() == 2
    assert FileMirror(fs, job, remote).push() == 0  # a new mirror (the job's end, a retry) asks the remote first
    job.metrics.write_text('{"step": 1, "values": {}}\n{"step": 2, "val')  # the child is writing step 2
    mirror = FileMirror(fs, job, remote)
    assert mirror.push() == 1 and mirror.push() == 0
    assert fs.cat(f"{remote}/metrics.jsonl") == b'{"step": 1, "values": {}}\n'  # up to the last complete line


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_lost_machine_resumes_from_s3_with_each_step_once(bucket, tmp_path, monkeypatch, make_spec, standin):
    """A job on s3://: its machine is lost (the `grpoflow run` process and its training child SIGKILLed) after a
    checkpoint reached S3; its staging folder is gone. `--resume` on another machine downloads the newest intact
    checkpoint and trains only the steps after it. The child is the stand-in (tests/standin_child.py), paced at 0.3 s
    a step (unpaced, all 12 steps can end before the first upload is seen); what is uploaded and restored is the
    sync's work, whatever the checkpoint holds (files of every kind: test_a_checkpoint_goes_up_and_comes_back; a
    real run's checkpoints through S3: tests/cluster/test_multinode.py)."""
    from prefect.settings import PREFECT_API_URL

    standin(step_seconds=0.3)

    root, fs = f"s3://{bucket}/runs", s3fs.S3FileSystem()
    spec = make_spec(
        "lost",
        hyperparameters={"max_steps": 12, "rollouts_per_prompt": 2, "max_response_length": 4},
        checkpoint_every=3,
        evaluation={"holdout": 0},
    )
    staging = tmp_path / "staging"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), storage.STAGING_ENV: str(staging)}
    command = [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--output-uri", root, "--json"]
    run = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, job_id, uploaded = time.monotonic() + 600, None, None
        while time.monotonic() < deadline and not uploaded and run.poll() is None:
            jobs = list(staging.glob("lost-*"))
            job_id = jobs[0].name if jobs else None
            uploaded = job_id and newest_remote_checkpoint(fs, f"{bucket}/runs/{job_id}/checkpoints")
            time.sleep(0.2)
        assert uploaded, "no checkpoint reached S3"
        child = training_child(staging / job_id)
        os.killpg(run.pid, signal.SIGKILL)  # the machine is lost: the task process, then its training child
        if child is not None:
            child.kill()
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    kept = int(uploaded[0].rsplit("-", 1)[1])
    lost = read_metrics(JobDir(staging / job_id).metrics)[-1]["step"]
    assert 3 <= kept < 12
    shutil.rmtree(staging)

    monkeypatch.setenv(storage.STAGING_ENV, str(tmp_path / "other-machine"))
    code, out, err = cli("run", spec, "--output-uri", root, "--resume", job_id, "--json")

    assert code == 0, err
    remote = f"{bucket}/runs/{job_id}"
    steps = [json.loads(line)["step"] for line in fs.cat(f"{remote}/metrics.jsonl").splitlines()]
    assert steps == list(range(1, 13)), (kept, lost)  # every step exactly once
    training = json.loads(fs.cat(f"{remote}/training.json"))
    assert int(training["resumed_from"].rsplit("-", 1)[1]) >= kept  # from S3, not from scratch
    fs.invalidate_cache()
    assert len(fs.ls(f"{remote}/checkpoints")) <= 2  # save_total_limit, remotely too


def prefect_servers(pid: int) -> set[int]:
    """The Prefect servers process `pid` started: its `prefect server start` (grpoflow's temporary server) and any
    `uvicorn ... prefect.server.api.server:create_app` (Prefect's ephemeral one, started by its client)."""
    found = set()
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:  # it exited
        return found
    for child in children:
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "prefect server start" in command or "prefect.server.api.server:create_app" in command:
            found.add(child.pid)
    return found


def watch_servers(run: subprocess.Popen, servers: set[int], done, until: float) -> None:
    """Waits until `done()` or the monotonic time `until`, adding the Prefect servers `run` started to `servers`."""
    while not done() and time.monotonic() < until:
        servers |= prefect_servers(run.pid)
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


OUTAGE_S = 4.0


@pytest.mark.slow
def test_a_store_outage_mid_run_starts_no_second_server_and_delays_no_exit(bucket, tmp_path, make_spec, standin):
    """`grpoflow run` on its temporary Prefect server (no PREFECT_API_URL), its output_uri on an S3 store (moto, the
    session's buckets, on a port of its own) that goes down for OUTAGE_S seconds once the first checkpoint is up, and
    comes back on the same port (issue 28: the upload thread's first log line booted Prefect's ephemeral server beside
    grpoflow's, and the run hung for minutes after "Completed"). The uploads fail and are retried through the outage;
    the run starts no second Prefect server, exits within seconds of its flow run's end, and the store holds the job
    folder as it ended. The training child is the stand-in (tests/standin_child.py), 40 steps of 0.2 s."""
    standin(step_seconds=0.2)
    port, fs = free_port(), s3fs.S3FileSystem()
    store = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    store.start()
    spec = make_spec(
        "outage",
        hyperparameters={"max_steps": 40, "rollouts_per_prompt": 2, "max_response_length": 4},
        checkpoint_every=5,
        evaluation={"holdout": 0},
        output_uri=f"s3://{bucket}/runs",
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "PREFECT_HOME": prefect_home(tmp_path / "prefect-home"),  # its database migrated
        storage.STAGING_ENV: str(tmp_path / "staging"),
        # Each request fails at once while the store is down (botocore's own retries would outlast a short outage):
        # the thread's next rounds retry, and say so in the run's log, from the thread.
        "AWS_MAX_ATTEMPTS": "1",
    }
    command = [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--json"]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, completed_at, servers = [], [], set()

    def read_stderr() -> None:
        for line in run.stderr:
            lines.append(line)
            if "Flow run" in line and "Finished in state Completed" in line:
                completed_at.append(time.monotonic())

    def first_upload() -> bool:
        fs.invalidate_cache()
        return bool(fs.glob(f"{bucket}/runs/*/checkpoints/*/{MANIFEST}")) or run.poll() is not None

    threading.Thread(target=read_stderr, daemon=True).start()
    deadline = time.monotonic() + 120
    try:
        watch_servers(run, servers, first_upload, deadline)
        assert run.poll() is None, "".join(lines)[-3000:]
        store.stop()  # down mid-run: the next checkpoints are saved meanwhile
        watch_servers(run, servers, lambda: False, time.monotonic() + OUTAGE_S)
        store = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        store.start()
        watch_servers(run, servers, lambda: run.poll() is not None, deadline)
        exited_at = time.monotonic()
        assert run.wait(timeout=max(deadline - exited_at, 1)) == 0, "".join(lines)[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
        store.stop()
    stderr = "".join(lines)
    assert "failed (retried)" in stderr  # the outage hit the uploads
    # grpoflow's temporary server only: no ephemeral one of Prefect's (its "Starting temporary server on ..." line).
    assert len(servers) == 1 and "Starting temporary server" not in stderr, f"{len(servers)} servers: {stderr[-3000:]}"
    assert exited_at - completed_at[0] < 60  # seconds (on a busy machine), not the minutes of issue 28

    job_id = json.loads(run.stdout.read().strip().splitlines()[-1])["job_id"]
    job, remote = JobDir(tmp_path / "staging" / job_id), f"{bucket}/runs/{job_id}"
    fs.invalidate_cache()
    assert {p.relative_to(job.root).as_posix(): p.stat().st_size for p in job_files(job)} == {
        name.removeprefix(remote + "/"): info["size"]
        for name, info in fs.find(remote, detail=True).items()
        if "/checkpoints/" not in name and not name.rsplit("/", 1)[-1].startswith(".")
    }
    assert newest_remote_checkpoint(fs, f"{remote}/checkpoints")[0].endswith("checkpoint-40")
