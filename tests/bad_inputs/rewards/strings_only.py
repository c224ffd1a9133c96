"""A reward written for string completions: given chat completions (lists of messages) it raises AttributeError."""


def upper_reward(completions, **kwargs):
    return [float(c.isupper()) for c in completions]
