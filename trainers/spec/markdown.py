"""Markdown for the report, the model card, the CLI and the benchmarks: one table builder, one number format.

>>> print(table(["metric", "value"], [["reward", number(0.123456)]]))
| metric | value |
| --- | --- |
| reward | 0.1235 |
"""


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


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; the cells are used as given (format them with `cell` or `number`)."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
