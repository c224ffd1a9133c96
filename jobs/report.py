"""The job report: `report.md` and one PNG plot per metric, written into the job folder.

`write_report(job, spec, evaluation, alerts)` reads the job's `metrics.jsonl` and writes the human summary that
docs/design.md lists under "The job folder": what was trained from what, the resolved hyperparameters, the held-out
before/after scores, the metric series (a table and plots) and the health verdict with what to do about each alert.
`note_undelivered` keeps its last section, the webhook deliveries not delivered, up to date at the job's end and after
`grpoflow webhooks retry`.

Plots are drawn on `matplotlib.figure.Figure` objects, never through pyplot: no GUI backend is touched and no global
state changes (matplotlib's recommended way in servers and workers), so importing this module in a notebook or a
headless worker is equally safe.
"""

import contextlib
import json
import os
import re
import tempfile
import threading
from pathlib import Path

from grpoflow.core.jobdir import JobDir, write_text_atomic
from grpoflow.core.scores import change, gain_line
from grpoflow.core.spec import JobSpec, resolved_dict
from grpoflow.core.spec.markdown import cell, literal, number, table
from grpoflow.jobs.canary import projection_line
from grpoflow.trainers.budget import budget_line
from grpoflow.trainers.health import Alert, verdict
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.rollouts import one_line, prompt_text, shared_system_text, side_by_side
from grpoflow.trainers.suites import suite_rows

# `grpoflow run` sets this to its start (Unix seconds), so the report's wall time is the one the user waited.
RUN_STARTED_ENV = "GRPOFLOW_RUN_STARTED"


@contextlib.contextmanager
def waited_since(started: float):
    """Within the block, reports count their wall time from `started` (Unix seconds): `RUN_STARTED_ENV`."""
    os.environ[RUN_STARTED_ENV] = str(started)
    try:
        yield
    finally:
        os.environ.pop(RUN_STARTED_ENV, None)


PLOT_KEYS = ("reward", "reward_std", "completions/mean_length", "entropy", "kl")
# The summary table's rows, in this order, then every per-reward `rewards/<name>/mean`.
TABLE_KEYS = ("reward", "reward_std", "loss", "completions/mean_length", "entropy", "kl")
_PER_REWARD = re.compile(r"^rewards/.+/mean$")


# --- plots -----------------------------------------------------------------------------------------------------------


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of `key`, skipping records that lack it or hold None (a NaN in the log)."""
    points = [(r["step"], (r.get("values") or {}).get(key)) for r in records]
    points = [(step, float(v)) for step, v in points if isinstance(v, int | float) and not isinstance(v, bool)]
    return [step for step, _ in points], [v for _, v in points]


def _moving_average(values: list[float], window: int) -> list[float]:
    # Trailing mean, so the curve never uses steps from the future; the first points average what exists so far.
    chunks = [values[max(0, i + 1 - window) : i + 1] for i in range(len(values))]
    return [sum(chunk) / len(chunk) for chunk in chunks]


def _plot_file(key: str) -> str:
    return key.replace("/", "_") + ".png"


def _save_png(fig, path: Path) -> None:
    # A temp file beside the target, then a rename: a reader (or a crash) never sees half a PNG.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plot(steps: list[int], values: list[float], key: str, path: Path) -> None:
    from matplotlib.figure import Figure  # not at import: the CLI and the flow import this module long before a plot

    # Fixed margins: a constrained layout would take as long as drawing the figure itself.
    fig = Figure(figsize=(7, 3.5))
    fig.subplots_adjust(left=0.11, right=0.98, top=0.9, bottom=0.15)
    ax = fig.add_subplot()
    ax.plot(steps, values, color="tab:blue", alpha=0.35, linewidth=1, marker="." if len(steps) < 50 else None)
    window = max(2, min(20, len(values) // 10))
    ax.plot(steps, _moving_average(values, window), color="tab:blue", linewidth=2)
    ax.legend(["per step", f"moving average ({window} steps)"], loc="best", fontsize="small")
    ax.set(title=key, xlabel="step", ylabel=key)
    ax.grid(alpha=0.3)
    _save_png(fig, path)


def plot_metrics(records: list[dict], out_dir: Path, keys: tuple[str, ...] = PLOT_KEYS) -> list[Path]:
    """Draw one PNG per metric: the per-step series and its moving average, against the step.

    Args:
        records (`list[dict]`): `{"step": n, "values": {...}}` records, as read from `metrics.jsonl`.
        out_dir (`Path`): the folder the PNGs go to (created if missing).
        keys (`tuple[str, ...]`, *optional*, defaults to `PLOT_KEYS`): the metrics to plot; a key no record holds
            (e.g. `kl` when kl_coef is 0) gets no plot.

    Returns:
        `list[Path]`: the PNGs written, in `keys` order; files are named after the key with "/" as "_"
        (`completions/mean_length` -> `completions_mean_length.png`).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with _DRAWING:
        for key in keys:
            steps, values = _series(records, key)
            if values:
                path = out_dir / _plot_file(key)
                _plot(steps, values, key, path)
                paths.append(path)
    return paths


