"""Tests for trainers/health.py: a rule table of true and false alarms per detector, streaming, fire-once, verdict."""

import doctest
import json
import math
import random

import pytest

from grpoflow.trainers import health
from grpoflow.trainers.health import Alert, HealthMonitor, verdict

W = 10  # the default window
MAX_LEN = 512


def series(n, **columns):
    """Records for steps 1..n; each column is a function of the step (returning None leaves the key out)."""
    records = []
    for step in range(1, n + 1):
        values = {key: fn(step) for key, fn in columns.items()}
        records.append({"step": step, "values": {k: v for k, v in values.items() if v is not None}})
    return records


def noisy(fn, scale, seed=0):
    """`fn` plus seeded Gaussian noise of `scale` (relative to the value), never below 0."""
    rng = random.Random(seed)
    return lambda step: max(0.0, fn(step) * (1 + rng.gauss(0, scale)))


def fired(records, kind, kl_coef=0.0, **kwargs):
    """The step at which `kind` fired over `records`, or None."""
    alerts = HealthMonitor(max_response_length=MAX_LEN, kl_coef=kl_coef, **kwargs).check(records)
    steps = [a.step for a in alerts if a.kind == kind]
    assert len(steps) <= 1  # each kind fires at most once
    return steps[0] if steps else None


def in_range(step, expected):
    return step is None if expected is None else step is not None and expected[0] <= step <= expected[1]


# --- policy collapse -------------------------------------------------------------------------------------------------

HEALTHY_STD = noisy(lambda s: 0.3, 0.15, seed=1)
COIN = lambda s: float(s % 2)  # all-right or all-wrong groups alternate: reward moves, but never within a group

COLLAPSE_CASES = [
    # TRUE: signal for 30 steps, then every group scores alike; fires once a whole window is at 0 (step 40)
    (series(60, reward=COIN, reward_std=lambda s: 0.3 if s <= 30 else 0.0), (40, 40)),
    # TRUE: the same with noise on the healthy part and TRL's frac_reward_zero_std alongside
    (
        series(
            60,
            reward=COIN,
            reward_std=lambda s: HEALTHY_STD(s) if s <= 30 else 0.001,
            frac_reward_zero_std=lambda s: 0.0 if s <= 30 else 1.0,
        ),
        (40, 40),
    ),
    # TRUE: reward_std stays up, entropy falls to a tenth (needs 2 windows; fires when the last is < 30% of the first)
    (series(60, reward=lambda s: 0.4, reward_std=HEALTHY_STD, entropy=lambda s: math.exp(-s / 12)), (20, 30)),
    # TRUE: a collapse onto a middling reward: reward_std 0 while the reward sits at 0.5, below its best (1.0)
    (series(50, reward=lambda s: 1.0 if s == 5 else 0.5, reward_std=lambda s: 0.3 if s <= 20 else 0.0), (30, 30)),
    # FALSE: healthy noise: reward_std around 0.3, entropy drifting slowly down (1.0 -> 0.7)
    (series(100, reward=noisy(lambda s: 0.5, 0.2), reward_std=HEALTHY_STD, entropy=lambda s: 1 - 0.003 * s), None),
    # FALSE: solved from the start: reward 1.0 and reward_std 0 throughout (there never was variance to lose)
    (series(60, reward=lambda s: 1.0, reward_std=lambda s: 0.0, entropy=lambda s: 0.8), None),
    # FALSE: solved on the way: the reward climbs to its ceiling, so variance vanishes and entropy falls with it
    (
        series(
            80,
            reward=lambda s: min(1.0, s / 40),
            reward_std=lambda s: 0.3 if s < 40 else 0.0,
            entropy=lambda s: max(0.05, 1 - s / 40),
        ),
        None,
    ),
    # FALSE: entropy falls just as steeply, but the reward is still climbing: a policy learning fast, not collapsing
    (series(60, reward=lambda s: 0.1 + s / 100, reward_std=HEALTHY_STD, entropy=lambda s: math.exp(-s / 12)), None),
    # FALSE: never any signal: every completion fails from step 1 (a data or reward problem, not a collapse)
    (series(60, reward=lambda s: 0.0, reward_std=lambda s: 0.0), None),
    # FALSE: short run: entropy collapses but only 15 steps were logged (fewer than two windows)
    (series(15, reward=lambda s: 0.4, reward_std=HEALTHY_STD, entropy=lambda s: math.exp(-s / 2)), None),
    # FALSE: reward_std dips to 0 for 5 steps, less than a window, then recovers
    (series(60, reward=COIN, reward_std=lambda s: 0.0 if 30 < s <= 35 else 0.3), None),
    # FALSE: the keys are missing or None (NaN in the log): nothing to judge
    (series(60, loss=lambda s: 0.1, reward_std=lambda s: None, entropy=lambda s: None), None),
]


