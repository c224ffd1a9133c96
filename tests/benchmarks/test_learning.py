"""benchmarks/learning.py: each variant's spec says what the variant means, the summary's arithmetic, and (slow) that
`--quick` runs the pipeline's stages and reports every figure. It never asserts a gain: that is the benchmark's to
report."""

import json
import subprocess
import sys

import pytest
import yaml

from benchmarks.common import REPO_ROOT, bench_env
from benchmarks.learning import SEEDS, VARIANTS, summarize, table, variant_spec
from grpoflow.core.spec import load_spec


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


@pytest.mark.bench  # a benchmark's quick run that trains: `make bench` runs it first (tests/benchmarks/test_quick.py)
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
    # Each held-out prompt's score before and after, as evaluation/step-N.parquet keeps them: the interval's input.
    assert len(run["scores"]["before"]) == len(run["scores"]["after"]) == 8
    assert sum(run["scores"]["after"]) / 8 - sum(run["scores"]["before"]) / 8 == pytest.approx(run["gain"])
    assert " to " in data["table"].splitlines()[2].split(" | ")[5]  # the gain's interval, not "-"
    assert set(data["summary"]["grpo"]) == {"seeds", "before", "after", "gain"}


def test_real_spec_is_the_example_at_the_seed(tmp_path):
    from benchmarks.learning import REAL_SPEC, real_spec

    example = yaml.safe_load(REAL_SPEC.read_text())
    for seed in SEEDS:
        spec, _ = load_spec(real_spec(seed, tmp_path, quick=False))
        assert spec.hyperparameters.seed == seed and spec.output_uri == str(tmp_path)
        assert spec.base_model == str(REPO_ROOT / example["base_model"])  # absolute: the job runs from anywhere
        assert spec.hyperparameters.max_steps == example["hyperparameters"]["max_steps"]
        assert (spec.evaluation.select, spec.evaluation.every) == ("best", example["evaluation"]["every"])
    quick, _ = load_spec(real_spec(42, tmp_path, quick=True))
    assert (quick.hyperparameters.max_steps, quick.evaluation.holdout, quick.evaluation.every) == (2, 4, 1)


def test_real_table_gives_each_seed_then_mean_spread_and_range():
    from benchmarks.learning import real_table

    runs = [
        {"seed": s, "metric": "numeric_match", "before": b, "last": last, "kept": k, "kept_step": step,
         "gain": k - b, "wall_s": w}
        for s, b, last, k, step, w in [(42, 0.2, 0.3, 0.4, 30, 900.0), (43, 0.2, 0.1, 0.2, 0, 1000.0)]
    ]  # fmt: skip
    table_lines = real_table(runs).splitlines()
    assert "held-out numeric_match before" in table_lines[0] and "kept (select: best)" in table_lines[0]
    # No prompt scores kept (a result from before they were): no interval, "-".
    assert table_lines[2].startswith("| 42 | 0.2 | 0.3 | 0.4 | 30 | 0.2 | - | 900 |")
    assert (
        table_lines[4] == "| mean ± sd | 0.2 ± 0 | 0.2 ± 0.141 | 0.3 ± 0.141 | 30, 0 | 0.1 ± 0.141 | - | 950 ± 70.7 |"
    )
    assert table_lines[5].startswith("| range | 0.2 to 0.2 | 0.1 to 0.3 | 0.2 to 0.4 |  | 0 to 0.2 |  |")


def test_the_gain_interval_is_the_paired_bootstrap_over_the_seeds_prompts():
    """Each seed's row: the paired interval over its own prompts; the mean's: over the seeds' prompts pooled."""
    from benchmarks.learning import real_table
    from grpoflow.core.scores import intervals

    first = {"before": [0, 0, 1, 0] * 10, "after": [1, 0, 1, 1] * 10}  # 40 prompts: 0.25 -> 0.75
    second = {"before": [0, 1] * 20, "after": [0, 1] * 20}  # no change on any prompt
    runs = [
        {"seed": s, "metric": "numeric_match", "before": 0.0, "last": 0.0, "kept": 0.0, "kept_step": 0, "gain": 0.0,
         "wall_s": 1.0, "scores": scores}
        for s, scores in [(42, first), (43, second)]
    ]  # fmt: skip
    rows = [line.split(" | ") for line in real_table(runs).splitlines()]
    column = rows[0].index("gain 95% CI")

    def interval(*each):
        low, high = intervals([v for s in each for v in s["before"]], [v for s in each for v in s["after"]])["gain"]
        return f"{low:.3g} to {high:.3g}"

    assert rows[2][column] == interval(first) and float(interval(first).split()[0]) > 0.3  # +0.5: clear of 0
    assert rows[3][column] == "0 to 0"  # the same score on every prompt: no doubt at all
    assert rows[4][column] == interval(first, second)
    low, high = map(float, rows[4][column].split(" to "))
    assert 0 < low < 0.25 < high  # pooled: +0.25 (a quarter of the 80 prompts went 0 -> 1), narrower than +/- 0.25
    runs[1].pop("scores")  # one seed without its prompts' scores: no pooled interval
    assert real_table(runs).splitlines()[4].split(" | ")[column] == "-"


@pytest.mark.slow
@pytest.mark.skipif(
    not (REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file(), reason="needs `make demo-real`'s file"
)
def test_real_quick_trains_merges_and_scores_the_real_model(tmp_path):
    path = tmp_path / "learning-real.json"
    command = [sys.executable, "-m", "benchmarks.learning", "--real", "--quick", "--json", str(path)]
    env = bench_env(GRPOFLOW_CACHE=str(tmp_path / "cache"))  # the GGUF file converted here, not in the user's cache
    proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(path.read_text())
    (run,) = data["runs"]
    assert (run["seed"], run["n"], run["metric"], data["max_steps"]) == (42, 4, "numeric_match", 2)
    assert [point["step"] for point in run["series"]] == [0, 1, 2]  # scored before, and at each step (every: 1)
    assert run["kept_step"] in (0, 1, 2) and run["gain"] == pytest.approx(run["kept"] - run["before"])
    assert len(run["scores"]["before"]) == len(run["scores"]["after"]) == 4
    assert "| 42 |" in data["table"] and "| mean ± sd |" in data["table"]
