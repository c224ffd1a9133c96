"""A reward factory (called with the spec's kwargs) that takes no such arguments."""


def get_scaled_reward(scale: float = 1.0):
    def scaled_reward(completions, **kwargs):
        return [scale] * len(completions)

    return scaled_reward
