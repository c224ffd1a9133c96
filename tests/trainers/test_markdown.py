"""Markdown tables and number formatting for the report, the model card, the CLI and the benchmarks."""

import doctest

import pytest

from grpoflow.trainers.spec import markdown
from grpoflow.trainers.spec.markdown import cell, number, table


def test_doctest():
    assert doctest.testmod(markdown).failed == 0


@pytest.mark.parametrize(
    "value, digits, text",
    [
        (0.123456, 4, "0.1235"),  # four significant digits by default
        (0.123456, 2, "0.12"),  # `digits` chooses how many
        (1234567.0, 4, "1.235e+06"),  # large floats stay short
        (1e-7, 4, "1e-07"),  # as do small ones (a learning rate)
        (3.0, 4, "3"),  # no trailing zeros
        (5, 4, "5"),  # ints as they are
        (True, 4, "true"),  # bools in YAML's spelling, not Python's (and not as the int 1)
        (False, 4, "false"),
        (None, 4, "—"),  # a missing value is an em dash
        ("dr_grpo", 4, "dr_grpo"),  # anything else as its str
    ],
)
def test_number(value, digits, text):
    assert number(value, digits) == text


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "null"),  # a spec value of null reads as the YAML the user wrote
        (True, "true"),
        (0.000001, "1e-06"),  # numbers through `number`
        (8, "8"),
        ("a|b", "a\\|b"),  # a pipe would split the cell
        ("two\nlines", "two lines"),  # a newline would end the row
        (["q_proj", "v_proj"], "['q_proj', 'v_proj']"),  # other values as their str
    ],
)
def test_cell(value, text):
    assert cell(value) == text


def test_table_rows_line_up_with_the_header():
    text = table(["metric", "before", "after"], [["reward", "0.1", "0.5"], [cell("a|b"), "—", "1"]])
    lines = text.splitlines()
    assert lines == [
        "| metric | before | after |",
        "| --- | --- | --- |",
        "| reward | 0.1 | 0.5 |",
        "| a\\|b | — | 1 |",
    ]
    # Every row has as many unescaped cell separators as the header.
    assert {line.replace("\\|", "").count("|") for line in lines} == {4}


def test_table_without_rows_is_the_header():
    assert table(["a"], []) == "| a |\n| --- |"
