"""Tests for jobs/report.py: the PNG plots and report.md of a job folder, from a real spec and metrics file."""

import json
import math
from pathlib import Path

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.jobs.report import held_out_figure, held_out_limits, plot_held_out, plot_metrics, write_report
from grpoflow.trainers.health import HealthMonitor

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASE_SPEC = {
    "name": "t",
    "base_model": "builtin:tiny",
    "dataset": {"uri": "x.jsonl"},
    "rewards": [{"name": "exact_answer"}],
}
EVALUATION = {"metric": "exact_answer", "n": 20, "before": 0.35, "after": 0.6}


def make_job(tmp_path: Path, spec_overrides=(), n_steps=60, kl=False) -> tuple[JobDir, object]:
    """A job folder with spec.yaml and a synthetic metrics.jsonl (n_steps steps; kl logged when `kl`)."""
    spec, _ = load_spec(BASE_SPEC, spec_overrides)
    job = JobDir(tmp_path / "t-20250101-000000")
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    lines = []
    for step in range(1, n_steps + 1):
        values = {
            "reward": 0.2 + 0.6 * step / n_steps + 0.05 * math.sin(step),
            "reward_std": 0.3 - 0.002 * step,
            "loss": 0.01 * math.cos(step),
            "completions/mean_length": 40 + step / 2,
            "entropy": 1.2 - 0.01 * step,
            "rewards/exact_answer/mean": 0.2 + 0.6 * step / n_steps,
            "grad_norm": None if step == 3 else 0.5,  # a NaN in the log is written as null
        }
        if kl:
            values["kl"] = 0.001 * step
        lines.append(json.dumps({"step": step, "values": values}))
    job.metrics.write_text("\n".join(lines) + ("\n" if lines else ""))
    return job, spec


