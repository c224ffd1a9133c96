"""Rewards that pass the dry run and misbehave from training step 3 on (TRL passes `trainer_state`; the dry run passes
None): what the training child's reward guard must catch. Used by tests/trainers/test_reward_faults.py and the
bad-input corpus."""

import math
import os
import time

FAULT_STEP = 3


def _faulty(kwargs) -> bool:
    state = kwargs.get("trainer_state")
    return state is not None and state.global_step + 1 >= FAULT_STEP


def nan_reward(completions, **kwargs):
    return [math.nan if _faulty(kwargs) else 0.0] * len(completions)


def inf_reward(completions, **kwargs):
    return [math.inf if _faulty(kwargs) else 0.0] * len(completions)


def short_reward(completions, **kwargs):
    return [0.0] * (len(completions) - (1 if _faulty(kwargs) else 0))


def text_reward(completions, **kwargs):
    return ["good" if _faulty(kwargs) else 0.0] * len(completions)


def raises_reward(completions, **kwargs):
    if _faulty(kwargs):
        raise KeyError("solution")
    return [0.0] * len(completions)


def hang_reward(completions, **kwargs):
    if _faulty(kwargs):
        time.sleep(3600)
    return [0.0] * len(completions)


def exit_reward(completions, **kwargs):
    if _faulty(kwargs):
        os._exit(0)
    return [0.0] * len(completions)