# One drawing at a time in a process (a sweep's jobs report in threads): matplotlib's font cache is shared by all
# figures.
_DRAWING = threading.Lock()


# --- formatting ------------------------------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


# --- sections --------------------------------------------------------------------------------------------------------


def _artifact(job: JobDir, spec: JobSpec) -> str:
    artifact_type = None
    if job.model_json.exists():
        artifact_type = json.loads(job.model_json.read_text()).get("artifact_type")
    if artifact_type is None:  # before the merge stage ran: what the spec will produce
        artifact_type = "adapter" if spec.hyperparameters.lora_rank else "full"
    if artifact_type == "adapter":
        return f"`adapter` (LoRA rank {spec.hyperparameters.lora_rank} in `adapter/`, merged weights in `merged/`)"
    return "`full` (a full fine-tune, weights in `merged/`)"


def _trained_parameters(job: JobDir) -> list[str]:
    # training.json's count, from the model the trainer held (PeftModel for LoRA jobs).
    trained = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    if not isinstance(trained.get("trainable_parameters"), int) or not trained.get("total_parameters"):
        return []
    count = f"{trained['trainable_parameters']:,} of {trained['total_parameters']:,}"
    modules, parameters = trained.get("lora_target_modules"), trained.get("lora_target_parameters")
    where = f", LoRA adapters on {', '.join(f'`{m}`' for m in modules)}" if modules else ""
    if parameters:  # a mixture of experts' expert (or router) parameters, through PEFT's target_parameters
        where += (
            f"{' and' if where else ', LoRA adapters'} on the parameters {', '.join(f'`{p}`' for p in parameters)}"
        )
    return [f"- **Trained parameters:** {count}{where}"]


def _summary(job: JobDir, spec: JobSpec, records: list[dict], extra: dict) -> str:
    hp = spec.hyperparameters
    start = "the base model"
    if spec.sft.enabled:
        start += f" after an SFT warm-up ({spec.sft.max_steps} steps)"
    rewards = ", ".join(f"{r.name} (weight {r.weight:g})" for r in spec.rewards)
    steps = "none (no training steps were logged)"
    if records:
        steps = f"{max(r['step'] for r in records)} of max_steps {hp.max_steps}"
    trained = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    if budget := budget_line(trained):
        steps += f" ({budget})"
    lines = [
        f"- **Base model:** `{spec.base_model}`",
        f"- **GRPO started from:** {start}",
        f"- **Dataset:** `{spec.dataset.uri}`",
        f"- **Rewards:** {rewards}",
        f"- **Steps run:** {steps}",
        f"- **Artifact:** {_artifact(job, spec)}",
        *_trained_parameters(job),
        *([f"- **Canary:** {canary}"] if (canary := projection_line(job)) else []),
    ]
    for key, value in extra.items():
        if key == "wall_time_s" and isinstance(value, int | float):
            lines.append(f"- **Wall time:** {_duration(value)}")
        else:
            lines.append(f"- **{key[0].upper() + key[1:].replace('_', ' ')}:** {cell(value)}")
    return "## Summary\n\n" + "\n".join(lines)


def _times(times: list[tuple[str, float | None]]) -> str:
    rows = [[what, "—" if seconds is None else f"{seconds:.1f} s"] for what, seconds in times]
    note = "The same figures as in events.jsonl (`grpoflow.sft.completed`, `grpoflow.training.completed`)."
    return "## Time\n\n" + table(["what", "took"], rows) + "\n\n" + note


