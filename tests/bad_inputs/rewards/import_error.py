"""A reward module whose own import fails: the dry run must name the reward and the missing package."""

import grpoflow_no_such_package  # noqa: F401


def import_error_reward(completions, **kwargs):
    return [0.0] * len(completions)