def assert_png(path: Path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5_000, f"{path} is only {len(data)} bytes"  # a real plot, not an empty canvas


def test_report_with_kl(tmp_path):
    job, spec = make_job(tmp_path, ["hyperparameters.kl_coef=0.04", "hyperparameters.rollouts_per_prompt=4"], kl=True)
    alerts = [a.to_dict() for a in HealthMonitor(max_response_length=64, kl_coef=0.04, window=5).check([])]
    path = write_report(job, spec, EVALUATION, alerts, extra={"wall_time_s": 3725})
    assert path == job.report and path.exists()
    for name in ("reward", "reward_std", "completions_mean_length", "entropy", "kl"):
        assert_png(job.root / f"{name}.png")
        assert f"![{name}]({name}.png)" in path.read_text()
    text = path.read_text()
    assert text.startswith("# GRPO job report: t-20250101-000000")
    # Hyperparameters: overridden and default values, in the table.
    assert "| kl_coef | 0.04 |" in text
    assert "| rollouts_per_prompt | 4 |" in text
    assert "| learning_rate | 1e-06 |" in text
    assert "| max_steps | 100 |" in text
    assert "| lora_rank | null |" in text
    # Held-out evaluation as percentages and the change in points.
    assert "| exact_answer | 20 | 35.0% | 60.0% | +25.0 points |" in text
    # Summary.
    assert "`builtin:tiny`" in text and "60 of max_steps 100" in text and "1h 02m 05s" in text
    assert "`full` (a full fine-tune" in text and "SFT" not in text.split("## Hyperparameters")[0]
    # Metrics: first and last of kl and of the per-reward mean, and the best reward.
    assert "| `kl` | 0.001 | 0.06 | 0.001 | 0.06 |" in text
    assert "| `rewards/exact_answer/mean` | 0.21 | 0.8 | 0.21 | 0.8 |" in text
    assert "Best reward:" in text
    assert "**Verdict:** healthy" in text
    # Nothing half-written left behind.
    assert not list(job.root.glob(".*"))


def test_report_without_kl_and_with_alerts(tmp_path):
    job, spec = make_job(tmp_path, ["sft.enabled=true", "hyperparameters.lora_rank=8"])
    records = [
        {"step": s, "values": {"reward": float(s % 2), "reward_std": 0.3 if s <= 20 else 0.0}} for s in range(1, 41)
    ]
    alerts = HealthMonitor(max_response_length=2048, kl_coef=0.0).check(records)
    text = write_report(job, spec, EVALUATION, alerts).read_text()
    assert not (job.root / "kl.png").exists()  # kl_coef = 0: no kl series, no kl plot
    assert "| `kl` |" not in text and "![kl]" not in text
    assert_png(job.root / "reward.png")
    assert "the base model after an SFT warm-up (200 steps)" in text
    assert "`adapter` (LoRA rank 8" in text
    assert "**Verdict:** policy collapse suspected at step 30" in text
    assert alerts[0].advice in text and "Lower learning_rate" in text


def test_report_with_no_steps_and_no_evaluation(tmp_path):
    job, spec = make_job(tmp_path, n_steps=0)
    text = write_report(job, spec, None, []).read_text()
    assert "No training steps were logged" in text
    assert "none (no training steps were logged)" in text
    assert "No held-out evaluation was run" in text
    assert "not judged" in text
    assert not list(job.root.glob("*.png"))


def test_report_without_metrics_file(tmp_path):
    job, spec = make_job(tmp_path, n_steps=0)
    job.metrics.unlink()
    assert "No training steps were logged" in write_report(job, spec, None, []).read_text()


@pytest.mark.parametrize(
    "evaluation, expected",
    [
        ({"metric": "m", "n": 10, "before": 0.5, "after": 0.25}, "| 50.0% | 25.0% | -25.0 points |"),  # worse after
        ({"metric": "m", "n": 10, "before": 0.0, "after": 1.0}, "| 0.0% | 100.0% | +100.0 points |"),  # 0 to 1
        ({"metric": "m", "n": 10, "before": 2.5, "after": 4.0}, "| 2.5 | 4 | +1.5 |"),  # not in [0, 1]: raw numbers
        ({"metric": "m", "n": 10, "before": None, "after": 0.5}, "| — | 50.0% | — |"),  # a score is missing
        ({"metric": "m", "n": 10, "before": 0.0, "after": 0.0}, "| 0.0% | 0.0% | no change |"),  # was "+0.0 points"
        # A loss too small for one decimal: its own digits, never "-0.0 points".
        ({"metric": "m", "n": 10, "before": 0.05942, "after": 0.05937}, "| 5.9% | 5.9% | -0.005 points |"),
        # evaluation.samples 4: pass@1 and pass@4 of both models.
        (
            {
                **EVALUATION,
                "pass_at_k": {
                    m: {"pass@1": p, "pass@4": q} for m, p, q in [("before", 0.3, 0.5), ("after", 0.6, 0.9)]
                },
            },
            "**pass@k:** pass@1 30.0% -> 60.0%, pass@4 50.0% -> 90.0%: the chance that at least one of k of a "
            "prompt's 4 sampled completions scores 1",
        ),
    ],
)
def test_evaluation_table(tmp_path, evaluation, expected):
    job, spec = make_job(tmp_path, n_steps=0)  # no steps: no plots to draw, only the table matters here
    assert expected in write_report(job, spec, evaluation, []).read_text()


def test_plot_metrics_skips_absent_keys(tmp_path):
    records = [{"step": s, "values": {"reward": s / 10, "entropy": None}} for s in range(1, 11)]
    paths = plot_metrics(records, tmp_path / "plots")
    assert paths == [tmp_path / "plots" / "reward.png"]  # entropy only ever None, reward_std/length/kl absent
    assert_png(paths[0])
    assert plot_metrics([], tmp_path / "empty") == []


def test_report_names_every_adapted_module_and_parameter(tmp_path):
    job, spec = make_job(tmp_path, ["hyperparameters.lora_rank=4"], n_steps=3)
    trained = {"trainable_parameters": 10, "total_parameters": 100, "lora_target_modules": ["q_proj", "v_proj"]}
    trained["lora_target_parameters"] = ["experts.down_proj", "experts.gate_up_proj"]  # a mixture of experts
    job.training_result.write_text(json.dumps(trained))
    text = write_report(job, spec, EVALUATION, [], extra={}).read_text()
    assert (
        "- **Trained parameters:** 10 of 100, LoRA adapters on `q_proj`, `v_proj` and on the parameters "
        "`experts.down_proj`, `experts.gate_up_proj`"
    ) in text


# --- no regression: a start no checkpoint beat, and held_out.png


def no_gain(select="best", before=0.357, trained=0.175) -> dict:
    """evaluation.json of a job whose checkpoints all scored below the start (the issue's full fine-tune)."""
    series = [{"step": 0, "score": before}, {"step": 4, "score": 0.113}, {"step": 8, "score": trained}]
    evaluation = {"metric": "fuzzy", "n": 40, "before": before, "select": select, "series": series, "improved": False}
    if select == "best":  # what trainers/evaluate.py leaves: the start kept
        evaluation |= {"after": before, "selected_step": 0, "trained": {"step": 8, "score": trained}}
        note = "no checkpoint beat the starting model: the best, step 8, scored 0.175 against the start's 0.357"
        return evaluation | {"note": note + "; the starting model is kept (merged/ holds it)"}
    note = "no checkpoint beat the starting model: the last, step 8, scored 0.175 against the start's 0.357"
    return evaluation | {"after": trained, "selected_step": 8, "note": note}


def test_report_says_no_checkpoint_beat_the_start(tmp_path):
    job, spec = make_job(tmp_path, n_steps=8)
    text = write_report(job, spec, no_gain(), []).read_text()
    # Was: "**Model kept:** step 8, the best held-out score during training (held-out fuzzy 17.5%; ...)".
    assert "| fuzzy | 40 | 35.7% | 35.7% | no change |" in text
    assert "**No improvement:** no checkpoint beat the starting model: the best, step 8, scored 0.175" in text
    assert "**Model kept:** the starting model (step 0): no checkpoint beat its held-out fuzzy 35.7%" in text
    assert "best held-out score during training" not in text and "Not scored" not in text

    text = write_report(job, spec, no_gain("last"), []).read_text()
    assert "| fuzzy | 40 | 35.7% | 17.5% | -18.2 points |" in text
    assert "**No improvement:** no checkpoint beat the starting model: the last, step 8" in text
    assert "**Model kept:** the last step's (8)" in text


@pytest.mark.parametrize(
    "scores, limits",
    [
        ([0.05942, 0.05937], (-0.02, 1.02)),  # a 0..1 metric's whole range: no cliff (was 0.05937-0.05942)
        ([0.0, 0.0], (-0.02, 1.02)),  # all zero: the bottom of 0..1 (was -0.055..0.055)
        ([0.357, 0.175, 0.113], (-0.02, 1.02)),
        ([-2.0, 3.5], (-2.275, 3.775)),  # another scale: the scores' own range, padded
        ([100.0, 100.01], (94.50445, 105.50555)),  # a tiny change on a large scale: a tenth of the magnitude
    ],
)
def test_held_out_axis_spans_the_metrics_range(scores, limits):
    assert held_out_limits(scores) == pytest.approx(limits)
    series = [{"step": 3 * i, "score": s} for i, s in enumerate(scores)]
    fig = held_out_figure({"metric": "m", "series": series, "selected_step": 0}, [])
    assert fig.axes[0].get_ylim() == pytest.approx(limits)  # what the PNG shows


def test_held_out_png_before_and_after_are_two_markers_on_whole_steps(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # evaluation.every: 0, three steps: step 0 and step 3 only.
    evaluation = {"metric": "exact_answer", "series": [{"step": 0, "score": 0.05942}, {"step": 3, "score": 0.05937}]}
    evaluation["selected_step"] = 0
    records = [{"step": s, "values": {"reward": 0.1 * s}} for s in range(1, 4)]
    fig = held_out_figure(evaluation, records)
    ax, twin = fig.axes
    [scores] = [line for line in ax.get_lines() if line.get_label() == "held-out exact_answer"]
    assert scores.get_linestyle() == "None" and scores.get_marker() == "o"  # two measurements, not a curve (was "-")
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks == [0, 1, 2, 3]  # whole steps (were 0, 0.5, 1, ... 3)
    FigureCanvasAgg(fig).draw()
    inside = fig.bbox
    for artist in (ax.yaxis.label, twin.yaxis.label, ax.get_legend()):  # the left label was cut off
        box = artist.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= inside.width and box.y0 >= 0 and box.y1 <= inside.height, artist
    assert_png(plot_held_out(evaluation, records, tmp_path))


def test_held_out_png_draws_a_series_as_a_line():
    fig = held_out_figure(no_gain(), [])
    [scores] = [line for line in fig.axes[0].get_lines() if line.get_label() == "held-out fuzzy"]
    assert scores.get_linestyle() == "-" and list(scores.get_xdata()) == [0, 4, 8]
    assert held_out_figure({"metric": "m", "series": [{"step": 0, "score": 0.5}]}, []) is None  # nothing to compare


def test_report_shows_what_the_model_writes_before_and_after(tmp_path):
    from grpoflow.trainers.rollouts import write_held_out

    job, spec = make_job(tmp_path, n_steps=6)
    prompts = [f"What is {i}+{i}?" for i in range(8)]
    # A pipe in a completion stays in its cell; its markdown is shown, not rendered (the UI renders the report).
    write_held_out(job, 0, prompts, ["iiii | <b>iiii</b>"] * 8, [0.0] * 8)
    write_held_out(job, 6, prompts, [str(2 * i) for i in range(8)], [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    text = write_report(job, spec, EVALUATION | {"selected_step": 6}, []).read_text()
    section = text.split("## What the model writes\n\n", 1)[1].split("\n\n## ", 1)[0]
    assert "| held-out prompt | starting model (step 0) | GRPO result (step 6) |" in section
    assert r"| What is 0+0? | iiii \| \<b\>iiii\</b\> (**0**) | 0 (**1**) |" in section  # the ones whose score changed
    assert section.count("\n| What is") == 5 and "What is 2+2?" in section  # five, then in held-out order
    assert "evaluation/step-000006.parquet" in section
    assert text.index("## Held-out evaluation") < text.index("## What the model writes") < text.index("## Metrics")
    # Without the held-out files (an older job, or no hold-out), no such section.
    assert "What the model writes" not in write_report(job, spec, EVALUATION | {"selected_step": 5}, []).read_text()


def test_report_says_the_gain_with_its_interval(tmp_path):
    from grpoflow.core.scores import intervals

    job, spec = make_job(tmp_path)
    before, after = [1.0] * 16 + [0.0] * 24, [1.0] * 25 + [0.0] * 15
    evaluation = {"metric": "exact_answer", "n": 40, "before": 0.4, "after": 0.625, "confidence": 0.95}
    text = write_report(job, spec, evaluation | {"ci": intervals(before, after, 0.95)}, []).read_text()
    section = text.split("## Held-out evaluation\n\n", 1)[1].split("\n\n## ", 1)[0]
    assert (
        "**Gain:** exact_answer 0.40 -> 0.625 (+0.225, 95% CI +0.10 to +0.35); 95% intervals of the scores: "
        in section
    )
    assert "before 25.0% to 55.0%, after 47.5% to 77.5%" in section and "over the 40 held-out prompts" in section
    # Without an interval (evaluation.confidence: null, an older job): no such line.
    assert "**Gain:**" not in write_report(job, spec, evaluation | {"ci": None}, []).read_text()


def test_report_shows_the_question_of_chat_prompts(tmp_path):
    from grpoflow.trainers.rollouts import write_held_out

    job, spec = make_job(tmp_path, n_steps=6)
    system = {"role": "system", "content": "Reply with just the number."}
    prompts = [[system, {"role": "user", "content": f"What is {i}+{i}?"}] for i in range(8)]
    write_held_out(job, 0, prompts, ["?"] * 8, [0.0] * 8)
    write_held_out(job, 6, prompts, [str(2 * i) for i in range(8)], [1.0] * 8)
    text = write_report(job, spec, EVALUATION | {"selected_step": 6}, []).read_text()
    section = text.split("## What the model writes\n\n", 1)[1].split("\n\n## ", 1)[0]
    assert "| What is 0+0? | ? (**0**) | 0 (**1**) |" in section and section.count("\n| What is") == 5
    assert "role" not in section and section.count("Reply with just the number.") == 1  # the system prompt once
    assert section.endswith("their system prompt: Reply with just the number.")


def test_the_canarys_projection_stands_beside_the_time_training_took(tmp_path):
    from grpoflow.integrations.artifacts import completed_message
    from grpoflow.jobs.canary import projection_line

    job, spec = make_job(tmp_path)
    assert projection_line(job) is None  # no canary ran: nothing said
    canary = {"status": "passed", "projected_training_hours": 0.01, "step_seconds": 0.5, "peak_memory_gb": 0.62}
    (job.root / "canary.json").write_text(json.dumps(canary))
    job.training_result.write_text(json.dumps({"train_runtime": 30.0}))
    line = (
        "the canary projected 36 s of training (its full-length step 0.5 s, peak 0.62 GB); training took 30 s (0.83x)"
    )
    assert projection_line(job) == line
    assert f"- **Canary:** {line}" in write_report(job, spec, EVALUATION, []).read_text()
    assert completed_message(job, spec, EVALUATION).endswith(f"; {line}")  # the flow run's final state message
    (job.root / "canary.json").write_text(json.dumps({**canary, "status": "failed"}))
    assert projection_line(job) is None  # a failed canary ended the job before training
    # A canary.json someone edited (a job folder on a shared store) says nothing, never a traceback at the job's end.
    for broken in (
        "{",
        "[1]",
        json.dumps({**canary, "projected_training_hours": "x"}),
        json.dumps({"status": "passed"}),
    ):
        (job.root / "canary.json").write_text(broken)
        assert projection_line(job) is None
    (job.root / "canary.json").write_text(json.dumps(canary))
    job.training_result.write_text('{"train_runtime": "soon"}')
    assert projection_line(job) == "the canary projected 36 s of training (its full-length step 0.5 s, peak 0.62 GB)"
