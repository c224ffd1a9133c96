"""Two `grpoflow run` at once under one output root: separate job folders, nothing shared or clobbered. The training
children are the stand-in (tests/standin_child.py): what is tested is the runs around them."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.trainers.metrics import read_events, read_metrics
from tests.prefect_home import prefect_home

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("standin")]


def test_two_runs_at_once(make_spec, tmp_path):
    spec = make_spec("twins", hyperparameters={"rollouts_per_prompt": 2, "max_response_length": 4})
    # Ephemeral Prefect in both, sharing one PREFECT_HOME as two shells of one user would.
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=900) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert results[0]["job_id"] != results[1]["job_id"]
    for result in results:
        job = JobDir(Path(result["output_dir"]))
        assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3]
        events = read_events(job.events)
        assert {e["resource"]["grpoflow.job_id"] for e in events} == {job.job_id}  # no event of the other job
        assert events[-1]["event"] == "grpoflow.job.completed"
    leftovers = [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temp files or staging folders left behind


def test_two_resumes_of_one_job_at_once(make_spec, tmp_path):
    # No held-out evaluation: what is tested is the job's lock (test_two_runs_at_once keeps it, for its files).
    spec = make_spec(
        "resumed-twice",
        hyperparameters={"rollouts_per_prompt": 2, "max_response_length": 4},
        evaluation={"holdout": 0},
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = prefect_home(tmp_path / "prefect-home")  # its database migrated: the resumes are tested
    first = subprocess.run(
        [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--json"],
        capture_output=True,
        env=env,
        text=True,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    job = JobDir(Path(json.loads(first.stdout.strip().splitlines()[-1])["output_dir"]))
    # Unfinished again, as if killed after its first checkpoint: two steps are left to train.
    for name in ("training.json", "report.md", "checkpoints/checkpoint-2", "checkpoints/checkpoint-3"):
        shutil.rmtree(job.root / name) if (job.root / name).is_dir() else (job.root / name).unlink()
    command = [sys.executable, "-m", "grpoflow.flows.cli", "run", str(spec), "--resume", job.job_id, "--json"]
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True) for _ in "ab"
    ]
    outputs = [run.communicate(timeout=900) for run in runs]

    codes = sorted(run.returncode for run in runs)
    assert codes == [0, 2], [err[-2000:] for _, err in outputs]
    loser = next(err for run, (_, err) in zip(runs, outputs, strict=True) if run.returncode == 2)
    assert f"job {job.job_id} is being run by pid" in loser
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3]  # each step once
    names = [e["event"] for e in read_events(job.events)]
    assert names.count("grpoflow.job.completed") == 2  # the first run's and the winner's
    assert not (job.root / ".lock").exists()  # released when the winner ended
