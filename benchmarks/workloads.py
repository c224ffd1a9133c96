"""The benchmarks' training workloads: their datasets and their reward.

`builtin:tiny` starts from random weights, so the demo's `exact_answer` scores every completion 0 and no group has
any variance. The benchmarks instead use `graded_variety_reward`, which scores a completion by how many distinct
characters it holds (random completions almost always differ in that) on rows whose `graded` column is true, and
gives a constant 0.0 on the others. A dataset's share of ungraded rows is then its share of zero-variance groups.

- `demo-shaped`: the demo's arithmetic prompts (~15 tokens), 8 rollouts of up to 24 tokens.
- `long-prompt`: ~256-token prompts (a passage and a question) with answers of up to 8 tokens, the shape of
  extraction or classification over a long context; the backward pass then dominates a step.
"""

import json
from pathlib import Path

from grpoflow.trainers.rewards.text import completion_text

ARITHMETIC = Path(__file__).resolve().parent.parent / "examples" / "data" / "arithmetic.jsonl"
PASSAGE = (
    "The river rises in the northern hills, runs south past three mill towns and a ruined abbey, and meets the sea "
    "at a wide estuary where the old harbour silted up two centuries ago. Boats still moor upstream at the bridge. "
)


def graded_variety_reward(completions, graded, **kwargs) -> list[float]:
    """Distinct characters in the completion, divided by 10, on rows whose `graded` is true; 0.0 on the others.

    >>> graded_variety_reward(["abca", "aaaa", "xyz"], graded=[True, True, False])
    [0.3, 0.1, 0.0]
    """
    return [len(set(completion_text(c))) / 10 if g else 0.0 for c, g in zip(completions, graded, strict=True)]


def write_dataset(path: Path, shape: str, rows: int, zero_variance_share: float) -> Path:
    """Writes `rows` prompts of the given shape as JSONL; the first `zero_variance_share` of every 10 rows ungraded.

    Args:
        path (`Path`): the JSONL file to write.
        shape (`str`): `"demo-shaped"` or `"long-prompt"`.
        rows (`int`): number of rows; with one epoch of training (max_steps == rows) every row is one step.
        zero_variance_share (`float`): share of rows whose reward is constant (multiples of 0.1).
    """
    arithmetic = [json.loads(line)["prompt"] for line in ARITHMETIC.read_text().splitlines()]
    ungraded_per_10 = round(zero_variance_share * 10)
    lines = []
    for i in range(rows):
        question = arithmetic[i % len(arithmetic)]
        prompt = question if shape == "demo-shaped" else f"{(PASSAGE * 2)[:240]}\nQ{i}: {question}\nA:"
        lines.append(json.dumps({"prompt": prompt, "graded": i % 10 >= ungraded_per_10}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


SHAPES = {
    # shape: (rollouts_per_prompt, max_response_length)
    "demo-shaped": (8, 24),
    "long-prompt": (8, 8),
}
