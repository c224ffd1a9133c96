"""Markdown for the report, the model card, the CLI and the benchmarks: one table builder, one number format.

>>> print(table(["metric", "value"], [["reward", number(0.123456)]]))
| metric | value |
| --- | --- |
| reward | 0.1235 |
"""

import re
import textwrap

_INLINE = re.compile(r"([\\`*_\[\]<>|~&])")  # what markdown would format, link or take as HTML
_BLOCK = re.compile(r"^(\d+(?=[.)])|[#>+=-])")  # what would start a heading, a quote or a list


def number(value, digits: int = 4) -> str:
    """A metric value as text: `digits` significant digits for floats, `true`/`false`, an em dash for None."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def cell(value) -> str:
    """`value` as a table cell: the spec's YAML spelling (null, true), pipes and newlines escaped."""
    text = "null" if value is None else number(value) if isinstance(value, int | float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def literal(text: str, width: int = 48) -> str:
    """A model's text (a prompt, a completion) as a table cell that markdown shows to the letter: what markdown would
    format, link, escape or take as HTML backslash-escaped (a completion's `<answer>` tags and `**` stay visible) and
    the text wrapped at `width` characters with `<br>` (the V1 Prefect UI wraps no table cell: one long line pushes the
    columns after it out of sight).

    >>> literal("<answer>4</answer> is **it**")
    '\\\\<answer\\\\>4\\\\</answer\\\\> is \\\\*\\\\*it\\\\*\\\\*'
    >>> literal("# 1 | 2 and 3 more words", width=10)
    '\\\\# 1 \\\\| 2<br>and 3 more<br>words'
    """
    lines = textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False) or [""]
    lines = [_INLINE.sub(r"\\\1", line) for line in lines]
    lines[0] = _BLOCK.sub(lambda m: m.group(1) + "\\" if m.group(1)[0].isdigit() else "\\" + m.group(1), lines[0])
    return "<br>".join(lines)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; the cells are used as given (format them with `cell` or `number`)."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
