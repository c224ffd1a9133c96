"""The built-in rewards and `REWARDS`, the one registry of them (spec name -> reward or `get_*` factory)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from grpoflow.trainers.rewards.judge import get_llm_judge_reward
from grpoflow.trainers.rewards.text import completion_text, extract_answer, parse_number

# --- built-in rewards ------------------------------------------------------------------------------------------------


def exact_answer_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """Reward 1.0 when the completion's answer equals the `answer` column, else 0.0.

    The completion's answer is the content of its last `<answer>...</answer>`, or the whole completion; both sides
    are compared as strings after stripping. A row whose answer is `None` gets `None` (the reward does not apply).

    Args:
        completions (`list[str]` or `list[list[dict]]`): the completions to score.
        answer (`list`): the dataset's `answer` column, one value per completion.

    Example:
    ```python
    >>> exact_answer_reward(["<answer>4</answer>", "4", "<answer>5</answer>"], answer=["4", "4", 4])
    [1.0, 1.0, 0.0]

    ```
    """
    return [
        None if truth is None else float(extract_answer(completion_text(c)) == str(truth).strip())
        for c, truth in zip(completions, answer, strict=True)
    ]


def get_answer_format_reward(pattern: str = r"^<answer>.*?</answer>$") -> Callable[..., list[float | None]]:
    """Return `answer_format_reward`, which scores 1.0 when the stripped completion fully matches `pattern`, else 0.0.

    `.` matches newlines too (`re.DOTALL`), so multi-line reasoning inside the tags still counts.

    Args:
        pattern (`str`, *optional*, defaults to `r"^<answer>.*?</answer>$"`): the regular expression.

    Raises:
        ValueError: `pattern` is not a valid regular expression.

    Example:
    ```python
    >>> reward = get_answer_format_reward()
    >>> reward(["<answer>4</answer>\\n", "The answer is 4", "<answer>4</answer> done"])
    [1.0, 0.0, 0.0]
    >>> get_answer_format_reward(r"<think>.*</think><answer>.*</answer>")(["<think>2+2</think><answer>4</answer>"])
    [1.0]

    ```
    """
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None

    def answer_format_reward(completions: list, **kwargs) -> list[float | None]:
        return [float(regex.fullmatch(completion_text(c).strip()) is not None) for c in completions]

    return answer_format_reward


def get_length_penalty_reward(max_chars: int = 200, penalty: float = 1.0) -> Callable[..., list[float | None]]:
    """Return `length_penalty_reward`: 0.0 up to `max_chars` characters, falling linearly to `-penalty` at twice that.

    Add it next to a correctness reward when completions grow without the reward improving (length explosion).

    Args:
        max_chars (`int`, *optional*, defaults to `200`): the longest completion that costs nothing; >= 1.
        penalty (`float`, *optional*, defaults to `1.0`): the penalty at `2 * max_chars` characters and beyond; >= 0.

    Example:
    ```python
    >>> reward = get_length_penalty_reward(max_chars=10, penalty=1.0)
    >>> reward(["short", "x" * 15, "x" * 20, "x" * 500])
    [0.0, -0.5, -1.0, -1.0]

    ```
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")

    def length_penalty_reward(completions: list, **kwargs) -> list[float | None]:
        overshoot = [max(0, len(completion_text(c)) - max_chars) / max_chars for c in completions]
        return [-penalty * min(1.0, over) if over > 0 else 0.0 for over in overshoot]

    return length_penalty_reward


def get_numeric_match_reward(rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> Callable[..., list[float | None]]:
    """Return `numeric_match_reward`: 1.0 when the last number of the completion's answer equals the `answer` column.

    Numbers may be negative, decimal or thousands-separated ("1,234"); they are equal within `math.isclose(rel_tol,
    abs_tol)`. A completion or answer without a number scores 0.0; a row whose answer is `None` gets `None`.

    Args:
        rel_tol (`float`, *optional*, defaults to `1e-6`): relative tolerance; >= 0.
        abs_tol (`float`, *optional*, defaults to `1e-9`): absolute tolerance; >= 0.

    Example:
    ```python
    >>> reward = get_numeric_match_reward()
    >>> reward(["<answer>1,234</answer>", "so x = -2.50", "<answer>none</answer>"], answer=["1234", -2.5, "3"])
    [1.0, 1.0, 0.0]

    ```
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"rel_tol and abs_tol must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}")

    def numeric_match_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
        scores = []
        for c, truth in zip(completions, answer, strict=True):
            got, want = parse_number(extract_answer(completion_text(c))), parse_number(str(truth))
            matched = (
                got is not None and want is not None and math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)
            )
            scores.append(None if truth is None else float(matched))
        return scores

    return numeric_match_reward


# The one registry: spec name -> reward function, or `get_*` factory that takes the spec's kwargs.
REWARDS: dict[str, Callable] = {
    "answer_format": get_answer_format_reward,
    "exact_answer": exact_answer_reward,
    "length_penalty": get_length_penalty_reward,
    "llm_judge": get_llm_judge_reward,
    "numeric_match": get_numeric_match_reward,
}
