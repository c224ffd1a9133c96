"""Held-out evaluation: scored in the training child from the model in memory, it equals scoring merged/ from disk."""

import hashlib
import json

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import intervals
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.trainers import grpo
from grpoflow.trainers.dataset import ingest_dataset
from grpoflow.trainers.evaluate import evaluate
from grpoflow.trainers.rollouts import read_rows, step_file
from tests.conftest import arithmetic_rows, write_jsonl


def text_hash(completions, **kwargs) -> list[float]:
    return [int(hashlib.sha256(c.encode()).hexdigest()[:12], 16) / 16**12 for c in completions]


def make_job(tmp_path, evaluation: dict | None = None, **hyperparameters) -> tuple[JobDir, object]:
    data = write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(24))
    spec, _ = load_spec(
        {
            "name": "ev",
            "base_model": "builtin:tiny",
            "dataset": {"uri": str(data)},
            # A score that is a hash of each completion's text: equal means the very same completions, not merely
            # "both wrong".
            "rewards": [{"name": "text_hash", "function": "tests.trainers.test_evaluate:text_hash"}],
            "hyperparameters": {
                "max_steps": 4,
                "rollouts_per_prompt": 4,
                "max_response_length": 8,
                "learning_rate": 5e-3,
                **hyperparameters,
            },
            "evaluation": {"holdout": 8, "max_new_tokens": 12, **(evaluation or {})},
        }
    )
    job = JobDir(tmp_path / "job")
    job.root.mkdir()
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset, holdout=8, seed=spec.hyperparameters.seed)
    return job, spec


def test_training_child_scores_what_merged_holds(tmp_path):
    job, spec = make_job(tmp_path)
    assert grpo.evaluates_in_training(spec)

    assert grpo.main(str(job.root)) == 0

    training = json.loads(job.training_result.read_text())
    in_child = training["evaluation"]
    assert training["evaluated_in_training"] is True
    assert in_child == {k: v for k, v in json.loads(job.evaluation.read_text()).items()}
    assert in_child["n"] == 8 and in_child["metric"] == "text_hash"
    assert in_child["before"] != in_child["after"]  # training changed what the model generates
    # The same evaluation by the path LoRA jobs take: both models loaded from their folders.
    from_disk = evaluate(job, spec, training["start_model"])
    assert (from_disk["before"], from_disk["after"]) == (in_child["before"], in_child["after"])
    # The intervals: the paired bootstrap of the per-prompt scores the held-out files keep; each score inside its own.
    per_prompt = [[r["score"] for r in read_rows(step_file(job.evaluation_rollouts, s))] for s in (0, 4)]
    assert in_child["confidence"] == 0.95 and in_child["ci"] == intervals(*per_prompt, 0.95)
    assert from_disk["ci"] == in_child["ci"] and all(len(in_child["ci"][k]) == 2 for k in ("before", "after", "gain"))
    for side in ("before", "after"):
        low, high = in_child["ci"][side]
        assert low <= in_child[side] <= high
    assert in_child["ci"]["gain"][0] <= in_child["after"] - in_child["before"] <= in_child["ci"]["gain"][1]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, True),
        ({"hyperparameters": {"lora_rank": 4}}, False),  # evaluated on merged/ after the merge stage
        ({"gpu_count": 2}, False),  # several processes: the pipeline evaluates
    ],
)
def test_which_jobs_evaluate_in_training(tmp_path, changes, expected):
    raw = {
        "name": "ev",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(tmp_path / "d.jsonl")},
        "rewards": [{"name": "exact_answer"}],
    }
    for key, value in changes.items():
        raw[key] = value
    spec, _ = load_spec(raw)
    assert grpo.evaluates_in_training(spec) is expected


async def async_char_count(completions, log_metric, completion_ids, **kwargs) -> list[float]:
    # An async reward that uses TRL's logging hook and completion_ids, as training may pass them: the evaluation
    # must call it the same way.
    log_metric("seen", len(completions))
    return [float(len(ids)) for ids in completion_ids]


def test_evaluation_calls_rewards_as_training_does(tmp_path):
    from datasets import Dataset

    from grpoflow.trainers.evaluate import reward_values
    from grpoflow.trainers.model.load import load_tokenizer
    from grpoflow.trainers.model.tiny import build_tiny

    rows = Dataset.from_list([{"prompt": "p1", "answer": "1"}, {"prompt": "p2", "answer": "2"}])
    values = reward_values(async_char_count, ["p1", "p2"], ["ab", "héllo"], rows, load_tokenizer(str(build_tiny())))
    assert values == [2.0, 6.0]  # builtin:tiny's tokenizer is byte-level: one id per UTF-8 byte


def even_length(completions, **kwargs) -> list[float]:
    return [float(len(c) % 2 == 0) for c in completions]


def test_samples_score_each_prompt_by_the_mean_of_its_sampled_completions(tmp_path):
    from grpoflow.core.scores import pass_at_k
    from grpoflow.trainers.evaluate import load_for_generation
    from grpoflow.trainers.model.tiny import build_tiny

    # A score of 1 for about half the completions: pass@2 above pass@1.
    metric = {"name": "even_length", "function": f"{__name__}:even_length"}
    job, spec = make_job(tmp_path, evaluation={"samples": 2, "metric": metric})
    tiny = str(build_tiny())

    result = evaluate(job, spec, tiny, after=load_for_generation(tiny), training={"global_step": 1})

    rows = read_rows(step_file(job.evaluation_rollouts, 0))
    assert [(r["row"], r["sample"]) for r in rows] == [(i, s) for i in range(8) for s in (0, 1)]
    pairs = [[r for r in rows if r["row"] == i] for i in range(8)]
    assert any(a["completion"] != b["completion"] for a, b in pairs)  # sampled: greedy would write each twice
    assert result["before"] == pytest.approx(sum((a["score"] + b["score"]) / 2 for a, b in pairs) / 8)
    passed = [int(a["score"] == 1) + int(b["score"] == 1) for a, b in pairs]
    assert result["pass_at_k"]["before"] == pytest.approx(
        {"pass@1": sum(c / 2 for c in passed) / 8, "pass@2": sum(pass_at_k(2, c, 2) for c in passed) / 8}
    )
    assert 0 < result["pass_at_k"]["before"]["pass@1"] < result["pass_at_k"]["before"]["pass@2"]
    # The same model and seed: the very same sampled completions for "after".
    assert read_rows(step_file(job.evaluation_rollouts, 1)) == rows
    assert result["pass_at_k"]["after"] == result["pass_at_k"]["before"]
