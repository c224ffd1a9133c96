"""`multi`'s `calculate_output`: arithmetic over the sub-graders' scores, evaluated over a small grammar, never `eval`.

The formula may hold numbers, the sub-graders' names, `+ - * /`, `^` or `**` (power), parentheses and the functions
`min`, `max`, `abs`, `floor`, `ceil`, `exp`, `sqrt`, `log`. It is parsed once (Python's own parser, `ast`), every node
checked against that list, and evaluated by walking the tree.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": lambda *values: min(values),
    "max": lambda *values: max(values),
    "abs": abs,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
# How many arguments each function takes: (at least, at most).
_ARITY = {"min": (1, 64), "max": (1, 64), "log": (1, 2)}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_FORMULA_CHARS = 2000


class FormulaError(ValueError):
    """`calculate_output` is not a formula of the allowed grammar, or names something that is not a sub-grader."""


def parse_formula(formula: str, names: list[str]) -> ast.Expression:
    """The checked tree of `formula`, whose variables must be among `names`.

    >>> parse_formula("0.5 * exact + 0.5 * fuzzy", ["exact", "fuzzy"]) is not None
    True
    >>> try:
    ...     parse_formula("__import__('os')", ["exact"])
    ... except FormulaError as exc:
    ...     print(exc)
    __import__(...) is not allowed: the functions are min, max, abs, floor, ceil, exp, sqrt, log
    """
    if len(formula) > MAX_FORMULA_CHARS:
        raise FormulaError(f"is {len(formula)} characters long; at most {MAX_FORMULA_CHARS}")
    try:
        # OpenAI writes powers as a ^ b: as Python's ** it also binds as a power does (a formula holds no strings).
        tree = ast.parse(formula.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"is not a formula: {exc.msg}") from None
    for node in ast.walk(tree):
        _check_node(node, names)
    return tree


def _check_node(node: ast.AST, names: list[str]) -> None:
    allowed = ", ".join(FUNCTIONS)
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if name not in FUNCTIONS or node.keywords:
            raise FormulaError(f"{name}(...) is not allowed: the functions are {allowed}")
        least, most = _ARITY.get(name, (1, 1))
        if not least <= len(node.args) <= most:
            raise FormulaError(
                f"{ast.unparse(node)!r}: {name} takes {least if least == most else f'{least} to {most}'} argument(s)"
            )
    elif isinstance(node, ast.Name):
        if node.id not in names and node.id not in FUNCTIONS:
            known = ", ".join(names) or "none"
            raise FormulaError(f"{node.id!r} is not a sub-grader's name (the sub-graders: {known})")
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise FormulaError(f"{node.value!r} is not a number")
    elif isinstance(node, ast.BinOp | ast.UnaryOp):
        if type(node.op) not in _BINARY and type(node.op) not in _UNARY:
            raise FormulaError(f"the operator in {ast.unparse(node)!r} is not allowed: use + - * / ^")
    elif not isinstance(node, ast.Expression | ast.Load | ast.operator | ast.unaryop):
        raise FormulaError(f"{ast.unparse(node)!r} is not allowed: numbers, sub-grader names, + - * / ^ and {allowed}")


def evaluate(tree: ast.Expression, scores: dict[str, float]) -> float:
    """The formula's value for one completion's sub-grader scores.

    Raises:
        ArithmeticError, ValueError: a division by zero, an overflow, the log of 0.

    >>> evaluate(parse_formula("(a + b) / 2 ^ 1", ["a", "b"]), {"a": 1.0, "b": 0.0})
    0.5
    """
    return float(_value(tree.body, scores))


def _value(node: ast.AST, scores: dict[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return scores[node.id]
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_value(node.operand, scores))
    if isinstance(node, ast.BinOp):
        value = _BINARY[type(node.op)](_value(node.left, scores), _value(node.right, scores))
        if isinstance(value, complex):  # a negative number to a fractional power
            raise ValueError(f"{ast.unparse(node)} is not a real number")
        return value
    if isinstance(node, ast.Call):
        return float(FUNCTIONS[node.func.id](*(_value(arg, scores) for arg in node.args)))
    raise AssertionError(f"unchecked node {ast.dump(node)}")  # parse_formula let it through: a bug
