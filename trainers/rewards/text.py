"""Text helpers the rewards share: a completion's text, its answer, a number in it."""

from __future__ import annotations

from grpoflow.trainers.rewards import ANSWER_TAG, NUMBER

# --- helpers shared by the rewards -----------------------------------------------------------------------------------


def completion_text(completion: str | list[dict]) -> str:
    """Return the text of one completion, plain (`"..."`) or conversational (`[{"role": "assistant", ...}]`).

    For a conversation the last message counts: with tool calls the final answer comes after the tool turns.

    >>> completion_text("<answer>4</answer>")
    '<answer>4</answer>'
    >>> completion_text([{"role": "assistant", "content": "<answer>4</answer>"}])
    '<answer>4</answer>'
    """
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    content = completion[-1].get("content") or ""
    if isinstance(content, list):  # multimodal form: [{"type": "text", "text": ...}, ...]
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def extract_answer(text: str) -> str:
    """Return the content of the last `<answer>...</answer>`, or the whole text, stripped.

    >>> extract_answer("I think... <answer> 42 </answer>")
    '42'
    >>> extract_answer(" 42\\n")
    '42'
    """
    tagged = ANSWER_TAG.findall(text)
    return (tagged[-1] if tagged else text).strip()


def parse_number(text: str) -> float | None:
    """Return the last number in `text` ("-3", "2.5", "1,234", "1e3"), or `None` when there is none.

    >>> parse_number("so 1,234 + 6 = 1,240")
    1240.0
    >>> parse_number("no idea") is None
    True
    """
    numbers_found = NUMBER.findall(text)
    return float(numbers_found[-1].replace(",", "")) if numbers_found else None