@pytest.mark.parametrize("records, expected", COLLAPSE_CASES)
def test_policy_collapse(records, expected):
    step = fired(records, "policy_collapse")
    assert in_range(step, expected), step


def test_collapse_evidence_and_advice():
    records = COLLAPSE_CASES[1][0]
    alerts = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0).check(records)
    # 19 of 20 steps of zero variance after the collapse are also no learning signal, which fires later (step 49).
    assert [(a.kind, a.step) for a in alerts] == [("policy_collapse", 40), ("no_learning_signal", 49)]
    alert = alerts[0]
    assert alert.evidence["reward_std_last"] < 0.01 < 0.05 < alert.evidence["reward_std_peak_before"]
    assert alert.evidence["frac_reward_zero_std_last"] == 1.0
    assert "learning_rate" in alert.advice and "kl_coef" in alert.advice


def test_reward_ceiling_threshold():
    # Collapsed at 0.5 on a reward whose best step was 0.5: without a ceiling it looks solved; with ceiling 1.0, not.
    records = series(50, reward=lambda s: 0.5, reward_std=lambda s: 0.3 if s <= 20 else 0.0)
    assert fired(records, "policy_collapse") is None
    assert fired(records, "policy_collapse", reward_ceiling=1.0) == 30


# --- length explosion ------------------------------------------------------------------------------------------------

FLAT_REWARD = noisy(lambda s: 0.3, 0.1, seed=2)
GROWING = lambda s: 100 + 6.5 * s  # 106 at step 1, 490 at step 60

LENGTH_CASES = [
    # TRUE: lengths climb toward the 512 limit while the reward stays flat; fires once the last window passes 0.8*512
    (series(60, reward=FLAT_REWARD, **{"completions/mean_length": GROWING}), (50, 60)),
    # TRUE: the mean is only at 0.7*512, but half the completions hit the limit (clipped_ratio) and it doubled
    (
        series(
            40,
            reward=FLAT_REWARD,
            **{
                "completions/mean_length": lambda s: 150 if s <= 10 else 360,
                "completions/clipped_ratio": lambda s: 0.0 if s <= 10 else 0.6,
            },
        ),
        (20, 20),
    ),
    # TRUE: the reward falls while lengths grow (worse, not just flat)
    (series(60, reward=lambda s: 0.5 - s / 200, **{"completions/mean_length": GROWING}), (50, 60)),
    # FALSE: lengths grow just as much, but the reward improves with them (longer reasoning that pays off)
    (series(60, reward=lambda s: 0.2 + s / 100, **{"completions/mean_length": GROWING}), None),
    # FALSE: long from step 1 (0.9 * max, no growth): a tight max_response_length, not an explosion
    (series(60, reward=FLAT_REWARD, **{"completions/mean_length": noisy(lambda s: 460, 0.02)}), None),
    # FALSE: lengths triple but stay far from the limit (50 -> 150 of 512)
    (series(60, reward=FLAT_REWARD, **{"completions/mean_length": lambda s: 50 + 100 * s / 60}), None),
    # FALSE: short run: 15 steps, fewer than two windows
    (series(15, reward=FLAT_REWARD, **{"completions/mean_length": lambda s: 100 if s <= 5 else 500}), None),
    # FALSE: no reward logged: growth cannot be told from progress
    (series(60, **{"completions/mean_length": GROWING}), None),
]


