"""Markdown tables and number formatting for the report, the model card, the CLI and the benchmarks."""

import doctest

import pytest

from grpoflow.core.spec import markdown
from grpoflow.core.spec.markdown import cell, literal, number, table


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


@pytest.mark.parametrize(
    "text, shown",
    [
        ("<think>4</think> <answer>4</answer>", r"\<think\>4\</think\> \<answer\>4\</answer\>"),  # not taken as HTML
        ("**4** and 2*3*4 = 24_0_", r"\*\*4\*\* and 2\*3\*4 = 24\_0\_"),  # no bold, no italics
        ("`x` [a](b) ~~no~~ &lt; a\\b", r"\`x\` \[a\](b) \~\~no\~\~ \&lt; a\\b"),  # no code, link, strike, entity
        ("# 29", r"\# 29"),  # no heading
        ("- 4", r"\- 4"),  # no list
        ("1. add, 2. carry", r"1\. add, 2. carry"),  # no numbered list (only the text's start could start one)
        ("a | b\nc", r"a \| b c"),  # a pipe would split the row, a newline end it
        ("", ""),
    ],
)
def test_literal_escapes_what_markdown_would_format(text, shown):
    assert literal(text) == shown


def test_literal_wraps_long_text_at_words_and_breaks_a_long_run():
    assert literal("one two three four five", width=9) == "one two<br>three<br>four five"
    assert literal("i" * 20, width=8) == "iiiiiiii<br>iiiiiiii<br>iiii"  # a collapsed completion wraps too
    assert all(len(line) <= 48 for line in literal("word " * 100).split("<br>"))
