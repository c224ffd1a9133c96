"""Training health: detectors for GRPO's common failure modes over the metric series of `metrics.jsonl`.

Four alerts (the three of docs/design.md's "Health alerts", and one for a run that cannot learn), each with its
evidence and what to do about it:

- `policy_collapse`: `reward_std` falls to ~0 after the run had signal (every completion of a group now scores the
  same, so GRPO's advantages are all zero), or `entropy` falls steeply (the policy samples near-identical outputs);
- `length_explosion`: `completions/mean_length` climbs toward `max_response_length` while the reward does not improve;
- `kl_drift`: `kl` keeps growing (only when `kl_coef` > 0; TRL logs `kl` only then);
- `no_learning_signal`: over a window, nearly every group scored all its completions alike (TRL's
  `frac_reward_zero_std`), or the rewards scored no completion at all (`reward` is NaN: every reward returned None).
  GRPO's advantages are then 0 and nothing trains, whatever the loss curve looks like. A run shorter than the window
  is judged at its last step on the steps it has;
- `held_out_divergence`: with held-out scores during training (`evaluation.every`), the held-out metric fell at two
  evaluations in a row while the training reward rose: the policy learns what the reward pays for, not the task;
- `reward_unscored`: one reward returned None for every completion over the window (it adds nothing);
- `degenerate_completions`: over the window, most completions were empty or one token or n-gram over and over
  (`completions/degenerate_ratio`, which the training child logs: `grpoflow.trainers.rollouts.degenerate`), named with
  one of them from the kept rollouts when the monitor is given a way to find one (`examples`);
- `non_finite`: `loss` or `grad_norm` is NaN or inf (metrics.jsonl writes them as null): the weights are, or are about
  to be, non-finite, and no later step can recover. It is in `FATAL`: the run stops whatever `stop_on_alert` says.
  The training child checks the same, and its weights, at every step (`grpoflow.trainers.metrics.finite_callback`),
  stopping itself before the next step's generation fails on them; the training task turns that stop into this
  alert.

The training task adds `stall` (no new step for a long while: tasks/train.py's watchdog), which needs a clock, not
the metric series.

`HealthMonitor.update` takes one `{"step": n, "values": {...}}` record at a time, so the training loop can alert live;
`HealthMonitor.check` runs a whole series through `update`, so it gives the same alerts. Each kind fires at most once
per run. The detectors are pure: no I/O, no torch.

```python
>>> monitor = HealthMonitor(max_response_length=512, kl_coef=0.0, window=5)
>>> learning = [{"reward": 0.5, "reward_std": 0.4}] * 10  # each group had right and wrong completions
>>> collapsed = [{"reward": float(s % 2), "reward_std": 0.0} for s in range(10)]  # all-right or all-wrong groups
>>> records = [{"step": s, "values": v} for s, v in enumerate(learning + collapsed, start=1)]
>>> verdict(monitor.check(records))
'policy collapse suspected at step 15'

```
"""

import dataclasses
import math
import re
from dataclasses import dataclass, field

# --- thresholds (each can be overridden by name: HealthMonitor(..., collapse_reward_std=0.02)) ----------------------

# reward_std is the std of one step's rewards; under 0.01 (on rewards scored in [0, 1]) nearly every completion got the
# same score, and GRPO's group-relative advantages, hence its gradients, are ~0.
COLLAPSE_REWARD_STD = 0.01
# ...but only a collapse if the run once had signal: a window that averaged above this. A task the model fails (or
# solves) on every completion from step 1 never had variance to lose; that is a data or reward problem, not a collapse.
SIGNAL_REWARD_STD = 0.05
# Entropy declines slowly as the policy grows confident; losing 70% of the first window's level while the reward has
# stopped climbing is the steep fall that comes before identical outputs.
ENTROPY_COLLAPSE_RATIO = 0.3
# A reward within this fraction of its range from the run's best step (or from `reward_ceiling` when given), with no
# variance left, means the task is solved, not collapsed: every completion earns the top score.
SOLVED_MARGIN = 0.05
# Optional known maximum of the summed reward (e.g. 1.0 for one 0/1 reward); None uses the best step seen.
REWARD_CEILING = None
# Length explosion: the last window's mean length is within 20% of max_response_length, so completions are being cut...
LENGTH_NEAR_MAX = 0.8
# ...or at least half of them already hit the limit (TRL's completions/clipped_ratio), which pulls the mean up less...
CLIPPED_NEAR_MAX = 0.5
# ...and the length grew by more than half since the first window (long from step 1 is a setting, not an explosion)...
LENGTH_GROWTH = 1.5
# ...while the mean reward gained no more than this (rewards are usually scored in [0, 1]): longer, not better.
REWARD_GAIN_EPS = 0.05
# No learning signal: over `no_signal_window` steps, this share of groups (at least) had zero reward variance.
NO_SIGNAL_WINDOW = 20
NO_SIGNAL_FRACTION = 0.95
# Held-out divergence: the held-out score fell at two evaluations in a row by at least this much in all (10 points of a
# 0-1 metric). On the demo (40 held-out prompts, a score every 10 steps) an honest run's score falls by 0.05-0.075
# over two evaluations now and then, by noise alone; a gamed reward's falls by 0.1 and more (benchmarks/held_out.py).
HELD_OUT_MIN_DROP = 0.1
# Degenerate completions: over a window, at least this share of the completions was empty or one repeated stretch.
DEGENERATE_SHARE = 0.5

