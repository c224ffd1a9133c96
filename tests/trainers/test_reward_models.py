"""Reward models (`rewards: [{model: ...}]`): the offline checks, scoring as TRL scores, the dry run, and a GRPO run
whose metrics hold the model's reward. The classifier is a tiny Qwen2ForSequenceClassification built offline with
builtin:tiny's tokenizer."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from grpoflow.core.spec import SpecError, load_spec
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import call_reward, dry_run_job_rewards
from grpoflow.trainers.rewards.models import get_reward_model_reward, reward_model_problem


def build_tiny_classifier(folder: Path, seed: int = 0) -> Path:
    """A tiny sequence classifier (num_labels=1) with builtin:tiny's tokenizer, saved to `folder`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from grpoflow.trainers.model.tiny import TINY_CONFIG, build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id, **TINY_CONFIG)
    torch.manual_seed(seed)
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    return build_tiny_classifier(tmp_path_factory.mktemp("rm") / "tiny-rm")


# --- offline checks ------------------------------------------------------------------------------------------------


def _folder(tmp_path: Path, classifier: Path, change: str) -> str:
    folder = tmp_path / "rm"
    if change == "missing":
        return str(folder)
    shutil.copytree(classifier, folder)
    if change == "no config":
        (folder / "config.json").unlink()
    elif change == "causal lm":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    elif change == "no weights":
        (folder / "model.safetensors").unlink()
    elif change == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    return str(folder)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ("missing", "does not exist"),  # a typo in the path
        ("no config", "has no config.json"),  # weights without a config are no model folder
        ("causal lm", "is not a sequence classifier (config.json architectures: Qwen2ForCausalLM)"),  # a policy
        ("no weights", "has a config.json but no weights"),  # a config alone
        ("no tokenizer", "has no tokenizer"),  # TRL scores with the reward model's own tokenizer
        ("none", None),  # a saved classifier with its tokenizer
    ],
)
def test_reward_model_problems_are_found_offline(tmp_path, classifier, change, fragment):
    problem = reward_model_problem(_folder(tmp_path, classifier, change))
    assert problem is None if fragment is None else fragment in problem


def test_a_hub_id_must_be_in_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    problem = reward_model_problem("grpoflow-tests/no-such-reward-model")
    assert "'grpoflow-tests/no-such-reward-model' is not in the local Hugging Face cache" in problem
    assert "hf download grpoflow-tests/no-such-reward-model" in problem