def _hyperparameters(spec: JobSpec) -> str:
    resolved = resolved_dict(spec)
    rows = [[name, cell(value)] for name, value in resolved["hyperparameters"].items()]
    rows.append(["gpu_count", cell(resolved["gpu_count"])])
    rows += [[f"trl.{name}", cell(value)] for name, value in resolved["trl"].items()]  # TRL options, passed as given
    return "## Hyperparameters\n\n" + table(["name", "value"], rows)


def _score(value) -> str:
    # Scores in [0, 1] (accuracies, pass rates) read best as percentages; anything else is shown as is.
    if isinstance(value, int | float) and 0 <= value <= 1:
        return f"{100 * value:.1f}%"
    return number(value)


def _change(before, after) -> str:
    if not (isinstance(before, int | float) and isinstance(after, int | float)):
        return "—"
    return change(before, after)


def _evaluation(evaluation: dict | None, records: list[dict], plot: Path | None) -> str:
    title = "## Held-out evaluation\n\n"
    if not evaluation:
        return title + (
            "No held-out evaluation was run (`evaluation.holdout` is 0 without `evaluation.dataset`, or the stage did "
            "not finish)."
        )
    before, after = evaluation.get("before"), evaluation.get("after")
    row = [cell(evaluation.get("metric")), number(evaluation.get("n")), _score(before), _score(after)]
    note = "before: the model GRPO started from; after: the GRPO result, both on prompts held out of training."
    rows = table(["metric", "n", "before", "after", "change"], [row + [_change(before, after)]])
    label = "No improvement" if evaluation.get("improved") is False else "Not scored"
    why = f"\n\n**{label}:** {evaluation['note']}." if evaluation.get("note") else ""
    parts = [f"{title}{rows}\n\n{note}{why}"]
    if line := interval_line(evaluation):
        parts.append(line)
    if line := pass_line(evaluation):
        parts.append(line)
    if selection := selection_line(evaluation):
        parts.append(selection)
    series = evaluation.get("series") or []
    if len(series) > 2:  # scores taken during training (evaluation.every)
        steps, rewards = _series(records, "reward")
        lines, previous = [], 0
        for point in series:
            since = [r for step, r in zip(steps, rewards, strict=True) if previous < step <= point["step"]]
            lines.append(
                [str(point["step"]), _score(point["score"]), number(sum(since) / len(since) if since else None)]
            )
            previous = point["step"]
        headers = ["step", f"held-out {evaluation.get('metric')}", "training reward (mean since the row before)"]
        parts.append(table(headers, lines))
    if plot is not None:
        parts.append(f"![{plot.stem}]({plot.name})")
    return "\n\n".join(parts)


def _suites(job: JobDir) -> str | None:
    """The "Evaluation suites" section: each inspect-ai metric of the start and the kept model (suites.json); None
    without suites."""
    if not job.suites.exists():
        return None
    suites = json.loads(job.suites.read_text())
    rows = [
        [cell(r["suite"]), cell(r["metric"]), _score(r["start"]), _score(r["kept"]), _change(r["start"], r["kept"])]
        for r in suite_rows(suites)
    ]
    note = (
        "start: the model GRPO started from; kept: the model this job keeps (merged/), each run through inspect-ai "
        f"(`evaluation.suites`, greedy) in {number(suites.get('seconds'), 3)} s; its logs: `suites/` (`inspect view "
        "--log-dir suites`)."
    )
    return "## Evaluation suites\n\n" + table(["suite", "metric", "start", "kept", "change"], rows) + "\n\n" + note


def pass_line(evaluation: dict) -> str | None:
    """pass@1 and pass@k before and after, e.g. `**pass@k:** pass@1 0.40 -> 0.55, pass@4 0.60 -> 0.75 ...`; None
    without `pass_at_k` (`evaluation.samples` 1)."""
    rates = evaluation.get("pass_at_k")
    if not rates:
        return None
    each = [f"{k} {_score(rates['before'].get(k))} -> {_score(rates['after'].get(k))}" for k in rates["after"]]
    k = max(int(key.removeprefix("pass@")) for key in rates["after"])
    return (
        f"**pass@k:** {', '.join(each)}: the chance that at least one of k of a prompt's {k} sampled completions "
        "scores 1 (the unbiased estimate of Chen et al. 2021), the mean over the held-out prompts "
        "(`evaluation.samples`)."
    )


