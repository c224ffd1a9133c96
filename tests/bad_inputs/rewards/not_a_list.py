"""A reward that returns one float instead of a list, and a name in the module that is not callable."""

THRESHOLD = 0.5


def not_a_list_reward(completions, **kwargs):
    return 1.0
