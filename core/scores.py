"""How held-out scores are named and compared, said once: `eval/<metric>` in metrics.jsonl and evaluation.json,
`beats` (a model beats the start only by more than float noise) and `change` (the difference as the report, the run's
message, the gate and a sweep print it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpoflow.core.spec import JobSpec

# evaluation.json's and metrics.jsonl's prefix of a held-out score during training: eval/<metric>.
EVAL_PREFIX = "eval/"
# The seconds one held-out evaluation took (generation and scoring), logged beside the score (as eval_seconds).
EVAL_SECONDS = "eval/seconds"
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
