"""`gpu_count > 1`: the training child runs under `accelerate launch --multi_gpu --num_processes gpu_count`. On a CPU
machine accelerate starts that many gloo processes, so the real launch path runs here with 2 processes."""

import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from trainers.dataset import ingest_dataset
from trainers.jobdir import JobDir
from trainers.launch import check_exit, child_command, start_child, stop_child
from trainers.metrics import read_metrics
from trainers.spec import load_spec, to_yaml


def test_child_command():
    job = JobDir(Path("/runs/j"))
    assert child_command("trainers.grpo", job, 1) == [sys.executable, "-m", "trainers.grpo", "/runs/j"]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "4"]
    assert child_command("trainers.grpo", job, 4) == [*launch, "-m", "trainers.grpo", "/runs/j"]


def training_processes(proc) -> int:
    """The launcher's descendants that run the trainer (the launcher's own command line names it too)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    count = 0
    for child in children:
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        count += "trainers.grpo" in cmdline and "accelerate" not in cmdline
    return count


@pytest.mark.slow
def test_grpo_on_two_processes(make_spec, tmp_path):
    spec, _ = load_spec(make_spec("two", gpu_count=2, hyperparameters={"max_steps": 2, "rollouts_per_prompt": 2}))
    job = JobDir(tmp_path / "runs" / "two")
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset)

    proc = start_child(child_command("trainers.grpo", job, spec.gpu_count), job.logs / "train.log")
    most = 0
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            most = max(most, training_processes(proc))
            time.sleep(0.2)
    finally:
        stop_child(proc)
    check_exit(proc, "training", job.logs / "train.log")

    assert most == 2  # two ranks trained, one group of 2 rollouts split between them
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]  # logged once, by the main process
    assert (job.merged / "model.safetensors").exists()
    assert yaml.safe_load(job.spec.read_text())["gpu_count"] == 2
