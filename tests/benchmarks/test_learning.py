"""benchmarks/learning.py: each variant's spec says what the variant means, the summary's arithmetic, and (slow) that
`--quick` runs the pipeline's stages and reports every figure. It never asserts a gain: that is the benchmark's to
report."""

import json
import subprocess
import sys

import pytest

from benchmarks.common import REPO_ROOT, bench_env
from benchmarks.learning import SEEDS, VARIANTS, summarize, table, variant_spec
from grpoflow.trainers.spec import load_spec


@pytest.mark.parametrize(
    "variant, loss_type, sft",
    [
        ("grpo", "grpo", True),
        ("dr_grpo", "dr_grpo", True),
        ("dapo", "dapo", True),
        ("dapo-no-sft", "dapo", False),  # the demo's spec turns the warm-up on; this variant turns it off
    ],
)
def test_variant_spec_is_the_demo_with_one_change(variant, loss_type, sft, tmp_path):
    for seed in SEEDS:
        spec, _ = load_spec(variant_spec(variant, seed, tmp_path, quick=False))
        assert spec.trl == {"loss_type": loss_type} and spec.sft.enabled is sft
        assert spec.hyperparameters.seed == seed and spec.output_uri == str(tmp_path)
        # The rest is the demo's: its step counts and held-out size.
        assert (spec.hyperparameters.max_steps, spec.sft.max_steps, spec.evaluation.holdout) == (300, 600, 40)
    assert set(VARIANTS) == {"grpo", "dr_grpo", "dapo", "dapo-no-sft"}


def test_quick_spec_shortens_the_run_only(tmp_path):
    spec, _ = load_spec(variant_spec("grpo", 42, tmp_path, quick=True))
    assert (spec.hyperparameters.max_steps, spec.sft.max_steps, spec.evaluation.holdout) == (3, 20, 8)
    assert spec.hyperparameters.learning_rate == 1e-4 and spec.trl == {"loss_type": "grpo"}


def test_summary_gives_mean_spread_and_range_per_variant():
    runs = [
        {"variant": "grpo", "seed": s, "metric": "exact_answer", "before": b, "after": a, "gain": a - b}
        for s, b, a in [(1, 0.1, 0.5), (2, 0.2, 0.4), (3, 0.0, 0.6)]
    ] + [{"variant": "dapo", "seed": 1, "metric": "exact_answer", "before": 0.1, "after": 0.2, "gain": 0.1}]
    summary = summarize(runs)
    gain = summary["grpo"]["gain"]
    assert gain["mean"] == pytest.approx(0.4) and gain["sd"] == pytest.approx(0.2)
    assert (gain["min"], gain["max"]) == (pytest.approx(0.2), pytest.approx(0.6))
    assert summary["dapo"]["gain"]["sd"] is None  # one seed: no spread
    text = table(summary, runs)
    assert "0.4 ± 0.2" in text and "| dapo | 1 |" in text


@pytest.mark.slow
def test_quick_mode_runs_the_stages_and_reports_every_figure(tmp_path):
    path = tmp_path / "learning.json"
    command = [sys.executable, "-m", "benchmarks.learning", "--quick", "--variants", "grpo", "--json", str(path)]
    proc = subprocess.run(command, cwd=REPO_ROOT, env=bench_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(path.read_text())
    assert data["benchmark"] == "learning" and data["quick"] is True and "| grpo | 1 |" in data["table"]
    (run,) = data["runs"]
    assert (run["loss_type"], run["sft"], run["n"], run["metric"]) == ("grpo", True, 8, "exact_answer")
    assert run["sft_s"] > 0 and run["grpo_s"] > 0
    assert run["gain"] == pytest.approx(run["after"] - run["before"])
    assert set(data["summary"]["grpo"]) == {"seeds", "before", "after", "gain"}