@pytest.mark.parametrize("records, expected", LENGTH_CASES)
def test_length_explosion(records, expected):
    step = fired(records, "length_explosion")
    assert in_range(step, expected), step


def test_length_evidence_and_advice():
    (alert,) = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0).check(LENGTH_CASES[1][0])
    assert alert.evidence["clipped_ratio_last"] == 0.6
    assert alert.evidence["mean_length_last"] == 360 and alert.evidence["mean_length_first"] == 150
    assert "length penalty" in alert.advice and "max_response_length (now 512)" in alert.advice


# --- KL drift --------------------------------------------------------------------------------------------------------

KL_CASES = [
    # TRUE: blow-up: kl steady at 0.02, then jumps to 0.5 at step 31 (last window > 3x the one before, above the floor)
    (0.04, series(60, kl=lambda s: 0.02 if s <= 30 else 0.5), (31, 35)),
    # TRUE: steady linear climb, 0.01 per step, never a 3x jump: fires on two equal rises in a row (needs 3 windows)
    (0.04, series(80, kl=lambda s: 0.01 * s), (30, 30)),
    # TRUE: exponential growth with noise
    (0.001, series(80, kl=noisy(lambda s: 0.01 * math.exp(s / 15), 0.1, seed=3)), (30, 60)),
    # FALSE: the usual rise from 0 (policy = reference at step 1) to a plateau in the hundredths, with noise
    (0.04, series(100, kl=noisy(lambda s: 0.03 * (1 - math.exp(-s / 10)), 0.2, seed=4)), None),
    # FALSE: a rise to a high plateau (0.3) that levels off: each window rises less than the one before
    (0.04, series(100, kl=lambda s: 0.3 * (1 - math.exp(-s / 10))), None),
    # FALSE: a high but bounded kl: 0.3 with 10% noise from the start
    (0.04, series(100, kl=noisy(lambda s: 0.3, 0.1, seed=5)), None),
    # FALSE: kl_coef = 0: no KL term, TRL logs no kl
    (0.0, series(60, reward=FLAT_REWARD), None),
    # FALSE: kl_coef = 0: the detector is off even if a kl series shows up
    (0.0, series(60, kl=lambda s: 0.01 * s), None),
    # FALSE: kl_coef > 0 but kl is None (NaN) at every step
    (0.04, series(60, kl=lambda s: None), None),
    # FALSE: short run: 15 steps, fewer than two windows
    (0.04, series(15, kl=lambda s: 0.02 if s <= 5 else 1.0), None),
]


@pytest.mark.parametrize("kl_coef, records, expected", KL_CASES)
def test_kl_drift(kl_coef, records, expected):
    step = fired(records, "kl_drift", kl_coef=kl_coef)
    assert in_range(step, expected), step


def test_kl_evidence_and_advice():
    (alert,) = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.04).check(KL_CASES[0][1])
    assert alert.evidence["rule"] == "blowup" and alert.evidence["kl_last"] > 3 * alert.evidence["kl_window_before"]
    assert "Raise kl_coef (now 0.04" in alert.advice


# --- the monitor -----------------------------------------------------------------------------------------------------


def all_three():
    """A run that collapses (step 40), explodes in length and drifts in KL, with gaps and Nones in the log."""
    return series(
        80,
        reward=COIN,
        reward_std=lambda s: None if s % 7 == 0 else (0.3 if s <= 30 else 0.0),
        entropy=lambda s: 0.9,
        kl=lambda s: 0.02 if s <= 50 else 0.6,
        **{"completions/mean_length": lambda s: 100 if s <= 40 else 480, "loss": lambda s: 0.01},
    )