# kl is TRL's per-token estimate of KL(policy || reference) in nats. A run held by its KL term usually stays in the
# hundredths; below this floor growth is the expected drift away from the reference at the start (kl is 0 at step 1).
KL_FLOOR = 0.1
# A blow-up: the last window averages more than 3x the window before.
KL_BLOWUP_RATIO = 3.0
# A steady climb: two window-to-window rises in a row, each at least a tenth of the current level (smaller moves are
# noise around a level)...
KL_STEADY_RISE = 0.1
# ...and the latest rise at least 3/4 of the one before: linear or faster growth. A KL settling onto a plateau rises by
# less each window (by e^(-window/tau) for an approach with time constant tau), so it does not pass.
KL_KEEP_PACE = 0.75


# Alert kinds that end the run even without `stop_on_alert`: nothing after them is worth training.
FATAL = frozenset({"non_finite"})
# The metrics whose non-finite value is fatal; null in metrics.jsonl is how a NaN or inf was logged.
_MUST_BE_FINITE = ("loss", "grad_norm")
NON_FINITE_ADVICE = (
    "Lower learning_rate (by 10x or more; LoRA wants ~2e-5, full fine-tuning ~1e-6), and check the rewards' "
    "scale; resume only from a checkpoint saved before this step."
)


@dataclass
class Thresholds:
    """The detectors' thresholds; defaults are the module constants above."""

    collapse_reward_std: float = COLLAPSE_REWARD_STD
    signal_reward_std: float = SIGNAL_REWARD_STD
    entropy_collapse_ratio: float = ENTROPY_COLLAPSE_RATIO
    solved_margin: float = SOLVED_MARGIN
    reward_ceiling: float | None = REWARD_CEILING
    length_near_max: float = LENGTH_NEAR_MAX
    clipped_near_max: float = CLIPPED_NEAR_MAX
    length_growth: float = LENGTH_GROWTH
    reward_gain_eps: float = REWARD_GAIN_EPS
    kl_floor: float = KL_FLOOR
    kl_blowup_ratio: float = KL_BLOWUP_RATIO
    kl_steady_rise: float = KL_STEADY_RISE
    kl_keep_pace: float = KL_KEEP_PACE
    no_signal_window: int = NO_SIGNAL_WINDOW
    no_signal_fraction: float = NO_SIGNAL_FRACTION
    held_out_min_drop: float = HELD_OUT_MIN_DROP
    degenerate_share: float = DEGENERATE_SHARE


@dataclass
class Alert:
    """One detected failure mode.

    Args:
        kind (`str`): `"policy_collapse"`, `"length_explosion"`, `"kl_drift"`, `"no_learning_signal"`,
            `"non_finite"`, `"held_out_divergence"`, (from the training task's watchdog) `"stall"`, or (from the
            held-out evaluation, `grpoflow.trainers.evaluate.no_improvement_alert`) `"no_improvement"`.
        step (`int`): the training step at which it fired.
        message (`str`): one sentence saying what was seen.
        evidence (`dict`): the numbers behind it: window, before/after values, thresholds.
        advice (`str`): what to change in the spec.
    """

    kind: str
    step: int
    message: str
    evidence: dict = field(default_factory=dict)
    advice: str = ""

    def to_dict(self) -> dict:
        """The alert as a JSON-compatible dict (the payload of a `grpoflow.training.alert` event)."""
        return dataclasses.asdict(self)


