"""A reward that returns its scores as text."""


def strings_reward(completions, **kwargs):
    return ["1.0" for _ in completions]
