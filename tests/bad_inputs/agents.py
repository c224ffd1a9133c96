"""Tools and environments with one mistake each, for the bad-input corpus (cases.yaml)."""


def undocumented(x: int) -> int:
    return x


class NoReset:
    """An environment without reset: TRL cannot start a rollout on it."""

    def act(self) -> str:
        """Acts.

        Returns:
            Nothing much.
        """
        return ""


class ResetFails:
    """Its reset reads a column the dataset lacks."""

    def reset(self, secret: str, **row) -> None:
        self.secret = secret

    def get_reward(self) -> float:
        return 0.0


class RewardNotANumber:
    """Its get_reward returns text."""

    def reset(self, **row) -> None:
        self.state = "ready"

    def get_reward(self) -> str:
        return self.state