def test_update_streams_the_same_alerts_as_check():
    records = all_three()
    monitor = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.04)
    streamed = [alert.to_dict() for record in records for alert in monitor.update(record)]
    whole = [alert.to_dict() for alert in HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.04).check(records)]
    assert streamed == whole
    assert [a["kind"] for a in whole] == ["policy_collapse", "length_explosion", "kl_drift"]


def test_each_kind_fires_once():
    # Collapsed for 150 steps after the first alert: the monitor stays quiet afterwards.
    records = series(200, reward=COIN, reward_std=lambda s: 0.3 if s <= 30 else 0.0)
    monitor = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0)
    per_step = [monitor.update(r) for r in records]
    assert sum(len(alerts) for alerts in per_step) == 1
    assert monitor.fired == {"policy_collapse"}


def test_window_and_threshold_arguments():
    with pytest.raises(TypeError, match="collapse_std"):
        HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0, collapse_std=0.1)  # misspelt threshold name
    with pytest.raises(ValueError, match="window"):
        HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0, window=1)
    # A smaller window fires sooner on the same collapse.
    records = COLLAPSE_CASES[0][0]
    assert fired(records, "policy_collapse", window=5) == 35


def test_alert_to_dict_is_json():
    alerts = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.04).check(all_three())
    data = json.loads(json.dumps([a.to_dict() for a in alerts]))
    assert set(data[0]) == {"kind", "step", "message", "evidence", "advice"}
    assert all(a["message"] and a["advice"] and a["evidence"]["window"] == W for a in data)


@pytest.mark.parametrize(
    "alerts, expected",
    [
        ([], "healthy"),  # no alerts
        ([Alert("policy_collapse", 40, "m", {}, "a")], "policy collapse suspected at step 40"),
        # several, listed by step whatever the order given
        (
            [Alert("kl_drift", 55, "m", {}, "a"), Alert("length_explosion", 12, "m", {}, "a")],
            "length explosion suspected at step 12; KL drift suspected at step 55",
        ),
    ],
)
def test_verdict(alerts, expected):
    assert verdict(alerts) == expected


def test_module_example():
    # The module docstring's example runs and gives what it shows.
    assert doctest.testmod(health).failed == 0


# --- no learning signal ----------------------------------------------------------------------------------------------

NAN = float("nan")
NO_SIGNAL_CASES = [
    # TRUE: every group zero-variance from step 1, reward 0 and loss 0 on every step (nothing trains): fires once the
    # first window (20 steps) is full
    (
        series(
            30, reward=lambda s: 0.0, reward_std=lambda s: 0.0, frac_reward_zero_std=lambda s: 1.0, loss=lambda s: 0.0
        ),
        (20, 20),
    ),
    # TRUE: every completion right from step 1 (too easy): no signal either
    (series(30, reward=lambda s: 1.0, reward_std=lambda s: 0.0, frac_reward_zero_std=lambda s: 1.0), (20, 20)),
    # TRUE: every reward returned None: TRL logs reward NaN (and frac_reward_zero_std 0, NaN std is not close to 0)
    (series(30, reward=lambda s: NAN, reward_std=lambda s: NAN, frac_reward_zero_std=lambda s: 0.0), (20, 20)),
    # TRUE: the same as metrics.jsonl writes it: NaN as null
    ([{"step": s, "values": {"reward": None, "loss": 0.0}} for s in range(1, 31)], (20, 20)),
    # FALSE: no `reward` key at all says nothing about scoring
    (series(30, loss=lambda s: 0.0), None),
    # FALSE: one group in two has signal (one prompt per step: frac is 0 or 1)
    (series(60, reward=COIN, frac_reward_zero_std=lambda s: float(s % 2)), None),
    # FALSE: 18 of 20 zero-variance steps (90% < 95%): a task being learnt, as late in the demo
    (series(60, reward=lambda s: 0.8, frac_reward_zero_std=lambda s: 0.0 if s % 10 == 0 else 1.0), None),
    # FALSE: unscored for 19 steps, then scored again: no window of 20 unscored steps
    (series(60, reward=lambda s: NAN if s % 20 else 0.5, frac_reward_zero_std=lambda s: 0.0), None),
]


