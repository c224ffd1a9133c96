"""OpenAI's grader templates filled in: a completion as `sample`, a dataset row as `item`, a template rendered.

The syntax (`{{ item.<path> }}`, `{{ sample.<path> }}`) and its checks are in `grpoflow.core.templates`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from grpoflow.core.templates import TEMPLATE, parse_path
from grpoflow.trainers.rewards.text import completion_text


def sample_of(completion: str | list[dict]) -> dict[str, Any]:
    """The `sample` namespace of one completion: its text, and that text parsed as JSON (None when it is not JSON).

    >>> sample_of('{"answer": 4}')
    {'output_text': '{"answer": 4}', 'output_json': {'answer': 4}}
    """
    text = completion_text(completion)
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        parsed = None
    return {"output_text": text, "output_json": parsed}


def lookup(namespaces: dict[str, Any], keys: list[str | int]) -> Any:
    """The value at `keys` in `namespaces`, or None when the path reaches nothing."""
    value: Any = namespaces
    for key in keys:
        if isinstance(key, int) and isinstance(value, list) and -len(value) <= key < len(value):
            value = value[key]
        elif isinstance(key, str) and isinstance(value, dict):
            value = value.get(key)
        else:
            return None
    return value


def render(text: str, sample: dict, item: dict) -> str:
    """`text` with each `{{ ... }}` replaced by its value for this sample and item.

    >>> render("{{ sample.output_text }} vs {{ item.answer }}", {"output_text": "4"}, {"answer": 4})
    '4 vs 4'
    """
    namespaces = {"sample": sample, "item": item}

    def value(match: re.Match) -> str:
        keys = parse_path(match.group(1))
        found = lookup(namespaces, keys) if keys else None
        if found is None:
            return ""
        return found if isinstance(found, str) else json.dumps(found, ensure_ascii=False)

    return TEMPLATE.sub(value, text)