def test_a_cached_hub_classifier_passes(tmp_path, monkeypatch, classifier):
    # The Hub cache layout: models--owner--name/snapshots/<commit>/ with refs/main naming the commit.
    repo = tmp_path / "cache" / "models--grpoflow-tests--tiny-rm"
    shutil.copytree(classifier, repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    assert reward_model_problem("grpoflow-tests/tiny-rm") is None


# --- the spec ------------------------------------------------------------------------------------------------------


def _spec(tmp_path: Path, dataset_file: Path, rewards: list) -> Path:
    spec = {
        "name": "rm",
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(dataset_file)},
        "rewards": rewards,
        "evaluation": {"holdout": 0},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_name_defaults_to_the_models_last_part(tmp_path, dataset_file, classifier):
    spec, _ = load_spec(
        _spec(tmp_path, dataset_file, [{"model": f"{classifier}/"}, {"model": str(classifier), "name": "b"}])
    )
    assert [(r.name, r.model) for r in spec.rewards] == [("tiny-rm", f"{classifier}/"), ("b", str(classifier))]


@pytest.mark.parametrize(
    "reward, fragment",
    [
        ({"model": "a/rm", "function": "m:f"}, "rewards[0]: give function or model, not both"),
        ({"model": "a/rm", "kwargs": {"x": 1}}, "rewards[0].kwargs: a reward model takes no kwargs"),
        ({"model": ""}, "rewards[0].model"),  # an empty id
    ],
)
def test_spec_rules_for_a_reward_model(tmp_path, dataset_file, reward, fragment):
    with pytest.raises(SpecError) as raised:
        load_spec(_spec(tmp_path, dataset_file, [reward]))
    assert fragment in str(raised.value)


def test_build_reward_refuses_a_causal_lm(tmp_path, classifier):
    folder = _folder(tmp_path, classifier, "causal lm")
    with pytest.raises(RewardError, match=r"reward 'rm': .* is not a sequence classifier"):
        build_reward("rm", model=folder)


# --- scoring -------------------------------------------------------------------------------------------------------


def _direct_scores(folder: Path, texts: list[str]) -> list[float]:
    """Each text scored alone, unpadded: what right padding plus the config's pad id must reproduce in a batch."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.inference_mode():
        return [
            model(**tokenizer(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item() for t in texts
        ]


def test_scores_are_the_classifiers_logit_of_prompt_plus_completion(classifier):
    reward = build_reward("tiny-rm", model=str(classifier))
    prompts, completions = ["What is 2+2?"] * 3, ["4", "<answer>4</answer>", "I think it is five, or maybe 4"]
    scores = call_reward(reward, prompts, completions, [[0]] * 3, {})
    expected = _direct_scores(classifier, [p + c for p, c in zip(prompts, completions, strict=True)])
    assert scores == pytest.approx(expected, abs=1e-4)
    assert len(set(scores)) == 3  # different texts, different scores: the batch is not one row repeated


def test_chat_prompts_go_through_the_reward_models_chat_template(classifier):
    from transformers import AutoTokenizer

    reward = get_reward_model_reward(str(classifier))
    prompt = [{"role": "user", "content": "What is 2+2?"}]
    completions = [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "five"}]]
    scores = call_reward(reward, [prompt, prompt], completions, [[0], [0]], {})
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    texts = [tokenizer.apply_chat_template(prompt + c, tokenize=False) for c in completions]
    assert scores == pytest.approx(_direct_scores(classifier, texts), abs=1e-4)


def test_the_dry_run_scores_with_the_model(tmp_path, dataset_file, classifier):
    from datasets import Dataset

    spec, _ = load_spec(_spec(tmp_path, dataset_file, [{"name": "exact_answer"}, {"model": str(classifier)}]))
    rows = Dataset.from_list([json.loads(line) for line in dataset_file.read_text().splitlines()])
    rewards = [build_reward(r.name, r.function, r.kwargs, r.model) for r in spec.rewards]
    assert dry_run_job_rewards(spec, rewards, rows) == []


def test_the_dry_run_skips_a_large_model_saying_why(tmp_path, dataset_file, classifier, monkeypatch):
    from datasets import Dataset

    import grpoflow.trainers.rewards.dry_run

    monkeypatch.setattr(grpoflow.trainers.rewards.dry_run, "DRY_RUN_MAX_MODEL_BYTES", 1000)
    spec, _ = load_spec(_spec(tmp_path, dataset_file, [{"model": str(classifier)}]))
    rows = Dataset.from_list([json.loads(line) for line in dataset_file.read_text().splitlines()])
    notes = dry_run_job_rewards(spec, [build_reward("tiny-rm", model=str(classifier))], rows)
    assert (
        len(notes) == 1 and notes[0].startswith("reward 'tiny-rm': dry run skipped") and "GiB of weights" in notes[0]
    )


def test_preflight_names_the_model_field(tmp_path, dataset_file, classifier):
    from grpoflow.jobs.preflight import preflight

    causal = _folder(tmp_path, classifier, "causal lm")
    spec, _ = load_spec(_spec(tmp_path, dataset_file, [{"name": "exact_answer"}, {"model": causal, "weight": 0.5}]))
    problems = preflight(spec)
    assert len(problems) == 1 and problems[0].startswith(f"rewards[1].model: {causal} is not a sequence classifier")
    spec, _ = load_spec(_spec(tmp_path, dataset_file, [{"name": "exact_answer"}, {"model": str(classifier)}]))
    assert preflight(spec) == []


def test_a_reward_model_can_be_the_evaluation_metric(tmp_path, dataset_file, classifier):
    from datasets import Dataset

    from grpoflow.trainers.evaluate import score
    from grpoflow.trainers.model.tiny import build_tiny

    rewards = [{"name": "exact_answer"}, {"model": str(classifier), "name": "rm"}]
    path = _spec(tmp_path, dataset_file, rewards)
    spec, _ = load_spec(path, ["evaluation.metric=rm", "evaluation.max_new_tokens=3"])
    rows = Dataset.from_list([{"prompt": "What is 1+2?", "answer": "3"}, {"prompt": "What is 3+4?", "answer": "7"}])
    mean = score(str(build_tiny()), rows, spec)
    assert isinstance(mean, float) and mean == mean  # the classifier's mean logit, not None (an unscored metric)


# --- training ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_trains_on_a_reward_model_and_logs_its_metric(make_job, classifier):
    from grpoflow.jobs.launch import run_child
    from grpoflow.trainers.metrics import read_metrics

    rewards = [{"name": "exact_answer"}, {"model": str(classifier), "name": "rm", "weight": 0.5}]
    hyperparameters = {"max_steps": 2, "rollouts_per_prompt": 2, "max_response_length": 4}
    job, _ = make_job("rm", rewards=rewards, hyperparameters=hyperparameters, evaluation={"holdout": 0})
    run_child("grpoflow.trainers.grpo", job, 1, "train.log", result=job.training_result)
    rows = read_metrics(job.metrics)
    assert len(rows) == 2
    values = [row["values"]["rewards/rm/mean"] for row in rows]
    assert all(isinstance(v, float) and v == v for v in values)  # a number, not NaN
    assert "rewards/tiny-rm/mean" not in rows[0]["values"]  # the spec's name, not TRL's default from the path
