"""This project's rewards. spec.yaml names one as `function: rewards:close_answer_reward`; grpoflow imports this
module from the folder it runs in (here, or the worker's working directory: this folder).

A reward has TRL's signature: `completions` (strings, or message lists for chat prompts), each dataset column as a
keyword list (here `answer`), `**kwargs` for the rest TRL passes; it returns one float (or None) per completion.
Check the example below with `python -m doctest -v rewards.py`.
"""

from grpoflow.trainers.rewards.text import completion_text, extract_answer, parse_number


def close_answer_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """Reward 1.0 for the exact number, less the further off it is (0.0 at 10 away), 0.0 without a number.

    Args:
        completions (`list[str]` or `list[list[dict]]`): the completions to score.
        answer (`list`): the dataset's `answer` column, one value per completion.

    Example:
    ```python
    >>> close_answer_reward(["12", "The answer is 9", "30", "?"], answer=["12"] * 4)
    [1.0, 0.7, 0.0, 0.0]

    ```
    """
    scores = []
    for completion, truth in zip(completions, answer, strict=True):
        got, want = parse_number(extract_answer(completion_text(completion))), parse_number(str(truth))
        scores.append(0.0 if got is None or want is None else round(max(0.0, 1 - abs(got - want) / 10), 6))
    return scores
