"""The training child itself: killed with SIGKILL and started again, it resumes bit-exactly from its checkpoint."""

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import arithmetic_rows, write_jsonl
from trainers.dataset import ingest_dataset
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics
from trainers.spec import load_spec, to_yaml

pytestmark = pytest.mark.slow


def test_killed_and_resumed_matches_uninterrupted(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(40))
    spec, _ = load_spec(
        {
            "name": "det",
            "base_model": "builtin:tiny",
            "dataset": {"uri": str(data)},
            "rewards": [{"name": "exact_answer"}, {"name": "length_penalty", "kwargs": {"max_chars": 4}}],
            "hyperparameters": {"max_steps": 20, "rollouts_per_prompt": 4, "max_response_length": 8},
            "checkpoint_every": 5,
            "evaluation": {"holdout": 0},
        }
    )

    def job(name: str) -> JobDir:
        j = JobDir(tmp_path / name)
        shutil.rmtree(j.root, ignore_errors=True)
        j.root.mkdir()
        j.spec.write_text(to_yaml(spec))
        ingest_dataset(spec.dataset.uri, j.dataset)
        return j

    def child(j: JobDir) -> subprocess.Popen:
        log = (j.root / "train.log").open("ab")
        return subprocess.Popen([sys.executable, "-m", "trainers.grpo", str(j.root)], stdout=log, stderr=log)

    straight = job("straight")
    assert child(straight).wait() == 0

    killed = job("killed")
    proc = child(killed)
    while not read_metrics(killed.metrics) or read_metrics(killed.metrics)[-1]["step"] < 12:
        assert proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert child(killed).wait() == 0

    a, b = read_metrics(straight.metrics), read_metrics(killed.metrics)
    assert [r["step"] for r in b] == list(range(1, 21))
    drop = {"step_time"}  # wall-clock, the only value allowed to differ
    assert [{k: v for k, v in r["values"].items() if k not in drop} for r in a] == [
        {k: v for k, v in r["values"].items() if k not in drop} for r in b
    ]
    wa, wb = load_file(Path(straight.merged) / "model.safetensors"), load_file(killed.merged / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
