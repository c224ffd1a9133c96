"""A real GRPO run pushed into policy collapse (learning rate 1e-2 on builtin:tiny) raises the collapse alert."""

import contextlib
import io
from pathlib import Path

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.flows.cli import EXAMPLES, main
from grpoflow.trainers.metrics import read_events, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]


def test_collapse_alert_stops_the_run(tmp_path):
    overrides = {
        "dataset.uri": EXAMPLES / "data" / "arithmetic.jsonl",
        "sft.max_steps": 200,  # enough warm-up for groups with mixed rewards, so there is variance to lose
        "hyperparameters.learning_rate": 1e-2,  # 100x the demo's rate: the policy collapses within ~20 steps
        "hyperparameters.rollouts_per_prompt": 4,
        "hyperparameters.max_steps": 80,
        "evaluation.holdout": 0,
        "stop_on_alert": True,
        "output_uri": tmp_path / "runs",
    }
    argv = ["run", str(EXAMPLES / "arithmetic.yaml")]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    assert code == 4, err.getvalue()[-2000:]  # stopped by the monitor: its own code, not a crash's 1

    job = JobDir(next((tmp_path / "runs").iterdir()))
    events = read_events(job.events)
    alerts = [e["payload"] for e in events if e["event"] == "grpoflow.training.alert"]
    assert "policy_collapse" in {a["kind"] for a in alerts}
    collapse = next(a for a in alerts if a["kind"] == "policy_collapse")
    assert "learning_rate" in collapse["advice"] and collapse["evidence"]
    assert events[-1]["event"] == "grpoflow.job.failed" and events[-1]["payload"]["reason"] == "TrainingStopped"
    assert read_metrics(job.metrics)[-1]["step"] < 80  # stopped early, before max_steps
    assert Path(job.root / "checkpoints").exists()
