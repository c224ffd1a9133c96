"""An example agent task for `tools:` and `environment:` (examples/agents.yaml): open a locker whose code is a sum.

Each dataset row names a locker, the note taped to it (`note`: "The code is 12+30.") and its code (`code`). The
environment, `Locker`, is reset with the row before each rollout; its public methods (`read_note`, `unlock`) are the
model's tools, beside the spec's `tools:` (`calculator`). A rollout that reads the note, works the sum out and
unlocks scores 1.0 from `Locker.get_reward` (logged as rewards/Locker/mean). `tool_use_reward` is a shaping reward
for a model still learning the call format. Referenced from a spec by import path, from the repository root:

    tools: [grpoflow.examples.agents:calculator]
    environment: grpoflow.examples.agents:Locker

A tool is a typed function with a Google-style docstring: transformers' `get_json_schema` turns it into the JSON
schema the model sees, so its docstring holds no example (the model would read it). Check the examples with
`python -m doctest -v examples/agents.py`:

>>> calculator("12+30"), calculator("(2+3)*4"), calculator("7/2"), calculator("import os")
('42', '20', '3.5', 'error: not an arithmetic expression')
"""

import ast
import operator

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / and parentheses).

    Args:
        expression: e.g. "12+30".
    """
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return "error: not an arithmetic expression"
    return str(int(value)) if float(value).is_integer() else str(value)


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError(node)


class Locker:
    """A locker with a code; one instance per rollout, reset with the dataset row before it (TRL's environment).

    Example:
    ```python
    >>> locker = Locker()
    >>> locker.reset(note="The code is 12+30.", code="42")
    >>> locker.read_note(), locker.unlock("41"), locker.get_reward(), locker.unlock("42"), locker.get_reward()
    ('The code is 12+30.', 'wrong code', 0.0, 'unlocked', 1.0)

    ```
    """

    def __init__(self):
        self.note, self.code, self.unlocked = "", "", False

    def reset(self, note: str, code: str, **row) -> None:
        """Starts a rollout on a dataset row: its `note` and `code` columns (the others arrive in `row`)."""
        self.note, self.code, self.unlocked = note, str(code), False

    def read_note(self) -> str:
        """Read the note taped to the locker."""
        return self.note

    def unlock(self, code: str) -> str:
        """Try a code on the locker ("unlocked" or "wrong code").

        Args:
            code: the code.
        """
        self.unlocked = self.unlocked or str(code).strip() == self.code
        return "unlocked" if self.unlocked else "wrong code"

    def get_reward(self) -> float:
        """1.0 when the rollout unlocked the locker, else 0.0."""
        return 1.0 if self.unlocked else 0.0


def tool_use_reward(completions: list, **kwargs) -> list[float]:
    """Reward 1.0 for a rollout in which a tool answered (the model's call parsed and ran), else 0.0.

    A multi-turn completion is its list of messages: the assistant's calls, the tools' answers, the next turns.

    Args:
        completions (`list[list[dict]]`): the rollouts' messages.

    Example:
    ```python
    >>> call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    >>> answer = {"role": "tool", "name": "f", "content": "x"}
    >>> tool_use_reward([[call, answer], [{"role": "assistant", "content": "9"}]])
    [1.0, 0.0]

    ```
    """
    return [float(any(m.get("role") == "tool" for m in c)) if isinstance(c, list) else 0.0 for c in completions]
