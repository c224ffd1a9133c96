"""A reward that raises on every call, as a reward with a typo in a column name would."""


def raises_reward(completions, answer, **kwargs):
    raise KeyError("solution")
