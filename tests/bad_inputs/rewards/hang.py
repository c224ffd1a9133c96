"""A reward that never returns in time (a network call without a timeout, say): the dry run gives up on it."""

import time


def hang_reward(completions, **kwargs):
    time.sleep(60)
    return [0.0] * len(completions)
