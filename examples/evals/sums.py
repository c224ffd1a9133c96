"""An evaluation suite for `evaluation.suites` (`inspect: examples/evals/sums.py@sums`): the demo's sums as an
inspect-ai task, on a local dataset (sums.jsonl, beside this file), scored by whether the answer holds the sum.

    inspect eval examples/evals/sums.py@sums --model hf/local -M model_path=runs/<job_id>/merged
"""

from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import json_dataset
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def sums() -> Task:
    """Twelve sums of two numbers; a sample is correct when the model's answer includes the sum."""
    return Task(
        dataset=json_dataset(str(Path(__file__).with_name("sums.jsonl"))), solver=generate(), scorer=includes()
    )