def interval_line(evaluation: dict) -> str | None:
    """The gain with its interval and each score's, e.g. `**Gain:** exact_answer 0.40 -> 0.62 (+0.22, 95% CI +0.12 to
    +0.31)`; None without intervals (`evaluation.confidence: null`, or a job evaluated before them) and when the start
    was kept (no checkpoint beat it: no gain)."""
    ci, before, after = evaluation.get("ci") or {}, evaluation.get("before"), evaluation.get("after")
    if not ci.get("gain") or evaluation.get("trained"):
        return None
    if not (isinstance(before, int | float) and isinstance(after, int | float)):
        return None
    confidence = evaluation["confidence"]
    scores = [f"{side} {_score(ci[side][0])} to {_score(ci[side][1])}" for side in ("before", "after") if ci.get(side)]
    return (
        f"**Gain:** {gain_line(evaluation.get('metric'), before, after, ci['gain'], confidence)}; "
        f"{100 * confidence:g}% intervals of the scores: {', '.join(scores)}. A paired bootstrap over the "
        f"{evaluation.get('n')} held-out prompts (`evaluation.confidence`): an interval that includes 0 is a change "
        "chance alone could make."
    )


def selection_line(evaluation: dict) -> str | None:
    """Which step's model is "after" (and merged, published, gated) and why, for the report and the model card."""
    step, series = evaluation.get("selected_step"), evaluation.get("series") or []
    if step is None:
        return None
    metric, trained = evaluation.get("metric"), evaluation.get("trained")
    if step == 0 and trained:  # select: best, and the start beat every checkpoint
        where = f"the best, step {trained['step']}" if trained.get("step") is not None else "the GRPO result"
        return (
            f"**Model kept:** the starting model (step 0): no checkpoint beat its held-out {metric} "
            f"{_score(evaluation.get('before'))} ({where}, scored {_score(trained.get('score'))}; "
            "`evaluation.select: best` weighs the start too). `merged/` holds the starting model; the trained "
            "checkpoints stay in `checkpoints/`."
        )
    if evaluation.get("select") != "best":
        return f"**Model kept:** the last step's ({step}); `evaluation.select: best` would keep the best-scoring one."
    scores = {p["step"]: p["score"] for p in series if p["step"]}
    last = max(scores, default=step)
    why = f"held-out {metric} {_score(scores.get(step))}, against {_score(evaluation.get('before'))} at the start"
    if last != step:
        why += f" and {_score(scores.get(last))} at the last step ({last})"
    return f"**Model kept:** step {step}, the best held-out score during training ({why}; `evaluation.select: best`)."


# The least span of held_out.png's y-axis for a metric of unknown range, as a share of the scores' magnitude: a change
# of 0.00005 must not fill the plot as a cliff would.
MIN_SPAN_SHARE = 0.1


def held_out_limits(scores: list[float]) -> tuple[float, float]:
    """The y-axis of held_out.png: the whole 0..1 range for scores in [0, 1] (accuracies, pass rates: their natural
    range, on which a tiny change looks tiny and all-zero scores sit at the bottom), else the scores' range, widened
    to at least `MIN_SPAN_SHARE` of their magnitude."""
    low, high = min(scores), max(scores)
    if 0 <= low and high <= 1:
        return -0.02, 1.02  # room for the markers at 0 and 1
    span = max(high - low, MIN_SPAN_SHARE * max(abs(low), abs(high)))
    middle = (low + high) / 2
    return middle - 0.55 * span, middle + 0.55 * span


