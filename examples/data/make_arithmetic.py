"""Writes `arithmetic.jsonl`, the demo's dataset: every sum a+b with a, b in 0..19, in a fixed shuffled order.

    python examples/data/make_arithmetic.py

Columns: `prompt` ("What is 7+12?"), `answer` ("19", what the `exact_answer` reward checks) and `completion`, the
SFT warm-up's demonstration. Like much scraped data, the demonstrations are inconsistent: about half give the bare
number, the others a sentence ("The answer is 19."), which `exact_answer` scores 0. The warm-up teaches the model
to add but leaves it undecided about the format; GRPO then learns from the reward alone to answer with the number.
"""

import json
import random
from pathlib import Path

SEED = 0
LIMIT = 20
VERBOSE_SHARE = 0.5


def rows() -> list[dict]:
    rng = random.Random(SEED)
    out = []
    for a in range(LIMIT):
        for b in range(LIMIT):
            answer = str(a + b)
            completion = f"The answer is {answer}." if rng.random() < VERBOSE_SHARE else answer
            out.append({"prompt": f"What is {a}+{b}?", "answer": answer, "completion": completion})
    rng.shuffle(out)
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("arithmetic.jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    print(f"wrote {path}")
