"""Writes `lockers.jsonl`, the agent example's dataset (examples/agents.yaml): one locker a row, whose code is a sum.

    python examples/data/make_lockers.py

Columns: `prompt` (a chat: "Open locker 7."), `note` (the note taped to the locker, "The code is 2+5.") and `code`
("7"), which the `Locker` environment (examples/agents.py) is reset with, and `completion`, the SFT warm-up's worked
conversation: the tool calls that open the locker (read_note, calculator on the sum, unlock with its value), each
followed by the tool's answer, then a final answer. Tool calls are written as OpenAI's API writes them (arguments a
JSON string); the warm-up renders them with the model's chat template and the tools' schemas, as the GRPO rollout
will.
"""

import json
import random
from pathlib import Path

SEED = 0
ROWS = 200
SYSTEM = "You open lockers with your tools."


def call(name: str, **arguments) -> dict:
    """An assistant turn that calls one tool."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}


def answer(name: str, content: str) -> dict:
    """The tool's answer, as TRL's loop appends it."""
    return {"role": "tool", "name": name, "content": content}


def rows() -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for i in range(1, ROWS + 1):
        a = rng.randint(1, 8)
        b = rng.randint(1, 9 - a)  # one-digit codes: a model from random weights can guess one before it copies it
        note, code = f"The code is {a}+{b}.", str(a + b)
        completion = [
            call("read_note"),
            answer("read_note", note),
            call("calculator", expression=f"{a}+{b}"),
            answer("calculator", code),
            call("unlock", code=code),
            answer("unlock", "unlocked"),
            {"role": "assistant", "content": "It is open."},
        ]
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Open locker {i}."}]
        out.append({"prompt": prompt, "note": note, "code": code, "completion": completion})
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("lockers.jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    print(f"wrote {path}")
