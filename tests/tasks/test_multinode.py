"""Several machines per training job (`tasks/multinode.py`, `tasks/node.py`), without a cluster: every "machine" is
its own process tree on loopback (gloo over 127.0.0.1) with its own staging folder, fed from the S3-protocol server
(moto); and the training task's create/watch/logs/cleanup path against a Kubernetes API on loopback
(`tests/k8s_api_server.py`) whose pods are real local processes running the Job's container command."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import s3fs

from tasks.checkpoint_sync import FileMirror, newest_remote_checkpoint
from trainers.jobdir import JobDir
from trainers.launch import Machines, child_command

REPO = Path(__file__).resolve().parents[2]
SPEC = {
    "hyperparameters": {"max_steps": 4, "rollouts_per_prompt": 2, "max_response_length": 4},
    "checkpoint_every": 2,
    "evaluation": {"holdout": 0},
    "distributed": {"num_machines": 2},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote_job(make_job, bucket: str, name: str, **changes) -> tuple[JobDir, str]:
    """A job folder as create-job and ingest leave it, uploaded to `s3://<bucket>/runs/<job_id>`, as the training
    task uploads it before it creates the Job."""
    job, spec = make_job(name, output_uri=f"s3://{bucket}/runs", **{**SPEC, **changes})
    FileMirror(s3fs.S3FileSystem(), job, f"{bucket}/runs/{job.job_id}").push()
    return job, f"s3://{bucket}/runs/{job.job_id}"


def remote_steps(location: str) -> list[int]:
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return [json.loads(line)["step"] for line in fs.cat(f"{location}/metrics.jsonl").splitlines()]


# --- the launch command ----------------------------------------------------------------------------------------------


def test_child_command_spans_machines(tmp_path):
    job = JobDir(tmp_path / "job")
    command = child_command("trainers.grpo", job, 8, "ddp", Machines(4, 3, "grpo-x-0.grpo-x.ml.svc", 29500))
    assert command[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    args = {flag: command[command.index(flag) + 1] for flag in command if flag.startswith("--")}
    assert args["--num_machines"] == "4" and args["--machine_rank"] == "3"
    assert args["--main_process_ip"] == "grpo-x-0.grpo-x.ml.svc" and args["--main_process_port"] == "29500"
    assert args["--num_processes"] == "32"  # every machine's
    # One process per machine still goes through accelerate launch (the rendezvous is its).
    one = child_command("trainers.grpo", job, 1, "ddp", Machines(2, 0, "127.0.0.1"))
    assert "--multi_gpu" in one and one[one.index("--num_processes") + 1] == "2"
    assert child_command("trainers.grpo", job, 1, "ddp") == [sys.executable, "-m", "trainers.grpo", str(job.root)]


# --- two machines on loopback ----------------------------------------------------------------------------------------


def start_node(location: str, rank: int, port: int, staging: Path, s3_env: dict, log: Path) -> subprocess.Popen:
    """One "machine": `python -m tasks.node` as a pod runs it, with its own staging folder and JOB_COMPLETION_INDEX."""
    env = {
        **os.environ,
        **s3_env,
        "JOB_COMPLETION_INDEX": str(rank),
        "GRPOFLOW_STAGING_DIR": str(staging),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "tasks.node", location, "--main-process-ip", "127.0.0.1"]
    command += ["--main-process-port", str(port)]
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_two_machines_train_one_job_on_loopback(make_job, bucket, s3_env, tmp_path):
    job, location = remote_job(make_job, bucket, "two")
    port, logs = free_port(), [tmp_path / "node-0.log", tmp_path / "node-1.log"]
    nodes = [start_node(location, r, port, tmp_path / f"machine-{r}", s3_env, logs[r]) for r in (0, 1)]
    try:
        codes = [node.wait(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    out = [log.read_text() for log in logs]
    assert codes == [0, 0], out
    # Both ranks took part: one gloo group of two processes, and the second machine's own child trained every step.
    assert "distributed: ddp over 2 process(es)" in out[0]
    assert "machine 1 of 2" in out[1] and "machine 1 done" in out[1]
    other = JobDir(tmp_path / "machine-1" / job.job_id)
    assert json.loads(other.training_result.read_text())["global_step"] == 4
    assert not (tmp_path / "machine-1" / job.job_id / "merged").exists()  # only the main process saves
    # The results reached the store, from rank 0 only, each step once.
    assert remote_steps(location) == [1, 2, 3, 4]
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    assert fs.exists(f"{location}/merged/model.safetensors")
    assert json.loads(fs.cat(f"{location}/training.json"))["global_step"] == 4
    assert newest_remote_checkpoint(fs, f"{location.removeprefix('s3://')}/checkpoints")[0].endswith("checkpoint-4")
    assert fs.exists(f"{location}/logs/machine-0.log") and not fs.exists(f"{location}/logs/machine-1.log")


def kill_after_checkpoint(node: subprocess.Popen, location: str, timeout: float = 600) -> int:
    fs, deadline = s3fs.S3FileSystem(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := newest_remote_checkpoint(fs, f"{location.removeprefix('s3://')}/checkpoints"):
            os.kill(node.pid, signal.SIGKILL)
            return int(found[0].rsplit("-", 1)[1])
        time.sleep(0.2)
    raise AssertionError("no checkpoint reached the store")
