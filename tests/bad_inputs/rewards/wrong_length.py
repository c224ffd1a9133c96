"""A reward that scores the batch as a whole: one value for many completions."""


def wrong_length_reward(completions, **kwargs):
    return [1.0]