def held_out_figure(evaluation: dict | None, records: list[dict]):
    """The figure of `held_out.png` (see `plot_held_out`); None without two scored points."""
    series = [p for p in (evaluation or {}).get("series") or [] if isinstance(p.get("score"), int | float)]
    if len(series) < 2:
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 3.8))
    ax = fig.add_subplot()
    steps, scores = [p["step"] for p in series], [p["score"] for p in series]
    # Before and after alone (evaluation.every: 0) are two measurements, not a curve: markers without a line.
    style = {"linewidth": 2} if len(series) > 2 else {"linestyle": "none", "markersize": 8}
    ax.plot(steps, scores, color="tab:green", marker="o", label=f"held-out {evaluation['metric']}", **style)
    ax.axhline(scores[0], color="tab:gray", linestyle="--", linewidth=1, label="starting model (step 0)")
    if evaluation.get("selected_step") is not None:
        ax.axvline(evaluation["selected_step"], color="tab:green", linestyle=":", label="model kept")
    ax.set(title="held-out score and training reward", xlabel="step", ylabel=f"held-out {evaluation['metric']}")
    ax.set_ylim(*held_out_limits(scores))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    reward_steps, rewards = _series(records, "reward")
    if rewards:
        twin = ax.twinx()
        window = max(2, min(20, len(rewards) // 10))
        twin.plot(reward_steps, _moving_average(rewards, window), color="tab:blue", alpha=0.7, label="training reward")
        twin.set_ylabel(f"training reward ({window}-step average)")
    # Below the plot, where no curve runs.
    handles, labels = (sum(pair, []) for pair in zip(*(a.get_legend_handles_labels() for a in fig.axes), strict=True))
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=3, fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()  # both axis labels and the legend inside the image, whatever the tick labels' width
    return fig


def plot_held_out(evaluation: dict | None, records: list[dict], out_dir: Path) -> Path | None:
    """`held_out.png`: the held-out score by step (start model at step 0, its level dashed) beside the training
    reward, the kept step marked; None without a series of at least the before and after scores."""
    with _DRAWING:
        fig = held_out_figure(evaluation, records)
        if fig is None:
            return None
        path = Path(out_dir) / "held_out.png"
        _save_png(fig, path)
    return path


def _metric_keys(records: list[dict]) -> list[str]:
    present = dict.fromkeys(key for r in records for key in r.get("values") or {})
    return [k for k in TABLE_KEYS if k in present] + [k for k in present if _PER_REWARD.match(k)]


def _metrics(records: list[dict], plots: list[Path]) -> str:
    title = "## Metrics\n\n"
    if not records:
        return title + "No training steps were logged, so there is nothing to plot."
    rows = []
    for key in _metric_keys(records):
        _, values = _series(records, key)
        if values:  # a key logged only as None (NaN) has nothing to summarize
            rows.append([f"`{key}`"] + [number(v) for v in (values[0], values[-1], min(values), max(values))])
    parts = [title + table(["metric", "first", "last", "min", "max"], rows)]
    steps, rewards = _series(records, "reward")
    if rewards:
        best = max(range(len(rewards)), key=rewards.__getitem__)
        parts.append(f"Best reward: {number(rewards[best])} at step {steps[best]}.")
    parts += [f"![{path.stem}]({path.name})" for path in plots]
    return "\n\n".join(parts)


def _writes(job: JobDir, evaluation: dict | None) -> str | None:
    """The section "What the model writes": for a few held-out prompts (those whose score changed most), the starting
    model's greedy completion beside the GRPO result's, with their scores (evaluation/step-*.parquet); None without
    both."""
    trained = (evaluation or {}).get("trained") or {"step": (evaluation or {}).get("selected_step")}
    pairs = side_by_side(job, trained["step"]) if trained["step"] else []
    if not pairs:
        return None
    rows = [
        [literal(one_line(prompt_text(p["prompt"]), 120))]  # the text as written, wrapped: markdown formats none
        + [f"{literal(one_line(p[side], 240))} (**{number(p[side + '_score'])}**)" for side in ("before", "after")]
        for p in pairs
    ]
    after = f"step {trained['step']}" + (", not kept" if (evaluation or {}).get("trained") else "")
    note = (
        f"Greedy completions of {len(pairs)} held-out prompts (those whose {evaluation.get('metric')} changed most), "
        f"with their scores; every prompt's in `evaluation/step-000000.parquet` and "
        f"`evaluation/step-{trained['step']:06d}.parquet`, the training rollouts in `rollouts/` "
        f"(`grpoflow rollouts {job.job_id}`)."
    )
    if system := shared_system_text([p["prompt"] for p in pairs]):
        shown = literal(one_line(system, 480), 240)
        note += f" The prompts are chats; above, their last user message; their system prompt: {shown}"
    headers = ["held-out prompt", "starting model (step 0)", f"GRPO result ({after})"]
    return "## What the model writes\n\n" + table(headers, rows) + "\n\n" + note


def _health(alerts: list[Alert], records: list[dict]) -> str:
    line = verdict(alerts) if alerts or records else "not judged (no training steps were logged)"
    parts = [f"## Health\n\n**Verdict:** {line}"]
    for alert in sorted(alerts, key=lambda a: a.step):
        name = alert.kind.replace("_", " ").capitalize()
        parts.append(f"- **{name}** at step {alert.step}: {alert.message}\n  **What to do:** {alert.advice}")
    parts.append(
        "Checked: `reward_std` and `entropy` for policy collapse, `completions/mean_length` against "
        "max_response_length for length explosion, `kl` for KL drift (only when kl_coef > 0), and the held-out "
        "score against the training reward (only with evaluation.every > 0)."
    )
    return "\n\n".join(parts)


# --- the report ------------------------------------------------------------------------------------------------------


def write_report(
    job: JobDir,
    spec: JobSpec,
    evaluation: dict | None,
    alerts: list[Alert | dict],
    extra: dict | None = None,
    times: list[tuple[str, float | None]] | None = None,
) -> Path:
    """Write the job's `report.md` and its metric plots (`*.png`) into the job folder.

    Args:
        job (`JobDir`): the job folder; its `metrics.jsonl` is read (missing or empty is fine: the report says no
            steps were logged).
        spec (`JobSpec`): the job's resolved spec.
        evaluation (`dict` or `None`): `evaluation.json`'s content, `{"metric", "n", "before", "after"}`; None when
            there was no held-out evaluation.
        alerts (`list[Alert | dict]`): the run's health alerts (`Alert`s or their `to_dict()` form, e.g. from events).
        extra (`dict`, *optional*): more summary lines; `wall_time_s` (seconds) shows as "Wall time", any other key
            as its own line.
        times (`list[tuple[str, float | None]]`, *optional*): the "Time" section's rows, (what, seconds).

    Returns:
        `Path`: the path of `report.md`.
    """
    records = read_metrics(job.metrics)
    alerts = [a if isinstance(a, Alert) else Alert(**a) for a in alerts]
    plots = plot_metrics(records, job.root)
    sections = [
        f"# GRPO job report: {job.job_id}",
        _summary(job, spec, records, extra or {}),
        *([_times(times)] if times else []),
        _hyperparameters(spec),
        _evaluation(evaluation, records, plot_held_out(evaluation, records, job.root)),
        *([suites] if (suites := _suites(job)) else []),
        *([writes] if (writes := _writes(job, evaluation)) else []),
        _metrics(records, plots),
        _health(alerts, records),
    ]
    write_text_atomic(job.report, "\n\n".join(sections) + "\n")
    return job.report


# --- webhooks not delivered (rewritten at the job's end and by `grpoflow webhooks retry`) ---------------------------

UNDELIVERED = "## Webhooks not delivered"


def note_undelivered(job: JobDir, undelivered: list[dict]) -> None:
    """Rewrites `report.md`'s last section, the webhook deliveries that reached no final outcome, or removes it when
    there are none. A job without a report yet (it ended before the evaluation) is left as it is.

    Args:
        job (`JobDir`): the job.
        undelivered (`list[dict]`): `grpoflow.integrations.webhooks.undelivered(job)`: `type`, `event_id`, `url`
            (without credentials) and `last` (the latest attempt's line in `webhooks.jsonl`, or None).
    """
    try:
        text = job.report.read_text()
    except FileNotFoundError:
        return
    sections = [text.split(f"\n\n{UNDELIVERED}", 1)[0].rstrip("\n")]
    if undelivered:
        rows = [
            [cell(d["type"]), f"`{d['event_id']}`", cell(d["url"]), cell(_last_attempt(d["last"]))]
            for d in undelivered
        ]
        sections.append(
            f"{UNDELIVERED}: {len(undelivered)} (run `grpoflow webhooks retry {job.job_id}`)\n\n"
            "They are sent again, with the same `webhook-id`, by that command or when the job is resumed.\n\n"
            + table(["event", "webhook-id", "webhook", "last attempt"], rows)
        )
    if (new := "\n\n".join(sections) + "\n") != text:
        write_text_atomic(job.report, new)


def _last_attempt(line: dict | None) -> str:
    if line is None:
        return "no attempt ended yet"
    return f"{line['outcome']} (attempt {line['attempt']}): {line['error'] or line['status']}"
