"""How held-out scores are named and compared, said once: `eval/<metric>` in metrics.jsonl and evaluation.json,
`beats` (a model beats the start only by more than float noise), `change` (the difference as the report, the run's
message, the gate and a sweep print it), and `intervals` with `gain_line` (a paired bootstrap over the held-out
prompts: how sure a gain is, as evaluation.json keeps it and the gate, the report and the run's message say it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpoflow.core.spec import JobSpec

# evaluation.json's and metrics.jsonl's prefix of a held-out score during training: eval/<metric>.
EVAL_PREFIX = "eval/"
# The seconds one held-out evaluation took (generation and scoring), logged beside the score (as eval_seconds).
EVAL_SECONDS = "eval/seconds"
# Resamples of the bootstrap, and its fixed seed: the same scores give the same interval in every report.
RESAMPLES = 4000
BOOTSTRAP_SEED = 0
# Scores are means over a few prompts: a difference within this is float noise (0.7 - 0.6 meets a min_gain of 0.1), and
# two scores within it are equal (no checkpoint beat a start it only equals).
SCORE_TOLERANCE = 1e-9


def beats(score: float | None, start: float | None) -> bool | None:
    """Whether `score` is above `start` by more than float noise; None when either was not scored."""
    if score is None or start is None:
        return None
    return score > start + SCORE_TOLERANCE


def change(before: float, after: float, digits: int = 1, unit: str = " points") -> str:
    """`after - before` as a user reads it: in points for scores in [0, 1], else the plain difference; `no change`
    for equal scores, and never `-0`: a change that rounds to 0 at `digits` shows its own significant digits.

    >>> change(0.33, 0.75), change(0.5, 0.5), change(0.05942, 0.05937), change(-2.0, 3.5)
    ('+42.0 points', 'no change', '-0.005 points', '+5.5')
    >>> change(0.33, 0.75, digits=0, unit=" pts")
    '+42 pts'
    """
    difference = after - before
    if abs(difference) <= SCORE_TOLERANCE:
        return "no change"
    if not (0 <= before <= 1 and 0 <= after <= 1):
        return f"{difference:+.4g}"
    points = f"{100 * difference:+.{digits}f}"
    if float(points) == 0:  # "-0.0 points" would say a loss of nothing
        points = f"{100 * difference:+.2g}"
    return points + unit


def eval_key(spec: JobSpec) -> str:
    """The key of the held-out score in metrics.jsonl: `eval/<metric>`."""
    return EVAL_PREFIX + spec.evaluation.metric_name


def intervals(
    before: list[float | None] | None,
    after: list[float | None] | None,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, list[float] | None]:
    """Paired percentile bootstrap intervals over prompts: the held-out prompts resampled with replacement, the same
    resample for both models; each score is the mean of a resample's scored prompts (None scores skipped, as in the
    mean itself) and the gain is after's mean minus before's, on the same resample.

    Args:
        before (`list[float | None]`, *optional*): the start model's score of each held-out prompt; None: not scored.
        after (`list[float | None]`, *optional*): the GRPO result's, prompt by prompt in the same order.
        confidence (`float`, *optional*, defaults to 0.95): the intervals' coverage, in (0, 1).
        resamples (`int`, *optional*, defaults to `RESAMPLES`): bootstrap resamples.
        seed (`int`, *optional*, defaults to `BOOTSTRAP_SEED`): the resampling's seed.

    Returns:
        `dict`: `before`, `after` and `gain`, each `[low, high]`, or None where there is nothing to resample.

    >>> ci = intervals([0, 0, 1, 1] * 10, [1, 1, 1, 1] * 10)
    >>> ci["before"][0] < 0.5 < ci["before"][1], ci["after"], ci["gain"][0] > 0
    (True, [1.0, 1.0], True)
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(before if before is not None else after or [])
    picks = rng.integers(0, n, size=(resamples, n)) if n else None

    def means(scores):
        if scores is None or picks is None or len(scores) != n:
            return None
        values = np.array([np.nan if v is None else float(v) for v in scores])
        scored = ~np.isnan(values)
        counts = scored[picks].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(scored, values, 0.0)[picks].sum(axis=1) / counts  # NaN: a resample of unscored prompts

    def interval(samples):
        if samples is None or np.isnan(samples).all():
            return None
        tail = 100 * (1 - confidence) / 2
        return [float(x) for x in np.nanpercentile(samples, [tail, 100 - tail])]

    start, result = means(before), means(after)
    gain = result - start if start is not None and result is not None else None
    return {"before": interval(start), "after": interval(result), "gain": interval(gain)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` completions of one prompt of which `c` pass (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code"): `1 - C(n - c, k) / C(n, k)`, the chance that at least one of
    `k` completions drawn without replacement passes, computed as a product (no huge binomials).

    Args:
        n (`int`): completions of the prompt.
        c (`int`): those that pass, `0 <= c <= n`.
        k (`int`): completions drawn, `1 <= k <= n`.

    >>> pass_at_k(2, 1, 1), pass_at_k(2, 1, 2), pass_at_k(5, 2, 2), pass_at_k(4, 0, 3)
    (0.5, 1.0, 0.7, 0.0)
    """
    if n - c < k:  # every draw of k holds a passing completion
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1 - k / i
    return 1 - product


def pass_rates(scores: list[list[float | None]], ks: list[int]) -> dict[str, float | None]:
    """pass@k for each k of `ks` over prompts: the mean over prompts of `pass_at_k`, where each prompt's completions
    are its scores in `scores` (None: not scored, left out) and a completion passes with full marks (a score of 1, as a
    0/1 metric's correct answer). A prompt with fewer than k scored completions is left out of pass@k; None when no
    prompt has k.

    >>> pass_rates([[1, 0], [0, 0], [1, 1]], [1, 2])
    {'pass@1': 0.5, 'pass@2': 0.6666666666666666}
    """
    rates = {}
    for k in ks:
        each = []
        for values in scores:
            scored = [v for v in values if v is not None]
            if len(scored) >= k:
                each.append(pass_at_k(len(scored), sum(v >= 1 - SCORE_TOLERANCE for v in scored), k))
        rates[f"pass@{k}"] = sum(each) / len(each) if each else None
    return rates


def _figure(value: float, unit_scores: bool, sign: str = "") -> str:
    # Two decimals for scores in [0, 1], three where two would hide one prompt of forty (0.025); else 4 digits.
    if not unit_scores:
        return f"{value:{sign}.4g}"
    return f"{value:{sign}.2f}" if abs(100 * value - round(100 * value)) < 1e-6 else f"{value:{sign}.3f}"


def gain_line(
    metric: str | None, before: float, after: float, ci: list[float] | None, confidence: float | None
) -> str:
    """The held-out change as the gate, the report and the run's message say it, with the gain's interval when there
    is one.

    >>> gain_line("exact_answer", 0.4, 0.62, [0.12, 0.31], 0.95)
    'exact_answer 0.40 -> 0.62 (+0.22, 95% CI +0.12 to +0.31)'
    >>> gain_line("exact_answer", 0.4, 0.62, None, None), gain_line("loss", -2.0, 3.5, [1.25, 8], 0.9)
    ('exact_answer 0.40 -> 0.62 (+0.22)', 'loss -2 -> 3.5 (+5.5, 90% CI +1.25 to +8)')
    >>> gain_line("exact_answer", 0.4, 0.4, [0.0, 0.0], 0.95)  # the start kept: its own score
    'exact_answer 0.40 -> 0.40 (no change, 95% CI +0.00 to +0.00)'
    """
    unit = 0 <= before <= 1 and 0 <= after <= 1
    return f"{metric} {_figure(before, unit)} -> {_figure(after, unit)} ({gain_text(before, after, ci, confidence)})"


def gain_text(before: float, after: float, ci: list[float] | None, confidence: float | None) -> str:
    """The gain of `gain_line`, with its interval when there is one.

    >>> gain_text(0.4, 0.425, [0.0, 0.075], 0.95)
    '+0.025, 95% CI +0.00 to +0.075'
    """
    unit = 0 <= before <= 1 and 0 <= after <= 1
    gain = "no change" if abs(after - before) <= SCORE_TOLERANCE else _figure(after - before, unit, "+")
    if ci is not None and confidence is not None:
        gain += f", {100 * confidence:g}% CI {_figure(ci[0], unit, '+')} to {_figure(ci[1], unit, '+')}"
    return gain