# The metrics the detectors read; every other key of a record is ignored.
_KEYS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
    "kl",
    "completions/degenerate_ratio",
)


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _r(value: float | None) -> float | None:
    # Evidence goes into events and reports: six decimals are plenty and keep the JSON readable.
    return None if value is None else round(value, 6)


class HealthMonitor:
    """Watches a GRPO run's metrics, one step at a time, for policy collapse, length explosion and KL drift.

    Windows count the steps that logged the metric: a record that lacks a key, or holds None (a NaN in the log), does
    not enter that metric's windows.

    Args:
        max_response_length (`int`): the spec's `max_response_length`, the ceiling lengths explode toward.
        kl_coef (`float`): the spec's `kl_coef`; with 0 there is no KL term and the KL detector stays off.
        window (`int`, *optional*, defaults to `10`): steps averaged per window; >= 2.
        **thresholds: overrides of the module's thresholds by lowercase name, e.g. `collapse_reward_std=0.02`,
            `reward_ceiling=1.0`. An unknown name raises `TypeError`.
    """

    def __init__(
        self,
        max_response_length: int,
        kl_coef: float,
        window: int = 10,
        held_out_key: str | None = None,
        max_steps: int | None = None,
        examples=None,
        **thresholds,
    ):
        if window < 2:
            raise ValueError(f"window must be >= 2 steps, got {window}")
        self.max_response_length = max_response_length
        self.kl_coef = kl_coef
        self.window = window
        self.thresholds = Thresholds(**thresholds)
        self.fired: set[str] = set()
        self._series: dict[str, list[float]] = {key: [] for key in _KEYS}
        self._std_window_means: list[float] = []
        self._std_peak_before = -math.inf  # best window mean of reward_std that ended before the last window began
        self._reward_best = -math.inf
        self._reward_worst = math.inf
        self._unscored_streak = 0  # steps in a row whose reward was NaN or null (no completion scored)
        self._unscored_by_reward: dict[str, int] = {}  # the same, per reward (rewards/<name>/mean)
        # A run shorter than a window is judged at its last step on the steps it has.
        self.max_steps, self._steps = max_steps, 0
        # Held-out scores during training: (step, score, the training rewards of the steps since the one before).
        self.held_out_key = held_out_key
        self._held_out: list[tuple[int, float, list[float]]] = []
        self._rewards_since_held_out: list[float] = []
        # (first_step, last_step) -> (step, completion), a degenerate completion kept in those steps, or None.
        self.examples = examples

    @classmethod
    def for_spec(cls, spec, examples=None) -> "HealthMonitor":
        """The monitor of job spec `spec`: its hyperparameters and its `health` thresholds; `examples` finds a
        degenerate completion to name (`grpoflow.trainers.rollouts.degenerate_example` on the job)."""
        from grpoflow.core.scores import eval_key

        hp, health = spec.hyperparameters, spec.health
        return cls(
            max_response_length=hp.max_response_length,
            kl_coef=hp.kl_coef,
            held_out_key=eval_key(spec) if spec.evaluation.every else None,
            max_steps=hp.max_steps,
            examples=examples,
            no_signal_window=health.no_signal_window,
            no_signal_fraction=health.no_signal_fraction,
            held_out_min_drop=health.held_out_min_drop,
        )

    # --- feeding -----------------------------------------------------------------------------------------------------

    def update(self, record: dict) -> list[Alert]:
        """Add one step's record and return the alerts that fire at it (each kind fires once per run).

        Args:
            record (`dict`): `{"step": n, "values": {...}}`, one line of `metrics.jsonl`.

        Returns:
            `list[Alert]`: the new alerts, usually empty.
        """
        values = record.get("values") or {}
        self._add(values, int(record["step"]))
        self._steps += 1
        for key, value in values.items():
            if _PER_REWARD.fullmatch(key):
                self._unscored_by_reward[key] = 0 if _finite(value) else self._unscored_by_reward.get(key, 0) + 1
        # metrics.jsonl writes TRL's NaN reward (no completion scored) as null; a record without the key says nothing.
        reward = values.get("reward", 0.0)
        scored = isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward)
        self._unscored_streak = 0 if scored else self._unscored_streak + 1
        step = int(record["step"])
        detectors = {
            "non_finite": lambda step: self._non_finite(step, values),
            "no_learning_signal": self._no_learning_signal,
            "reward_unscored": self._reward_unscored,
            "policy_collapse": self._policy_collapse,
            "length_explosion": self._length_explosion,
            "kl_drift": self._kl_drift,
            "held_out_divergence": self._held_out_divergence,
            "degenerate_completions": self._degenerate_completions,
        }
        alerts = []
        for kind, detect in detectors.items():
            alert = None if kind in self.fired else detect(step)
            if alert is not None:
                self.fired.add(kind)
                alerts.append(alert)
        return alerts

    def check(self, records: list[dict]) -> list[Alert]:
        """Feed a whole series through `update`, in step order, and return every alert.

        Args:
            records (`list[dict]`): the records of `metrics.jsonl` (see `grpoflow.trainers.metrics.read_metrics`).

        Returns:
            `list[Alert]`: the alerts in the order they fired.
        """
        return [alert for record in sorted(records, key=lambda r: r["step"]) for alert in self.update(record)]

    def _add(self, values: dict, step: int) -> None:
        for key in _KEYS:
            value = values.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self._series[key].append(float(value))
                self._track(key, float(value))
        if _finite(values.get("reward")):
            self._rewards_since_held_out.append(float(values["reward"]))
        if self.held_out_key and _finite(values.get(self.held_out_key)):
            rewards, self._rewards_since_held_out = self._rewards_since_held_out, []
            self._held_out = [*self._held_out[-2:], (step, float(values[self.held_out_key]), rewards)]

    def _track(self, key: str, value: float) -> None:
        # Running summaries, so that a step costs O(window) however long the run.
        if key == "reward":
            self._reward_best, self._reward_worst = max(self._reward_best, value), min(self._reward_worst, value)
        elif key == "reward_std":
            means, w = self._std_window_means, self.window
            if len(self._series[key]) >= w:
                means.append(_mean(self._series[key][-w:]))
            if len(means) > w:  # this window mean ended a full window ago: it lies wholly before the last window
                self._std_peak_before = max(self._std_peak_before, means[-1 - w])

    def _window(self, key: str, back: int = 0) -> float | None:
        """Mean of the `back`-th window counted from the end (0 = the last `window` values), or None if too short."""
        values, w = self._series[key], self.window
        if len(values) < (back + 1) * w:
            return None
        return _mean(values[len(values) - (back + 1) * w : len(values) - back * w])

    def _first_window(self, key: str) -> float | None:
        values = self._series[key]
        return _mean(values[: self.window]) if len(values) >= self.window else None

    # --- non-finite loss or gradient ---------------------------------------------------------------------------------

    def _non_finite(self, step: int, values: dict) -> Alert | None:
        bad = [key for key in _MUST_BE_FINITE if key in values and not _finite(values[key])]
        if not bad:
            return None
        names = " and ".join(bad)
        rate = values.get("learning_rate")
        at = f" with learning rate {rate:g} (hyperparameters.learning_rate)" if _finite(rate) else ""
        message = f"{names} is not finite (NaN or inf) at step {step}{at}: the update diverged and cannot recover."
        return Alert("non_finite", step, message, {"non_finite": bad, "loss": values.get("loss")}, NON_FINITE_ADVICE)

    # --- no learning signal ------------------------------------------------------------------------------------------

    def _judged_window(self, step: int) -> int:
        """`no_signal_window`, or at the last step of a run shorter than it, the steps the run has."""
        window = self.thresholds.no_signal_window
        if self.max_steps is not None and step >= self.max_steps and 0 < self._steps < window:
            return self._steps
        return window

    def _no_learning_signal(self, step: int) -> Alert | None:
        t = self.thresholds
        window = self._judged_window(step)
        evidence = {"window": window}
        if self._unscored_streak >= window:
            message = (
                f"no completion was scored over the last {window} steps (every reward returned None, so the "
                "reward is NaN): GRPO has nothing to learn from."
            )
            advice = (
                "Check which completions the rewards return None for (a column they need, a format they expect): "
                "run one on a few completions by hand, or see the rewards/<name>/mean metrics."
            )
            return Alert("no_learning_signal", step, message, evidence | {"unscored_steps": window}, advice)
        zero_std = self._series["frac_reward_zero_std"]
        if len(zero_std) < window:
            return None
        share = _mean(zero_std[-window:])
        if share < t.no_signal_fraction:
            return None
        reward = _mean(self._series["reward"][-window:]) if len(self._series["reward"]) >= window else None
        evidence |= {
            "frac_reward_zero_std_last": _r(share),
            "no_signal_fraction": t.no_signal_fraction,
            "reward_last": _r(reward),
        }
        mean = "unknown" if reward is None else f"{reward:.4g}"
        message = (
            f"{share:.0%} of the groups over the last {window} steps scored all their completions alike "
            f"(mean reward {mean}): their advantages are 0, so nothing trains."
        )
        advice = (
            "If every completion is right, the prompts are too easy for this model; if every one is wrong, too hard "
            "(add an SFT warm-up, or a reward with partial credit). More rollouts_per_prompt or a higher temperature "
            "also make groups differ."
        )
        return Alert("no_learning_signal", step, message, evidence, advice)

    # --- a reward that scores nothing --------------------------------------------------------------------------------

    def _reward_unscored(self, step: int) -> Alert | None:
        window = self._judged_window(step)
        keys = [key for key, streak in self._unscored_by_reward.items() if streak >= window]
        if not keys:
            return None
        names = [_PER_REWARD.fullmatch(key).group(1) for key in keys]
        message = (
            f"the reward{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)} scored no completion over "
            f"the last {window} steps (None for every one): {'they add' if len(names) > 1 else 'it adds'} nothing to "
            "what GRPO learns from."
        )
        advice = (
            "A reward returns None for a completion it does not apply to. If it should apply, check the dataset "
            "columns it reads and the format it expects (grpoflow validate dry-runs every reward on a few rows), or "
            "remove it from the spec."
        )
        return Alert("reward_unscored", step, message, {"window": window, "rewards": names}, advice)

    # --- policy collapse ---------------------------------------------------------------------------------------------

    def _policy_collapse(self, step: int) -> Alert | None:
        t = self.thresholds
        if self._solved():
            return None
        std_last = self._window("reward_std")
        evidence = {"window": self.window, "reward_std_threshold": t.collapse_reward_std}
        if std_last is not None and std_last < t.collapse_reward_std and self._std_peak_before > t.signal_reward_std:
            evidence |= {"reward_std_last": _r(std_last), "reward_std_peak_before": _r(self._std_peak_before)}
            evidence |= self._zero_std_evidence()
            message = (
                f"reward_std averaged {std_last:.4g} over the last {self.window} steps, down from "
                f"{self._std_peak_before:.4g} in an earlier window: the completions of each group now score alike, "
                "so GRPO has no signal."
            )
            return Alert("policy_collapse", step, message, evidence, self._collapse_advice())
        return self._entropy_collapse(step, evidence)

    def _entropy_collapse(self, step: int, evidence: dict) -> Alert | None:
        t, series = self.thresholds, self._series["entropy"]
        if len(series) < 2 * self.window:
            return None
        first, last = self._first_window("entropy"), self._window("entropy")
        if first <= 0 or last >= t.entropy_collapse_ratio * first or self._reward_rising():
            return None
        evidence |= {
            "entropy_first": _r(first),
            "entropy_last": _r(last),
            "entropy_ratio_threshold": t.entropy_collapse_ratio,
        }
        evidence |= self._zero_std_evidence()
        message = (
            f"entropy fell from {first:.4g} (first {self.window} steps) to {last:.4g} (last {self.window}), "
            f"below {t.entropy_collapse_ratio:.0%} of where it started: the policy is close to one fixed output."
        )
        return Alert("policy_collapse", step, message, evidence, self._collapse_advice())

    def _solved(self) -> bool:
        """The reward sits at its ceiling with no variance: every completion earns the top score (not a collapse).

        Without `reward_ceiling` the ceiling is the best step seen, so a reward that never varied is its own ceiling;
        such a run never had variance, so it has no gradient and its entropy does not move either.
        """
        t = self.thresholds
        reward_last, std_last = self._window("reward"), self._window("reward_std")
        if reward_last is None or (std_last is not None and std_last >= t.collapse_reward_std):
            return False
        ceiling = self._reward_best if t.reward_ceiling is None else t.reward_ceiling
        spread = max(ceiling - self._reward_worst, 0.0)
        return reward_last >= ceiling - t.solved_margin * spread

    def _reward_rising(self) -> bool:
        # Entropy also falls fast while a policy learns quickly; as long as the reward still climbs, that is learning.
        last, before = self._window("reward"), self._window("reward", 1)
        return before is not None and last > before + self.thresholds.reward_gain_eps

    def _zero_std_evidence(self) -> dict:
        # TRL's share of groups whose rewards were all equal: supporting evidence, not a trigger.
        share = self._window("frac_reward_zero_std")
        return {} if share is None else {"frac_reward_zero_std_last": _r(share)}

    def _collapse_advice(self) -> str:
        return (
            "Lower learning_rate (try half) and raise kl_coef "
            f"(now {self.kl_coef:g}) to keep the policy near the reference, and check that the reward separates good "
            "completions from bad ones instead of giving most of them the same score."
        )

    # --- length explosion --------------------------------------------------------------------------------------------

    def _length_explosion(self, step: int) -> Alert | None:
        t, key = self.thresholds, "completions/mean_length"
        if len(self._series[key]) < 2 * self.window:
            return None
        first, last = self._first_window(key), self._window(key)
        clipped = self._window("completions/clipped_ratio")
        near_max = last > t.length_near_max * self.max_response_length or (
            clipped is not None and clipped >= t.clipped_near_max
        )
        if not near_max or last <= t.length_growth * first or not self._reward_flat():
            return None
        evidence = {
            "window": self.window,
            "mean_length_first": _r(first),
            "mean_length_last": _r(last),
            "max_response_length": self.max_response_length,
            "length_near_max_threshold": t.length_near_max,
            "length_growth_threshold": t.length_growth,
            "reward_first": _r(self._first_window("reward")),
            "reward_last": _r(self._window("reward")),
        }
        if clipped is not None:
            evidence["clipped_ratio_last"] = _r(clipped)
        message = (
            f"completions grew from {first:.4g} to {last:.4g} tokens on average (max_response_length "
            f"{self.max_response_length}) while the reward did not improve."
        )
        advice = (
            "Add a length penalty to the reward (the built-in length_penalty reward, next to the correctness one) or "
            f"lower max_response_length (now {self.max_response_length}): longer completions are not scoring higher."
        )
        return Alert("length_explosion", step, message, evidence, advice)

    def _reward_flat(self) -> bool:
        first, last = self._first_window("reward"), self._window("reward")
        # Without a reward series there is no telling growth from progress: stay quiet rather than guess.
        return first is not None and last <= first + self.thresholds.reward_gain_eps

    # --- KL drift ----------------------------------------------------------------------------------------------------

    def _kl_drift(self, step: int) -> Alert | None:
        if self.kl_coef <= 0:
            return None
        t = self.thresholds
        last, before, earlier = self._window("kl"), self._window("kl", 1), self._window("kl", 2)
        if before is None or last <= t.kl_floor:
            return None
        blowup = last > t.kl_blowup_ratio * before
        steady = earlier is not None and self._steady_rise(earlier, before, last)
        if not (blowup or steady):
            return None
        evidence = {
            "window": self.window,
            "kl_last": _r(last),
            "kl_window_before": _r(before),
            "kl_two_windows_before": _r(earlier),
            "kl_floor": t.kl_floor,
            "rule": "blowup" if blowup else "steady_rise",
            "kl_blowup_ratio": t.kl_blowup_ratio,
            "kl_steady_rise": t.kl_steady_rise,
            "kl_keep_pace": t.kl_keep_pace,
        }
        how = f"jumped past {t.kl_blowup_ratio:g}x the window before" if blowup else "rose for two windows in a row"
        message = f"kl reached {last:.4g} over the last {self.window} steps and {how}: the policy is drifting away."
        advice = (
            f"Raise kl_coef (now {self.kl_coef:g}; try 10x) or lower learning_rate. If the reward climbs with it, "
            "read some completions: the policy may be gaming the reward; tighten it (format checks, length penalties)."
        )
        return Alert("kl_drift", step, message, evidence, advice)

    def _steady_rise(self, earlier: float, before: float, last: float) -> bool:
        t = self.thresholds
        rise, previous_rise = last - before, before - earlier
        big_enough = min(rise, previous_rise) >= t.kl_steady_rise * last
        return big_enough and rise >= t.kl_keep_pace * previous_rise

    # --- held-out divergence -----------------------------------------------------------------------------------------

    def _held_out_divergence(self, step: int) -> Alert | None:
        # The last three held-out scores fall, each below the one before and by held_out_min_drop in all, while the
        # training reward of the steps since the first of them is above that of the steps up to it (a mean over two
        # evaluation intervals: the reward of one step, or of a few, is too noisy to say it rose).
        points = self._held_out
        if len(points) < 3 or points[-1][0] != step:
            return None
        (first_step, first, before), (_, middle, later), (_, last, latest) = points
        if not (before and later + latest) or not first > middle > last:
            return None
        if first - last < self.thresholds.held_out_min_drop - 1e-9:  # 0.5 - 0.4 is 0.0999...; 0.1 counts
            return None  # within the noise of the held-out prompts
        reward_before, reward_since = _mean(before), _mean(later + latest)
        if reward_since <= reward_before:
            return None
        metric = self.held_out_key.removeprefix("eval/")
        evidence = {
            "metric": self.held_out_key,
            "held_out": [{"step": s, "score": _r(score)} for s, score, _ in points],
            "reward_up_to_first": _r(reward_before),
            "reward_since_first": _r(reward_since),
            "min_drop": self.thresholds.held_out_min_drop,
        }
        message = (
            f"the held-out {metric} fell at two evaluations in a row ({first:.4g} at step {first_step}, then "
            f"{middle:.4g}, then {last:.4g} at step {step}) while the training reward rose (mean {reward_before:.4g} "
            f"up to step {first_step}, {reward_since:.4g} since): the policy learns what the reward pays for, not "
            "the task."
        )
        advice = (
            "Tighten the reward so that it pays only for what the task needs (check the answer itself, not its length "
            "or form), add a format check or a judge (llm_judge) beside it; evaluation.select: best keeps the "
            "checkpoint from before the fall."
        )
        return Alert("held_out_divergence", step, message, evidence, advice)

    # --- degenerate completions --------------------------------------------------------------------------------------

    def _degenerate_completions(self, step: int) -> Alert | None:
        series, window, t = self._series["completions/degenerate_ratio"], self.window, self.thresholds
        if self.max_steps is not None and step >= self.max_steps and 0 < len(series) < window:
            window = len(series)  # a run shorter than a window, judged at its last step
        if len(series) < window or (share := _mean(series[-window:])) < t.degenerate_share:
            return None
        evidence = {"window": window, "degenerate_share_last": _r(share), "share_threshold": t.degenerate_share}
        example = self.examples(step - window + 1, step) if self.examples else None
        seen = ""
        if example is not None:
            text = example[1] if len(example[1]) <= 80 else example[1][:80] + "…"
            evidence |= {"example_step": example[0], "example": example[1][:500]}
            seen = f" (e.g. at step {example[0]}: {text!r})"
        message = (
            f"{share:.0%} of the completions over the last {window} steps were empty or one token or n-gram over and "
            f"over{seen}: the policy collapsed onto output that says nothing."
        )
        advice = (
            "Read them: grpoflow rollouts JOB_ID --worst 5. Lower learning_rate (try half) and raise kl_coef "
            f"(now {self.kl_coef:g}) to keep the policy near the reference, and make the reward refuse such output "
            "(a format check, a minimum length, a penalty for repetition); evaluation.select: best keeps a checkpoint "
            "from before it."
        )
        return Alert("degenerate_completions", step, message, evidence, advice)


_PER_REWARD = re.compile(r"rewards/(.+)/mean")

_LABELS = {
    "reward_unscored": "a reward that scores nothing",
    "held_out_divergence": "held-out divergence",
    "policy_collapse": "policy collapse",
    "length_explosion": "length explosion",
    "kl_drift": "KL drift",
    "no_learning_signal": "no learning signal",
    "non_finite": "non-finite loss or gradient",
    "stall": "stalled training",
    "degenerate_completions": "degenerate completions",
}


def verdict(alerts: list[Alert]) -> str:
    """One line for a report or an event: `"healthy"`, or what is suspected and from which step.

    Args:
        alerts (`list[Alert]`): the alerts of one run.

    Returns:
        `str`: e.g. `"healthy"` or `"policy collapse suspected at step 40; KL drift suspected at step 55"`.
    """
    if not alerts:
        return "healthy"
    ordered = sorted(alerts, key=lambda a: a.step)
    return "; ".join(f"{_LABELS.get(a.kind, a.kind)} suspected at step {a.step}" for a in ordered)