@pytest.mark.parametrize(("records", "expected"), NO_SIGNAL_CASES)
def test_no_learning_signal(records, expected):
    assert in_range(fired(records, "no_learning_signal"), expected)


def test_no_learning_signal_thresholds_from_the_spec():
    from grpoflow.core.spec import load_spec

    spec, _ = load_spec(
        {
            "name": "t",
            "base_model": "builtin:tiny",
            "dataset": {"uri": "d.jsonl"},
            "rewards": [{"name": "exact_answer"}],
            "health": {"no_signal_window": 5, "no_signal_fraction": 0.8},
        }
    )
    records = series(10, reward=lambda s: 0.0, frac_reward_zero_std=lambda s: 0.0 if s == 1 else 1.0)
    alerts = HealthMonitor.for_spec(spec).check(records)
    assert [(a.kind, a.step) for a in alerts] == [("no_learning_signal", 5)]  # 4/5 = 80% from step 5
    assert verdict(alerts) == "no learning signal suspected at step 5"
    assert alerts[0].evidence["frac_reward_zero_std_last"] == 0.8


# --- non-finite loss or gradient -------------------------------------------------------------------------------------

NON_FINITE_CASES = [
    # TRUE: the loss turned NaN at step 4 (metrics.jsonl writes NaN as null): fires at that step
    ([{"step": s, "values": {"loss": 0.1 if s < 4 else None, "grad_norm": 1.0}} for s in range(1, 8)], 4),
    # TRUE: grad_norm inf from step 2 (learning_rate 1e6)
    ([{"step": s, "values": {"loss": 0.1, "grad_norm": 1.0 if s < 2 else float("inf")}} for s in range(1, 5)], 2),
    # FALSE: finite throughout, even when large
    ([{"step": s, "values": {"loss": 1e6, "grad_norm": 1e9}} for s in range(1, 30)], None),
    # FALSE: a step that logs neither key (TRL's reused-generation steps log less)
    ([{"step": s, "values": {"reward": 0.5}} for s in range(1, 30)], None),
]


@pytest.mark.parametrize(("records", "expected"), NON_FINITE_CASES)
def test_non_finite(records, expected):
    assert fired(records, "non_finite") == expected


def test_non_finite_is_fatal():
    assert "non_finite" in health.FATAL and "policy_collapse" not in health.FATAL


# --- held-out divergence ---------------------------------------------------------------------------------------------

KEY = "eval/exact_answer"


def held_out(n, every, reward, score):
    """Steps 1..n with a training reward at each and the held-out score every `every` steps (functions of the step)."""
    return series(n, reward=reward, **{KEY: lambda s: score(s) if s % every == 0 else None})


