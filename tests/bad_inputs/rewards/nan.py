"""A reward that returns NaN, which would poison the advantages of the whole group."""

import math


def nan_reward(completions, **kwargs):
    return [math.nan] * len(completions)
