"""Tests for core/scores.py: the paired bootstrap intervals of held-out scores and how a gain is said."""

import doctest

import numpy as np
import pytest

from grpoflow.core import scores
from grpoflow.core.scores import gain_line, intervals


def test_doctests():
    assert doctest.testmod(scores).attempted and doctest.testmod(scores).failed == 0


def test_the_gains_interval_covers_the_true_gain_as_often_as_it_says():
    # 400 simulated held-out tables of 40 prompts: the start solves a prompt with probability 0.4, the GRPO result
    # keeps every solved prompt and solves a third of the others, so the true gain is 0.6 - 0.4 = 0.2.
    rng = np.random.default_rng(7)
    before = rng.random((400, 40)) < 0.4
    after = before | (rng.random((400, 40)) < 1 / 3)
    covered = []
    for b, a in zip(before.astype(float).tolist(), after.astype(float).tolist(), strict=True):
        low, high = intervals(b, a, 0.95, resamples=2000)["gain"]
        covered.append(low <= 0.2 <= high)
    assert 0.92 <= np.mean(covered) <= 0.98


def test_a_paired_interval_is_narrower_than_each_scores():
    # The same prompts are hard for both models: pairing takes that spread out of the gain.
    before = [0.0] * 20 + [1.0] * 20
    after = [0.0] * 15 + [1.0] * 25
    ci = intervals(before, after, 0.95)
    width = {side: high - low for side, (low, high) in ci.items()}
    assert width["gain"] < width["before"] and width["gain"] < width["after"]
    assert ci["gain"][0] > 0 and ci["before"][0] < 0.5 < ci["before"][1]


def test_intervals_are_reproducible_and_skip_unscored_prompts():
    before, after = [0.0, 1.0, None, 1.0, 0.0, 1.0], [1.0, 1.0, None, 1.0, None, 1.0]
    assert intervals(before, after) == intervals(before, after)  # a fixed seed: the same report every time
    assert intervals(before, after)["after"] == [1.0, 1.0]  # the unscored prompts are skipped, as in the mean
    scores = np.random.default_rng(0).random(30).tolist()
    assert intervals(scores, scores[::-1], seed=1) != intervals(scores, scores[::-1], seed=2)  # the seed is used
    assert intervals(before, after, 0.5)["before"][1] - intervals(before, after, 0.5)["before"][0] < (
        intervals(before, after, 0.99)["before"][1] - intervals(before, after, 0.99)["before"][0]
    )


@pytest.mark.parametrize(
    "before, after, expected",
    [
        ([None, None], [1.0, 0.0], {"before": None, "after": [0.0, 1.0], "gain": None}),  # the start scored nothing
        (None, [1.0, 1.0], {"before": None, "after": [1.0, 1.0], "gain": None}),  # no start evaluated
        ([], [], {"before": None, "after": None, "gain": None}),  # nothing held out
    ],
)
def test_intervals_without_scores(before, after, expected):
    assert intervals(before, after) == expected


def test_gain_line():
    assert gain_line("exact_answer", 0.4, 0.62, [0.12, 0.31], 0.95) == (
        "exact_answer 0.40 -> 0.62 (+0.22, 95% CI +0.12 to +0.31)"
    )
    assert gain_line("exact_answer", 0.4, 0.425, [0.0, 0.075], 0.9) == (
        "exact_answer 0.40 -> 0.425 (+0.025, 90% CI +0.00 to +0.075)"  # one prompt of 40: no digit hidden
    )
    assert gain_line("score", 10.0, 12.5, None, 0.95) == "score 10 -> 12.5 (+2.5)"


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (1, 1, 1, 1.0),  # one completion, it passes
        (3, 1, 1, 1 / 3),  # pass@1 is the share that passes
        (4, 2, 2, 1 - 1 / 6),  # C(2,2)/C(4,2): 1 of the 6 pairs has no passing completion
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)/C(10,5) = 21/252
        (5, 4, 2, 1.0),  # n - c < k: every pair holds a passing one
        (6, 0, 3, 0.0),  # none passes
    ],
)
def test_pass_at_k_is_chen_et_al_unbiased_estimate(n, c, k, expected):
    from math import comb

    from grpoflow.core.scores import pass_at_k

    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_is_stable_where_the_binomials_overflow_floats():
    from grpoflow.core.scores import pass_at_k

    # C(2000, 1000) is ~1e600: as a float ratio it would overflow; the product stays exact enough.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
