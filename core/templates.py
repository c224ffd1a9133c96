"""OpenAI's grader templates: `{{ item.<path> }}` (the dataset row) and `{{ sample.<path> }}` (the completion).

A `{{ namespace.variable }}` is replaced by its value; nested values are reached with dots and `[n]` indexes
(`{{ item.meta.tags[0] }}`). `sample` holds `output_text` (the completion's text) and `output_json` (that text parsed
as JSON, when it parses). A string is inserted as it is, anything else as JSON; a path that reaches nothing is
inserted as an empty string.
"""

from __future__ import annotations

import re

TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.DOTALL)
_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_\-]*)((?:\[\d+\])*)")
SAMPLE_FIELDS = ("output_text", "output_json")
# Dataset columns TRL's GRPOTrainer never passes to a reward (`completion` is SFT's target there, not the reward's).
HIDDEN_COLUMNS = ("completion", "completion_ids")


def template_paths(text: str) -> list[str]:
    """The variables of a template, in order, as written.

    >>> template_paths("Is {{sample.output_text}} the same as {{ item.answer }}?")
    ['sample.output_text', 'item.answer']
    """
    return [match.group(1) for match in TEMPLATE.finditer(text)]


def parse_path(path: str) -> list[str | int] | None:
    """A variable's path as keys and indexes, or None when it is not `namespace.key[.key|[n]]...`.

    >>> parse_path("item.meta.tags[0]")
    ['item', 'meta', 'tags', 0]
    >>> parse_path("item..x") is None
    True
    """
    keys: list[str | int] = []
    for part in path.split("."):
        match = _PART.fullmatch(part)
        if match is None:
            return None
        keys.append(match.group(1))
        keys += [int(index) for index in re.findall(r"\[(\d+)\]", match.group(2))]
    return keys if len(keys) >= 2 else None


def path_problem(path: str) -> str | None:
    """Why a template variable is not one a grader can fill in; None when it is.

    >>> path_problem("sample.output_text"), path_problem("item.answer")
    (None, None)
    >>> path_problem("sample.output_tools")
    'sample.output_tools is not available: sample has output_text and output_json'
    """
    keys = parse_path(path)
    if keys is None or keys[0] not in ("item", "sample"):
        return f"{{{{ {path} }}}} must be item.<column> or sample.output_text / sample.output_json.<key>"
    if keys[0] == "item" and keys[1] in HIDDEN_COLUMNS:
        return (
            f"item.{keys[1]} is always empty: TRL hands rewards every dataset column but the prompt, completion and "
            f"completion_ids; put the reference in a column of another name (e.g. reference_answer) and write "
            "{{ item.reference_answer }} (a completion being scored is {{ sample.output_text }})"
        )
    if keys[0] == "sample" and keys[1] not in SAMPLE_FIELDS:
        return f"sample.{keys[1]} is not available: sample has {' and '.join(SAMPLE_FIELDS)}"
    if keys[0] == "sample" and keys[1] == "output_text" and len(keys) > 2:
        return "sample.output_text is text: it has no fields (sample.output_json.<key> reads the parsed JSON)"
    return None


def item_columns(text: str) -> list[str]:
    """The dataset columns a template reads (`item.<column>...`).

    >>> item_columns("{{ item.answer }} {{ item.meta.level }} {{ sample.output_text }}")
    ['answer', 'meta']
    """
    columns = [keys[1] for keys in map(parse_path, template_paths(text)) if keys and keys[0] == "item"]
    return list(dict.fromkeys(c for c in columns if isinstance(c, str)))