DIVERGENCE_CASES = [
    # TRUE: the held-out score falls at steps 20 and 30 while the reward climbs: fires at the second fall
    (held_out(40, 10, lambda s: s / 40, lambda s: {10: 0.5, 20: 0.4, 30: 0.3, 40: 0.2}[s]), 30),
    # TRUE: a rise first, then two falls
    (held_out(50, 10, lambda s: s / 50, lambda s: {10: 0.3, 20: 0.5, 30: 0.45, 40: 0.4, 50: 0.4}[s]), 40),
    # FALSE: two falls of one prompt in 40 each (0.05 in all, below health.held_out_min_drop, 0.1): noise
    (held_out(40, 10, lambda s: s / 40, lambda s: {10: 0.8, 20: 0.775, 30: 0.75, 40: 0.75}[s]), None),
    # FALSE: one fall, then flat (not twice in a row)
    (held_out(40, 10, lambda s: s / 40, lambda s: {10: 0.5, 20: 0.4, 30: 0.4, 40: 0.4}[s]), None),
    # TRUE: the reward of one interval dips (noise), but it rose over the two since the first fall
    (
        held_out(
            30,
            5,
            lambda s: {5: 0.6, 10: 0.5, 15: 0.7}.get(s, 0.6 if s <= 5 else 0.5 if s <= 10 else 0.8),
            lambda s: {5: 0.3, 10: 0.2, 15: 0.1, 20: 0.1, 25: 0.1, 30: 0.1}[s],
        ),
        15,
    ),
    # FALSE: both fall: a run getting worse, not a reward being gamed
    (held_out(40, 10, lambda s: 1 - s / 40, lambda s: {10: 0.5, 20: 0.4, 30: 0.3, 40: 0.2}[s]), None),
    # FALSE: both rise
    (held_out(40, 10, lambda s: s / 40, lambda s: s / 80), None),
    # FALSE: no held-out scores at all (evaluation.every 0)
    (series(40, reward=lambda s: s / 40), None),
]


@pytest.mark.parametrize(("records", "expected"), DIVERGENCE_CASES)
def test_held_out_divergence(records, expected):
    assert fired(records, "held_out_divergence", held_out_key=KEY) == expected


def test_held_out_divergence_needs_its_key_and_says_what_it_saw():
    records = DIVERGENCE_CASES[0][0]
    assert fired(records, "held_out_divergence") is None  # the monitor of a job without evaluation.every
    [alert] = HealthMonitor(MAX_LEN, 0.0, held_out_key=KEY).check(records)
    assert alert.kind == "held_out_divergence" and alert.step == 30
    scores = [{"step": 10, "score": 0.5}, {"step": 20, "score": 0.4}, {"step": 30, "score": 0.3}]
    assert alert.evidence["held_out"] == scores
    # the training reward: steps 1-10 against steps 11-30
    assert alert.evidence["reward_up_to_first"] == pytest.approx(5.5 / 40)
    assert alert.evidence["reward_since_first"] == pytest.approx(20.5 / 40)
    assert "tighten the reward" in alert.advice.lower() and "evaluation.select: best" in alert.advice
    assert verdict([alert]) == "held-out divergence suspected at step 30"


def test_held_out_divergence_from_the_spec(make_spec):
    from grpoflow.core.spec import load_spec

    spec, _ = load_spec(make_spec("div", hyperparameters={"max_steps": 40}, evaluation={"holdout": 4, "every": 10}))
    alerts = HealthMonitor.for_spec(spec).check(DIVERGENCE_CASES[0][0])
    assert [a.kind for a in alerts] == ["held_out_divergence"]


# --- a reward that scores nothing, and runs shorter than a window ----------------------------------------------------


def test_a_reward_that_scores_nothing_is_an_alert():
    # exact_answer scores, the other reward returns None for every completion (TRL logs its mean as NaN: null here)
    records = series(
        30, reward=lambda s: 0.5, reward_std=lambda s: 0.3, **{"rewards/exact_answer/mean": lambda s: 0.5}
    )
    for r in records:
        r["values"]["rewards/mine/mean"] = None
    alerts = HealthMonitor(MAX_LEN, 0.0).check(records)
    assert [(a.kind, a.step) for a in alerts] == [("reward_unscored", 20)]  # health.no_signal_window steps
    assert alerts[0].evidence["rewards"] == ["mine"] and "'mine' scored no completion" in alerts[0].message
    assert verdict(alerts) == "a reward that scores nothing suspected at step 20"


