"""An example custom reward: partial credit for arithmetic answers that are close to the truth.

Reference it from a job spec by its import path; the module is found from the directory you run `grpoflow` in:

    rewards:
      - name: close_answer
        function: grpoflow.examples.rewards.arithmetic:close_answer_reward
        weight: 1.0

A custom reward has TRL's signature: `completions` (strings, or message lists for chat prompts), dataset columns
as keyword lists (here `answer`), and `**kwargs` for the rest TRL passes. Check its example from the repo root:

    python -m doctest -v examples/rewards/arithmetic.py
"""

from grpoflow.trainers.rewards.text import completion_text, extract_answer, parse_number


def close_answer_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """Reward 1.0 for the exact integer, `max(0, 1 - |difference| / 10)` for a near miss, 0.0 without a number.

    A smooth reward gives GRPO a signal to climb even while no completion in a group is exactly right.

    Args:
        completions (`list[str]` or `list[list[dict]]`): the completions to score.
        answer (`list`): the dataset's `answer` column, one value per completion.

    Example:
    ```python
    >>> close_answer_reward(["<answer>12</answer>", "<answer>9</answer>", "<answer>30</answer>", "?"], answer=[12] * 4)
    [1.0, 0.7, 0.0, 0.0]

    ```
    """
    scores = []
    for c, truth in zip(completions, answer, strict=True):
        got, want = parse_number(extract_answer(completion_text(c))), parse_number(str(truth))
        if got is None or want is None:
            scores.append(0.0)
        elif got == want and got.is_integer():
            scores.append(1.0)
        else:
            scores.append(max(0.0, 1.0 - abs(got - want) / 10))
    return scores
