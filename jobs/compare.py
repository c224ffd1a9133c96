"""Held-out scores of several jobs side by side, on the prompts they share: `grpoflow compare JOB_ID JOB_ID...`.

Each job's kept model (evaluation.json's `after`: the GRPO result, or the start when `select: best` kept it) is read
back prompt by prompt from `evaluation/step-<selected_step>.parquet` (a prompt's score the mean of its completions
with `evaluation.samples`); prompts are matched by their text (a chat by its messages, system prompt included), the
k-th copy of a prompt in one job with the k-th in another. Each job's score is its mean over the shared prompts, with a
percentile bootstrap interval, and each later job's gain against the first has the paired interval of
`grpoflow.core.scores.intervals` (the same resampled prompts for both jobs).
"""

from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import gain_text, intervals
from grpoflow.core.spec.markdown import number
from grpoflow.trainers.rollouts import read_rows, step_file


class NotComparable(ValueError):
    """Jobs that cannot be compared (no held-out evaluation, different metrics, no shared prompt): exit code 2."""


def kept_scores(job: JobDir) -> tuple[str, dict[tuple[str, int], float | None]]:
    """The metric of `job`'s held-out evaluation and its kept model's score of each held-out prompt, keyed by
    (prompt text, which copy of that text it is), in held-out order."""
    import json

    if not job.evaluation.exists():
        raise NotComparable(f"job {job.job_id} has no held-out evaluation (evaluation.json): it holds no prompt out")
    evaluation = json.loads(job.evaluation.read_text())
    step = evaluation.get("selected_step")
    path = step_file(job.evaluation_rollouts, step) if step is not None else None
    if path is None or not path.exists():
        raise NotComparable(f"job {job.job_id} kept no per-prompt held-out scores (evaluation/step-*.parquet)")
    prompts, each = {}, {}
    for row in read_rows(path):  # with evaluation.samples, several completions of a prompt: its score their mean
        prompts[row["row"]] = row["prompt"]
        each.setdefault(row["row"], []).append(row["score"])
    scores, copies = {}, {}
    for index, prompt in prompts.items():
        copy = copies[prompt] = copies.get(prompt, -1) + 1
        scores[(prompt, copy)] = _mean(each[index])
    return evaluation["metric"], scores


def _mean(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def compare(jobs: list[JobDir], confidence: float = 0.95) -> dict:
    """The held-out scores of `jobs` on the prompts all of them share, each with its interval, and each job's gain
    against the first with the paired interval.

    Args:
        jobs (`list[JobDir]`): two or more finished jobs; the first is the baseline.
        confidence (`float`, *optional*, defaults to 0.95): the intervals' coverage, in (0, 1).

    Returns:
        `dict`: `{"jobs", "metric", "prompts", "confidence", "rows": [{"job", "score", "ci", "gain_vs_first",
        "gain_ci"}]}`; `prompts` is the number of shared prompts.
    """
    kept = {job.job_id: kept_scores(job) for job in jobs}
    metrics = {job_id: metric for job_id, (metric, _) in kept.items()}
    if len(set(metrics.values())) > 1:
        named = ", ".join(f"{job_id} ({metric})" for job_id, metric in metrics.items())
        raise NotComparable(f"the jobs are scored with different metrics: {named}; compare jobs of one metric")
    first_id, (metric, first) = next(iter(kept.items()))
    shared = [key for key in first if all(key in scores for _, scores in kept.values())]
    if not shared:
        apart = [job_id for job_id, (_, scores) in kept.items() if not scores.keys() & first.keys()]
        named = ", ".join(apart or list(kept)[1:])
        raise NotComparable(f"job {first_id} and {named} share no held-out prompt: compare jobs of one held-out set")
    baseline = [first[key] for key in shared]
    rows = []
    for job_id, (_, scores) in kept.items():
        values = [scores[key] for key in shared]
        ci = intervals(baseline, values, confidence)
        score, start = _mean(values), _mean(baseline)
        later = job_id != first_id
        gain = score - start if later and score is not None and start is not None else None
        rows.append(
            {
                "job": job_id,
                "score": score,
                "ci": ci["after"],
                "gain_vs_first": gain,
                "gain_ci": ci["gain"] if later else None,
            }
        )
    return {"jobs": list(kept), "metric": metric, "prompts": len(shared), "confidence": confidence, "rows": rows}


def compare_table(result: dict) -> str:
    """`compare`'s result as a person reads it: a line per job, its score and interval, its gain against the first."""
    pct = f"{100 * result['confidence']:g}% CI"
    lines = [[f"job ({result['metric']}, {result['prompts']} shared held-out prompts)", "score", pct, "vs first"]]
    first = result["rows"][0]["score"]
    for row in result["rows"]:
        ci = f"{number(row['ci'][0], 3)} to {number(row['ci'][1], 3)}" if row["ci"] else "—"
        gain = "—"
        if row["gain_vs_first"] is not None:
            gain = gain_text(first, row["score"], row["gain_ci"], result["confidence"])
        lines.append([row["job"], number(row["score"], 3), ci, gain])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)