def test_a_run_shorter_than_the_window_is_judged_on_what_it_has():
    # 12 steps, every group scored alike (a random model, an exact-match reward): nothing could be learned
    records = series(12, reward=lambda s: 0.0, reward_std=lambda s: 0.0, frac_reward_zero_std=lambda s: 1.0)
    assert fired(records, "no_learning_signal") is None  # without knowing the run ends there, the window is not full
    assert fired(records, "no_learning_signal", max_steps=12) == 12  # at its last step, judged on its 12 steps
    learning = series(12, reward=lambda s: 0.5, reward_std=lambda s: 0.4, frac_reward_zero_std=lambda s: 0.25)
    assert fired(learning, "no_learning_signal", max_steps=12) is None
    unscored = series(5, reward=lambda s: 0.5, **{"rewards/mine/mean": lambda s: None})
    for r in unscored:
        r["values"]["rewards/mine/mean"] = None
    assert fired(unscored, "reward_unscored", max_steps=5) == 5


def test_non_finite_names_the_learning_rate_it_was_logged_with():
    records = [{"step": 1, "values": {"loss": None, "grad_norm": 2.0, "learning_rate": 1e6}}]
    [alert] = HealthMonitor(max_response_length=64, kl_coef=0.0).check(records)
    assert alert.message == (
        "loss is not finite (NaN or inf) at step 1 with learning rate 1e+06 (hyperparameters.learning_rate): the "
        "update diverged and cannot recover."
    )


# --- degenerate completions ------------------------------------------------------------------------------------------

DEGENERATE = "completions/degenerate_ratio"  # logged by the training child (grpoflow.trainers.rollouts)
DEGENERATE_CASES = [
    # TRUE: the run collapses to `iiiiiiii` from step 21: most of the window by step 26
    (series(40, reward=lambda s: 0.2, **{DEGENERATE: lambda s: 1.0 if s > 20 else 0.0}), (25, 27)),
    # TRUE: three completions in four degenerate for a whole window
    (series(30, **{DEGENERATE: lambda s: 0.75}), (10, 10)),
    # FALSE: a few empty or repeated completions now and then (a quarter of them)
    (series(60, **{DEGENERATE: lambda s: 0.25}), None),
    # FALSE: a burst shorter than half a window
    (series(60, **{DEGENERATE: lambda s: 1.0 if 30 < s <= 34 else 0.0}), None),
    # FALSE: a job that logs no ratio (an older child) says nothing
    (series(60, reward=lambda s: 0.5), None),
    # TRUE: a run shorter than the window, judged at its last step on what it has
    (series(5, **{DEGENERATE: lambda s: 1.0}), (5, 5)),
]


@pytest.mark.parametrize(("records", "expected"), DEGENERATE_CASES)
def test_degenerate_completions(records, expected):
    max_steps = 5 if len(records) == 5 else None
    assert in_range(fired(records, "degenerate_completions", max_steps=max_steps), expected)


def test_degenerate_completions_names_an_example_and_what_to_do():
    asked = []

    def examples(first, last):
        asked.append((first, last))
        return 12, "iiiiiiiiii"

    records = series(12, **{DEGENERATE: lambda s: 0.9})
    monitor = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0, examples=examples)
    (alert,) = [a for a in monitor.check(records) if a.kind == "degenerate_completions"]
    assert asked == [(1, 10)] and alert.step == 10
    assert "90% of the completions over the last 10 steps" in alert.message
    assert "e.g. at step 12: 'iiiiiiiiii'" in alert.message
    assert alert.evidence["example"] == "iiiiiiiiii" and alert.evidence["degenerate_share_last"] == 0.9
    assert "grpoflow rollouts" in alert.advice and "learning_rate" in alert.advice and "kl_coef" in alert.advice
    assert verdict([alert]) == "degenerate completions suspected at step 10"
    # Without a way to find one (rollouts.every: 0), the alert still fires, naming none.
    (bare,) = HealthMonitor(max_response_length=MAX_LEN, kl_coef=0.0).check(records)
    assert "e.g." not in bare.message and "example" not in bare.evidence
