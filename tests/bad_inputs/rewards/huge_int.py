"""A reward that returns 10**400: a Python int no float holds (math.isnan raised OverflowError on it)."""


def huge_int_reward(completions, **kwargs):
    return [10**400] * len(completions)
