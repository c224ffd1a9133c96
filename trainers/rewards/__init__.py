"""Reward functions for GRPO: the built-ins (`builtin`, their text helpers in `text`), reward models (`models`),
building a spec's rewards and guarding their calls (`build`), and the pre-training dry run (`dry_run`).

Every reward has TRL's signature `(completions, **kwargs) -> list[float | None]`: `completions` holds strings, or
message lists for conversational prompts; dataset columns arrive as keyword lists, one value per completion; TRL also
passes `prompts`, `completion_ids`, `trainer_state`, `log_extra` and `log_metric`. `None` means "does not apply".

A job spec names its rewards; `build_reward` turns one entry into a callable whose `__name__` is the entry's `name`,
so TRL logs it as `rewards/<name>/mean`:

    rewards:
      - name: exact_answer                      # a built-in, see REWARDS
      - name: short
        kwargs: {max_chars: 120}                # built-in factories take their arguments from kwargs
      - name: close
        function: grpoflow.examples.rewards.arithmetic:close_answer_reward

`dry_run_rewards` calls each reward on a few dataset rows before training, so a broken reward fails the job in
seconds with a message that names it, instead of after the model has loaded.
"""

from __future__ import annotations

import re

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# The thousands-separated form goes first so "1,234" is one number; the lookbehind keeps the "-" of "5-3" an operator.
NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?:(?<![\w.])-)?\.\d+")
# TRL passes these to every reward (GRPOTrainer._calculate_rewards); any other parameter without a default is a
# dataset column, and a dataset column of one of these names never reaches a reward.
TRL_ARGUMENTS = frozenset(
    {"completions", "prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
DRY_RUN_ROWS = 4
# A reward model above this much weight is not loaded on CPU by the dry run (its config is still checked): a 7B one
# would take minutes and tens of GB there, while a classifier of up to ~0.5B parameters in fp32 loads in seconds.
DRY_RUN_MAX_MODEL_BYTES = 2 * 1024**3


class RewardError(ValueError):
    """A reward cannot be built or misbehaves on the dataset; the message names the reward.

    Attributes:
        problems (`list[str]`): one line per problem found, for callers that report them separately.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems if problems is not None else [message]
