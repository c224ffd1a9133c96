"""Tests for core/spec/: the job spec's defaults and rules, its error messages, overrides and resolution, and the
README's hyperparameter table generated from the model."""

import copy
import importlib.util
import json
import runpy
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import grpoflow.core.spec.models as spec_models
from grpoflow.core.spec import (
    JobSpec,
    SpecError,
    apply_overrides,
    hyperparameter_table,
    load_spec,
    model_family,
    resolved_dict,
    to_yaml,
)

BASE = {
    "name": "t",
    "base_model": "builtin:tiny",
    "dataset": {"uri": "x.jsonl"},
    "rewards": [{"name": "exact_answer"}],
}
DROP = object()  # as a patch value: remove the key
ABSENT = object()  # as an expected value: the key is not in the resolved spec
HAS_REWARDS = importlib.util.find_spec("grpoflow.trainers.rewards") is not None
needs_rewards = pytest.mark.skipif(not HAS_REWARDS, reason="trainers/rewards/builtin.py (REWARDS) not written yet")


@pytest.fixture
def spec_dict() -> dict:
    return copy.deepcopy(BASE)


def patched(patch: dict) -> dict:
    """BASE with `patch` applied: dotted paths (list items by index) to values, or DROP to remove a key."""
    data = copy.deepcopy(BASE)
    for path, value in patch.items():
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        key = int(last) if isinstance(node, list) else last
        if value is DROP:
            del node[key]
        else:
            node[key] = value
    return data


def lookup(data: dict, path: str):
    for key in path.split("."):
        if isinstance(data, list):
            data = data[int(key)]
        elif key not in data:
            return ABSENT
        else:
            data = data[key]
    return data


def rejected(patch: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(patched(patch))
    return info.value.problems


HP = "hyperparameters"
GB = (
    "not supported by GRPO: a step's batch is groups of rollouts_per_prompt completions; set "
    "hyperparameters.prompts_per_step (prompts per optimizer step) instead"
)

# (patch onto BASE, expected): a dict of resolved values means accepted; a string is the one problem it must cause.
CASES = [
    # --- every hyperparameter's default (docs/reference/spec.md) ---
    pytest.param({}, {f"{HP}.learning_rate": 1e-6}, id="default-learning_rate"),
    pytest.param({}, {f"{HP}.num_epochs": 1}, id="default-num_epochs"),
    pytest.param({}, {f"{HP}.max_steps": 100}, id="default-max_steps"),
    pytest.param({}, {f"{HP}.rollouts_per_prompt": 8}, id="default-rollouts_per_prompt"),
    pytest.param({}, {f"{HP}.kl_coef": 0.0}, id="default-kl_coef"),
    # Without Unsloth it has no effect, so the resolved spec leaves it out (and stays loadable).
    pytest.param({}, {f"{HP}.max_prompt_length": ABSENT}, id="default-max_prompt_length-hidden"),
    pytest.param({f"{HP}.use_unsloth": True}, {f"{HP}.max_prompt_length": 1024}, id="default-max_prompt_length"),
    pytest.param({}, {f"{HP}.max_response_length": 2048}, id="default-max_response_length"),
    pytest.param({}, {f"{HP}.global_batch_size": None}, id="default-global_batch_size"),
    pytest.param({}, {f"{HP}.seed": 42}, id="default-seed"),
    pytest.param({}, {f"{HP}.system_prompt": None}, id="default-system_prompt"),
    pytest.param({}, {f"{HP}.lora_rank": None}, id="default-lora_rank"),
    pytest.param({}, {f"{HP}.lora_alpha": None}, id="default-lora_alpha"),
    # null: every attention and MLP projection of the architecture (trainers/model/architecture.py), found at run time.
    pytest.param({}, {f"{HP}.lora_target_modules": None}, id="default-lora_target_modules"),
    pytest.param({}, {f"{HP}.load_in_4bit": False}, id="default-load_in_4bit"),
    pytest.param({}, {f"{HP}.use_unsloth": False}, id="default-use_unsloth"),
    pytest.param({}, {f"{HP}.use_liger": False}, id="default-use_liger"),
    pytest.param({}, {f"{HP}.temperature": 1.0}, id="default-temperature"),
    pytest.param({}, {f"{HP}.skip_zero_variance_groups": False}, id="default-skip_zero_variance_groups"),
    # --- the rest of the spec's defaults ---
    pytest.param({}, {"gpu_count": 1, "output_uri": "runs", "stop_on_alert": False}, id="default-job"),
    # A tenth of max_steps.
    pytest.param({}, {"checkpoint_every": 10}, id="default-checkpoint_every"),
    pytest.param({}, {"publish": None, "deploy": None, "webhooks": []}, id="default-optional-sections"),
    pytest.param(
        {},
        {"dataset.prompt_column": "prompt", "dataset.split": None, "dataset.max_row_bytes": 1_000_000},
        id="default-dataset",
    ),
    pytest.param(
        {}, {"rewards.0.weight": 1.0, "rewards.0.function": None, "rewards.0.kwargs": {}}, id="default-reward"
    ),
    pytest.param(
        {},
        {"sft.enabled": False, "sft.completion_column": "completion", "sft.max_steps": 200, "sft.batch_size": 8},
        id="default-sft",
    ),
    pytest.param({}, {"sft.learning_rate": 2e-5}, id="default-sft-learning_rate"),
    # The metric defaults to the first reward, the generation length to max_response_length.
    pytest.param(
        {},
        {"evaluation.holdout": 0.1, "evaluation.metric": "exact_answer", "evaluation.max_new_tokens": 2048},
        id="default-evaluation",
    ),
    # An empty YAML section (`sft:`) is null and means "all defaults".
    pytest.param(
        {"sft": None, HP: None, "webhooks": None}, {"sft.max_steps": 200, "webhooks": []}, id="null-sections"
    ),
    # --- learning_rate > 0 ---
    pytest.param({f"{HP}.learning_rate": 2e-5}, {f"{HP}.learning_rate": 2e-5}, id="learning_rate-ok"),
    pytest.param({f"{HP}.learning_rate": 0}, f"{HP}.learning_rate: must be > 0 (got 0)", id="learning_rate-zero"),
    pytest.param({f"{HP}.learning_rate": -1}, f"{HP}.learning_rate: must be > 0 (got -1)", id="learning_rate-neg"),
    pytest.param({f"{HP}.learning_rate": "fast"}, f"{HP}.learning_rate: must be a number", id="learning_rate-text"),
    # --- num_epochs: accepted (a warning, tested below), still must be >= 1 ---
    pytest.param({f"{HP}.num_epochs": 3}, {f"{HP}.num_epochs": 3}, id="num_epochs-ok"),
    pytest.param({f"{HP}.num_epochs": 0}, f"{HP}.num_epochs: must be >= 1 (got 0)", id="num_epochs-zero"),
    # --- max_steps >= 1; checkpoint_every follows it ---
    pytest.param({f"{HP}.max_steps": 250}, {"checkpoint_every": 25}, id="max_steps-checkpoint_every"),
    # Fewer than 10 steps still checkpoints every step, never every 0.
    pytest.param({f"{HP}.max_steps": 5}, {"checkpoint_every": 1}, id="max_steps-small"),
    pytest.param({f"{HP}.max_steps": 0}, f"{HP}.max_steps: must be >= 1 (got 0)", id="max_steps-zero"),
    pytest.param({f"{HP}.max_steps": 2.5}, f"{HP}.max_steps: must be a whole number (got 2.5)", id="max_steps-float"),
    # --- rollouts_per_prompt >= 2: a group of one has no baseline ---
    pytest.param({f"{HP}.rollouts_per_prompt": 2}, {f"{HP}.rollouts_per_prompt": 2}, id="rollouts-two"),
    pytest.param({f"{HP}.rollouts_per_prompt": 1}, f"{HP}.rollouts_per_prompt: must be >= 2 (got 1)", id="rollouts-1"),
    # --- kl_coef >= 0 ---
    pytest.param({f"{HP}.kl_coef": 0.04}, {f"{HP}.kl_coef": 0.04}, id="kl_coef-ok"),
    pytest.param({f"{HP}.kl_coef": -0.1}, f"{HP}.kl_coef: must be >= 0 (got -0.1)", id="kl_coef-neg"),
    # --- max_prompt_length: only with use_unsloth ---
    pytest.param(
        {f"{HP}.max_prompt_length": 512}, f"{HP}.max_prompt_length: only used with use_unsloth", id="mpl-alone"
    ),
    # Setting it to the default is still setting it: the user expects truncation that never happens.
    pytest.param({f"{HP}.max_prompt_length": 1024}, f"{HP}.max_prompt_length: only used with", id="mpl-default"),
    pytest.param(
        {f"{HP}.max_prompt_length": 512, f"{HP}.use_unsloth": True}, {f"{HP}.max_prompt_length": 512}, id="mpl-unsloth"
    ),
    # --- max_response_length >= 1 ---
    pytest.param({f"{HP}.max_response_length": 256}, {"evaluation.max_new_tokens": 256}, id="max_response_length-ok"),
    pytest.param({f"{HP}.max_response_length": 0}, f"{HP}.max_response_length: must be >= 1 (got 0)", id="mrl-zero"),
    # --- global_batch_size: any value is rejected; an explicit null is harmless ---
    pytest.param(
        {f"{HP}.global_batch_size": 32}, f"{HP}.global_batch_size: {GB} (got 32)", id="global_batch_size-set"
    ),
    pytest.param({f"{HP}.global_batch_size": 0}, f"{HP}.global_batch_size: {GB} (got 0)", id="global_batch_size-0"),
    pytest.param({f"{HP}.global_batch_size": None}, {f"{HP}.global_batch_size": None}, id="global_batch_size-null"),
    # --- seed, system_prompt: free values of their type ---
    pytest.param({f"{HP}.seed": 7}, {f"{HP}.seed": 7}, id="seed-ok"),
    pytest.param({f"{HP}.seed": "x"}, f"{HP}.seed: must be an integer (got 'x')", id="seed-text"),
    pytest.param({f"{HP}.system_prompt": "Be brief."}, {f"{HP}.system_prompt": "Be brief."}, id="system_prompt-set"),
    # --- lora_rank >= 1; lora_alpha defaults to it and needs it ---
    pytest.param({f"{HP}.lora_rank": 16}, {f"{HP}.lora_rank": 16, f"{HP}.lora_alpha": 16}, id="lora_alpha-from-rank"),
    pytest.param({f"{HP}.lora_rank": 8, f"{HP}.lora_alpha": 32}, {f"{HP}.lora_alpha": 32}, id="lora_alpha-explicit"),
    pytest.param({f"{HP}.lora_rank": 0}, f"{HP}.lora_rank: must be >= 1 (got 0)", id="lora_rank-zero"),
    pytest.param({f"{HP}.lora_alpha": 16}, f"{HP}.lora_alpha: requires lora_rank", id="lora_alpha-without-rank"),
    # --- lora_target_modules: null, a non-empty list of names, or "all-linear"; needs lora_rank ---
    pytest.param(
        {f"{HP}.lora_rank": 8, f"{HP}.lora_target_modules": ["c_attn", "c_proj"]},
        {f"{HP}.lora_target_modules": ["c_attn", "c_proj"]},
        id="lora_target_modules-list",
    ),
    pytest.param(
        {f"{HP}.lora_rank": 8, f"{HP}.lora_target_modules": "all-linear"},
        {f"{HP}.lora_target_modules": "all-linear"},
        id="lora_target_modules-all-linear",
    ),
    pytest.param(
        {f"{HP}.lora_target_modules": ["q_proj"]},
        f"{HP}.lora_target_modules: requires lora_rank",
        id="lora_target_modules-without-rank",
    ),
    pytest.param(
        {f"{HP}.lora_rank": 8, f"{HP}.lora_target_modules": []},
        f"{HP}.lora_target_modules: must name at least one module",
        id="lora_target_modules-empty",
    ),
    pytest.param(
        {f"{HP}.lora_rank": 8, f"{HP}.lora_target_modules": "q_proj"},  # one name is still a list: [q_proj]
        f'{HP}.lora_target_modules: must be a list of module names, "all-linear", or null',
        id="lora_target_modules-bare-name",
    ),
    pytest.param(
        {f"{HP}.lora_rank": 8, f"{HP}.lora_target_modules": ["q_proj", ""]},
        f"{HP}.lora_target_modules: each module name must be a non-empty string",
        id="lora_target_modules-empty-name",
    ),
    pytest.param(
        {f"{HP}.lora_rank": 8, f"{HP}.lora_alpha": 0}, f"{HP}.lora_alpha: must be >= 1 (got 0)", id="alpha-0"
    ),
    # --- load_in_4bit: needs lora_rank, one GPU ---
    pytest.param({f"{HP}.load_in_4bit": True, f"{HP}.lora_rank": 8}, {f"{HP}.load_in_4bit": True}, id="qlora-ok"),
    pytest.param({f"{HP}.load_in_4bit": True}, f"{HP}.load_in_4bit: requires lora_rank", id="qlora-without-rank"),
    pytest.param(
        {f"{HP}.load_in_4bit": True, f"{HP}.lora_rank": 8, "gpu_count": 2},
        f"{HP}.load_in_4bit: QLoRA runs on a single GPU only (got gpu_count=2)",
        id="qlora-multi-gpu",
    ),
    # --- use_unsloth: one GPU ---
    pytest.param({f"{HP}.use_unsloth": True}, {f"{HP}.use_unsloth": True}, id="unsloth-ok"),
    pytest.param(
        {f"{HP}.use_unsloth": True, "gpu_count": 2},
        f"{HP}.use_unsloth: single GPU only (got gpu_count=2)",
        id="unsloth-2",
    ),
    # --- use_liger: not multi-GPU, not with Unsloth, not for NeoX/Pythia, Gemma 2, Cohere, Granite ---
    pytest.param({f"{HP}.use_liger": True}, {f"{HP}.use_liger": True}, id="liger-ok-tiny-qwen2"),
    pytest.param(
        {f"{HP}.use_liger": True, "base_model": "Qwen/Qwen2.5-0.5B-Instruct"},
        {f"{HP}.use_liger": True},
        id="liger-qwen",
    ),
    pytest.param(
        {f"{HP}.use_liger": True, "gpu_count": 2},
        f"{HP}.use_liger: not supported with gpu_count > 1",
        id="liger-2-gpus",
    ),
    pytest.param(
        {f"{HP}.use_liger": True, f"{HP}.use_unsloth": True},
        f"{HP}.use_liger: not supported together with use_unsloth",
        id="liger-unsloth",
    ),
    pytest.param(
        {f"{HP}.use_liger": True, "base_model": "EleutherAI/pythia-70m"},
        f"{HP}.use_liger: not supported for gpt_neox models",
        id="liger-pythia",
    ),
    pytest.param(
        {f"{HP}.use_liger": True, "base_model": "google/gemma-2-2b-it"},
        f"{HP}.use_liger: not supported for gemma2 models",
        id="liger-gemma2",
    ),
    pytest.param(
        {f"{HP}.use_liger": True, "base_model": "CohereForAI/c4ai-command-r-v01"},
        f"{HP}.use_liger: not supported for cohere models",
        id="liger-cohere",
    ),
    pytest.param(
        {f"{HP}.use_liger": True, "base_model": "ibm-granite/granite-3.0-2b-instruct"},
        f"{HP}.use_liger: not supported for granite models",
        id="liger-granite",
    ),
    # --- temperature >= 0.001 (near 0 sampling is greedy, tinier overflows); skip_zero_variance_groups: a switch ---
    pytest.param({f"{HP}.temperature": 0.7}, {f"{HP}.temperature": 0.7}, id="temperature-ok"),
    pytest.param({f"{HP}.temperature": 0.001}, {f"{HP}.temperature": 0.001}, id="temperature-floor"),
    pytest.param({f"{HP}.temperature": 0}, f"{HP}.temperature: must be >= 0.001: near 0", id="temperature-zero"),
    pytest.param({f"{HP}.temperature": 1e-300}, f"{HP}.temperature: must be >= 0.001", id="temperature-1e-300"),
    pytest.param({f"{HP}.temperature": "x"}, f"{HP}.temperature: must be a number (got 'x')", id="temperature-text"),
    pytest.param({f"{HP}.skip_zero_variance_groups": True}, {f"{HP}.skip_zero_variance_groups": True}, id="skip-zv"),
    pytest.param({f"{HP}.use_unsloth": "maybe"}, f"{HP}.use_unsloth: must be true or false", id="bool-text"),
    # --- gpu_count >= 1; a group must split evenly over the GPUs ---
    pytest.param({"gpu_count": 2}, {"gpu_count": 2}, id="gpu_count-2"),
    pytest.param({"gpu_count": 0}, "gpu_count: must be >= 1 (got 0)", id="gpu_count-zero"),
    pytest.param({"gpu_count": 3}, f"{HP}.rollouts_per_prompt: must be a multiple of gpu_count", id="gpu_count-3"),
    # --- checkpoint_every >= 1 when set ---
    pytest.param({"checkpoint_every": 7}, {"checkpoint_every": 7}, id="checkpoint_every-set"),
    pytest.param({"checkpoint_every": 0}, "checkpoint_every: must be >= 1 (got 0)", id="checkpoint_every-zero"),
    # --- name: a slug; base_model and dataset.uri: required, non-empty ---
    pytest.param({"name": "arithmetic-demo.v2_1"}, {"name": "arithmetic-demo.v2_1"}, id="name-ok"),
    pytest.param({"name": "Bad Name"}, "name: must be 1-63 lowercase letters", id="name-not-slug"),
    pytest.param({"name": "x" * 64}, "name: must be 1-63 lowercase letters", id="name-too-long"),
    pytest.param({"name": "demo\n"}, "name: must be 1-63 lowercase letters", id="name-trailing-newline"),
    pytest.param({"name": DROP}, "name: required", id="name-missing"),
    pytest.param({"base_model": ""}, "base_model: must not be empty (got '')", id="base_model-empty"),
    pytest.param({"dataset.uri": ""}, "dataset.uri: must not be empty", id="dataset-uri-empty"),
    pytest.param({"dataset": DROP}, "dataset: required", id="dataset-missing"),
    pytest.param({"dataset": "x.jsonl"}, "dataset: must be a mapping (got 'x.jsonl')", id="dataset-not-mapping"),
    # --- rewards: at least one, unique names, built-in unless function is set ---
    pytest.param({"rewards": []}, "rewards: must have at least 1 item(s)", id="rewards-empty"),
    pytest.param(
        {"rewards": [{"name": "exact_answer"}, {"name": "exact_answer", "weight": 0.5}]},
        "rewards[1].name: duplicate reward name 'exact_answer'",
        id="rewards-duplicate",
    ),
    pytest.param(
        {"rewards": [{"name": "mine", "function": "my_pkg.rewards:score", "kwargs": {"tol": 0.1}}]},
        {"rewards.0.function": "my_pkg.rewards:score", "rewards.0.kwargs": {"tol": 0.1}, "evaluation.metric": "mine"},
        id="reward-custom-function",
    ),
    pytest.param(
        {"rewards": [{"name": "mine", "function": "my_pkg/rewards.py"}]},
        "rewards[0].function: must be 'package.module:callable'",
        id="reward-function-format",
    ),
    pytest.param(
        {"rewards": [{"name": "nope"}]},
        "rewards[0].name: unknown built-in reward 'nope'; choose one of:",
        id="reward-unknown-builtin",
        marks=needs_rewards,
    ),
    pytest.param(
        {"rewards": [{"name": "mine", "function": "my_pkg.rewards:score\n"}]},
        "rewards[0].function: must be 'package.module:callable'",
        id="reward-function-newline",
    ),
    # --- a custom function alone is a reward: its name defaults to the function's (TRL's metric name) ---
    # The name is resolved in the model, so the metric rewards/<name>/mean and evaluation.metric's default see it.
    pytest.param(
        {"rewards": [{"function": "my_pkg.rewards:length_reward"}]},
        {"rewards.0.name": "length_reward", "evaluation.metric": "length_reward"},
        id="reward-function-alone",
    ),
    # An explicit null name is the same as none.
    pytest.param(
        {"rewards": [{"name": None, "function": "my_pkg.rewards:score"}]}, {"rewards.0.name": "score"}, id="name-null"
    ),
    # A name given with the function still wins (old specs keep working).
    pytest.param(
        {"rewards": [{"name": "mine", "function": "my_pkg.rewards:score"}]}, {"rewards.0.name": "mine"}, id="name-wins"
    ),
    # evaluation.metric may name a reward by its function's name.
    pytest.param(
        {"rewards": [{"name": "exact_answer"}, {"function": "my_pkg.rewards:score"}], "evaluation.metric": "score"},
        {"evaluation.metric": "score"},
        id="metric-function-name",
    ),
    # Two functions of one name would log into one metric.
    pytest.param(
        {"rewards": [{"function": "pkg_a.rewards:score"}, {"function": "pkg_b.rewards:score"}]},
        "rewards[1].name: duplicate reward name 'score'",
        id="reward-function-names-clash",
    ),
    # A function named like a built-in, next to that built-in.
    pytest.param(
        {"rewards": [{"name": "exact_answer"}, {"function": "my_pkg.rewards:exact_answer"}]},
        "rewards[1].name: duplicate reward name 'exact_answer'",
        id="reward-function-name-clashes-builtin",
    ),
    # A built-in still needs its name: a weight alone names nothing.
    pytest.param(
        {"rewards": [{"weight": 2.0}]},
        "rewards[0]: give name (a built-in",
        id="reward-neither-name-nor-function",
    ),
    # A malformed function without a name: only the function's own error, no second message.
    pytest.param(
        {"rewards": [{"function": "my_pkg/rewards.py"}]},
        "rewards[0].function: must be 'package.module:callable'",
        id="reward-function-alone-format",
    ),
    # --- evaluation: metric names one of the rewards; holdout is a fraction or a whole count ---
    pytest.param(
        {"rewards": [{"name": "exact_answer"}, {"name": "answer_format"}], "evaluation.metric": "answer_format"},
        {"evaluation.metric": "answer_format"},
        id="metric-second-reward",
    ),
    pytest.param(
        {"evaluation.metric": "nope"}, "evaluation.metric: 'nope' is not one of this spec's", id="metric-bad"
    ),
    # an entry that only names a job reward is that reward (the README once wrote metric: {name: exact_answer})
    pytest.param(
        {"evaluation.metric": {"name": "exact_answer"}},
        {"evaluation.metric": "exact_answer"},
        id="metric-entry-of-a-job-reward",
    ),
    # ... as the Prefect form sends it too: every other field of the entry at its default
    pytest.param(
        {"evaluation.metric": {"name": "exact_answer", "function": None, "model": None, "weight": 1.0, "kwargs": {}}},
        {"evaluation.metric": "exact_answer"},
        id="metric-entry-of-a-job-reward-from-the-form",
    ),
    # ... a custom function's reward by its name, where a built-in's check would have said "unknown built-in" too
    pytest.param(
        {"rewards": [{"function": "my_pkg.rewards:score"}], "evaluation.metric": {"name": "score"}},
        {"evaluation.metric": "score"},
        id="metric-entry-of-a-function-reward",
    ),
    # an entry of its own under a job reward's name: one line, saying what to write
    pytest.param(
        {
            "rewards": [{"function": "my_pkg.rewards:score"}],
            "evaluation.metric": {"name": "score", "kwargs": {"k": 1}},
        },
        "evaluation.metric.name: 'score' is already a reward of this job; write metric: score to score with that "
        "reward, or give this held-out metric a name of its own",
        id="metric-entry-named-as-a-job-reward",
    ),
    pytest.param({"evaluation.holdout": 20}, {"evaluation.holdout": 20}, id="holdout-count"),
    pytest.param({"evaluation.holdout": 0}, {"evaluation.holdout": 0}, id="holdout-disabled"),
    pytest.param({"evaluation.holdout": 1.5}, "evaluation.holdout: must be a fraction below 1", id="holdout-1.5"),
    pytest.param({"evaluation.holdout": -0.1}, "evaluation.holdout: must be >= 0", id="holdout-neg"),
    # --- evaluation.dataset: a separate validation set instead of the holdout ---
    pytest.param(  # holdout unset: none is taken from the training set, and the default gate still judges
        {"evaluation.dataset": {"uri": "data/validation.jsonl"}},
        {"evaluation.holdout": 0, "evaluation.dataset.prompt_column": "prompt", "evaluation.gate.min_gain": 0.0},
        id="validation-set",
    ),
    pytest.param(  # holdout 0 said outright is the same
        {"evaluation.dataset": {"uri": "data/validation.jsonl"}, "evaluation.holdout": 0, "evaluation.every": 5},
        {"evaluation.holdout": 0, "evaluation.every": 5, "evaluation.dataset.uri": "data/validation.jsonl"},
        id="validation-set-every",
    ),
    pytest.param(  # one or the other: the message says which to remove
        {"evaluation.dataset": {"uri": "data/validation.jsonl"}, "evaluation.holdout": 0.2},
        "evaluation.holdout: evaluation.dataset is scored instead of prompts held out of the training set; remove "
        "holdout to score the validation set, or remove evaluation.dataset",
        id="validation-set-with-holdout",
    ),
    pytest.param(  # the validation set's fields are the dataset's, checked the same way
        {"evaluation.dataset": {"uri": "data/validation.jsonl", "max_row_bytes": 0}},
        "evaluation.dataset.max_row_bytes: must be >= 1",
        id="validation-set-field",
    ),
    pytest.param(
        {"evaluation.holdout": 0, "evaluation.every": 5},
        "evaluation.every: scores the held-out prompts: set evaluation.holdout above 0 (or give evaluation.dataset)",
        id="every-without-held-out-prompts",
    ),
    # --- evaluation.confidence and the significant gate ---
    pytest.param({}, {"evaluation.confidence": 0.95, "evaluation.gate.significant": False}, id="confidence-default"),
    pytest.param({"evaluation.confidence": None}, {"evaluation.confidence": None}, id="confidence-none"),
    pytest.param({"evaluation.confidence": 1}, "evaluation.confidence: must be < 1", id="confidence-1"),
    pytest.param({"evaluation.confidence": 0}, "evaluation.confidence: must be > 0", id="confidence-0"),
    pytest.param(
        {"evaluation.gate.significant": True, "evaluation.gate.min_gain": 0.05},
        {"evaluation.gate.significant": True, "evaluation.gate.min_gain": 0.05},
        id="significant",
    ),
    pytest.param(  # no interval to judge
        {"evaluation.gate.significant": True, "evaluation.confidence": None},
        "evaluation: evaluation.gate.significant judges the interval of the gain against min_gain: set "
        "evaluation.gate.min_gain and evaluation.confidence",
        id="significant-without-confidence",
    ),
    pytest.param(  # the gate off: nothing to judge against
        {"evaluation.gate.significant": True, "evaluation.gate.min_gain": None},
        "evaluation: evaluation.gate.significant judges the interval",
        id="significant-without-min_gain",
    ),
    pytest.param(
        {"evaluation.gate.significant": True, "evaluation.holdout": 0},
        "evaluation: evaluation.gate judges held-out scores: set evaluation.holdout above 0",
        id="significant-without-holdout",
    ),
    # --- sft: positive steps, learning rate, batch size ---
    pytest.param({"sft.enabled": True, "sft.max_steps": 50}, {"sft.enabled": True, "sft.max_steps": 50}, id="sft-on"),
    pytest.param({"sft.max_steps": 0}, "sft.max_steps: must be >= 1 (got 0)", id="sft-max_steps"),
    pytest.param({"sft.learning_rate": 0}, "sft.learning_rate: must be > 0 (got 0)", id="sft-learning_rate"),
    pytest.param({"sft.batch_size": 0}, "sft.batch_size: must be >= 1 (got 0)", id="sft-batch_size"),
    # --- publish: a Hub owner/name, merged or adapter ---
    pytest.param(
        {"publish": {"repo_id": "my-org/my-model"}},
        {"publish.repo_id": "my-org/my-model", "publish.artifact": "merged", "publish.private": True},
        id="publish-defaults",
    ),
    pytest.param({"publish": {"repo_id": "my-model"}}, "publish.repo_id: must be 'owner/name'", id="repo_id-no-owner"),
    pytest.param({"publish": {"repo_id": "my--org/m"}}, "publish.repo_id: must be 'owner/name'", id="repo_id-dashes"),
    pytest.param({"publish": {"repo_id": "org/.model"}}, "publish.repo_id: must be 'owner/name'", id="repo_id-dot"),
    pytest.param(
        {"publish": {"repo_id": "o/" + "m" * 97}}, "publish.repo_id: must be 'owner/name'", id="repo_id-long"
    ),
    pytest.param(
        {"publish": {"repo_id": "o/m", "artifact": "full"}},
        "publish.artifact: must be 'merged' or 'adapter' (got 'full')",
        id="publish-artifact",
    ),
    # --- deploy: a slug name ---
    pytest.param({"deploy": {"name": "arith-demo"}}, {"deploy.name": "arith-demo"}, id="deploy-ok"),
    pytest.param({"deploy": {"name": "Arith Demo"}}, "deploy.name: must be 1-63 lowercase letters", id="deploy-name"),
    # --- webhooks: http(s) URLs; the secret is named by an env var, never given ---
    pytest.param(
        {"webhooks": [{"url": "https://example.com/hooks/grpo", "secret_env": "GRPOFLOW_WEBHOOK_SECRET"}]},
        {"webhooks.0.secret_env": "GRPOFLOW_WEBHOOK_SECRET"},
        id="webhook-ok",
    ),
    pytest.param(
        {"webhooks": [{"url": "ftp://example.com"}]}, "webhooks[0].url: must be an http(s) URL", id="hook-ftp"
    ),
    pytest.param({"webhooks": [{"url": "https://"}]}, "webhooks[0].url: must be an http(s) URL", id="webhook-no-host"),
    pytest.param(
        {"webhooks": [{"url": "http://h", "secret_env": "1-SECRET"}]},
        "webhooks[0].secret_env: must be an environment variable name",
        id="webhook-secret_env",
    ),
    # credentials in the URL would land in spec.yaml and Prefect's database: refused, pointing at secret_env
    pytest.param(
        {"webhooks": [{"url": "https://user:pass@example.com/hooks"}]},
        "webhooks[0].url: holds credentials (user:password@): credentials in the URL would be stored",
        id="webhook-userinfo",
    ),
    pytest.param(
        {"webhooks": [{"url": "https://example.com/hooks?token=abc"}]},
        "webhooks[0].url: holds credentials (?token=)",
        id="webhook-query-token",
    ),
    pytest.param(
        {"webhooks": [{"url": "https://example.com/h?team=a&api_key=abc&sig=x"}]},
        "webhooks[0].url: holds credentials (?api_key=, ?sig=)",  # every such parameter named at once
        id="webhook-query-key-sig",
    ),
    pytest.param(
        {"webhooks": [{"url": "https://example.com/hooks?team=ml&keyboard=1"}]},
        {"webhooks.0.url": "https://example.com/hooks?team=ml&keyboard=1"},  # ordinary parameters pass
        id="webhook-query-plain",
    ),
    # --- huge and non-finite values: rejected at submit time, not by an overflow once training runs ---
    pytest.param({f"{HP}.learning_rate": float("inf")}, f"{HP}.learning_rate: must be a finite number", id="lr-inf"),
    pytest.param({f"{HP}.kl_coef": float("nan")}, f"{HP}.kl_coef: must be a finite number", id="kl_coef-nan"),
    pytest.param({"rewards.0.weight": float("nan")}, "rewards[0].weight: must be a finite number", id="weight-nan"),
    # inf used to reach the whole-count check and crash it with OverflowError.
    pytest.param(
        {"evaluation.holdout": float("inf")}, "evaluation.holdout: must be a finite number", id="holdout-inf"
    ),
    pytest.param({f"{HP}.max_steps": 2**31 - 1}, {f"{HP}.max_steps": 2**31 - 1}, id="max_steps-largest"),
    pytest.param({f"{HP}.max_steps": 2**31}, f"{HP}.max_steps: must be <= 2147483647", id="max_steps-int32"),
    pytest.param({f"{HP}.max_steps": 1e30}, f"{HP}.max_steps: must be an integer <= 2147483647", id="steps-1e30"),
    # transformers.set_seed takes 0 .. 2**32 - 1 and would only say so after the model has loaded.
    pytest.param({f"{HP}.seed": 2**32 - 1}, {f"{HP}.seed": 2**32 - 1}, id="seed-largest"),
    pytest.param({f"{HP}.seed": -1}, f"{HP}.seed: must be >= 0 (got -1)", id="seed-negative"),
    pytest.param({f"{HP}.seed": 2**32}, f"{HP}.seed: must be <= 4294967295", id="seed-too-large"),
    pytest.param({"dataset.max_row_bytes": 0}, "dataset.max_row_bytes: must be >= 1 (got 0)", id="max_row_bytes-0"),
    # --- output_uri: a local folder, or an object store's URL ---
    pytest.param({"output_uri": "s3://bucket/runs"}, {"output_uri": "s3://bucket/runs"}, id="output_uri-s3"),
    pytest.param({"output_uri": "file:///data/my%20runs"}, {"output_uri": "/data/my runs"}, id="output_uri-file-url"),
    pytest.param({"output_uri": "local:///data/runs"}, {"output_uri": "/data/runs"}, id="output_uri-local-url"),
    pytest.param(
        {"output_uri": "file://nas/runs"}, "output_uri: file://nas/runs names host 'nas'", id="output_uri-file-host"
    ),
    pytest.param({"output_uri": "s4://bucket/runs"}, "output_uri: s4:// is refused: a local path", id="output_uri-s4"),
    # Any other protocol fsspec knows would let a deployed spec have the worker reach any address.
    pytest.param({"output_uri": "http://169.254.169.254/x"}, "output_uri: http:// is refused", id="output_uri-http"),
    pytest.param({"output_uri": "sftp://10.0.0.5/runs"}, "output_uri: sftp:// is refused", id="output_uri-sftp"),
    pytest.param({"output_uri": "hf://owner/runs"}, "output_uri: hf:// is refused", id="output_uri-hf"),
    pytest.param({"output_uri": ""}, "output_uri: must not be empty", id="output_uri-empty"),
]


@pytest.mark.parametrize("patch, expected", CASES)
def test_rules(patch, expected):
    if isinstance(expected, str):
        problems = rejected(patch)
        assert len(problems) == 1 and problems[0].startswith(expected), problems
    else:
        resolved = resolved_dict(load_spec(patched(patch))[0])
        assert {path: lookup(resolved, path) for path in expected} == expected


def test_builtin_reward_names_are_checked_without_the_rewards_module(monkeypatch):
    # The spec checks names against the base layer's table (grpoflow.core.catalog), never the implementations.
    monkeypatch.setitem(sys.modules, "grpoflow.trainers.rewards.builtin", None)
    assert rejected({"rewards": [{"name": "not_yet_known"}]}) == [
        "rewards[0].name: unknown built-in reward 'not_yet_known'; choose one of: answer_format, exact_answer, "
        "length_penalty, llm_judge, numeric_match (or set function: package.module:callable)"
    ]


@needs_rewards
def test_reward_needs_a_name_or_a_function():
    from grpoflow.trainers.rewards.builtin import REWARDS

    # Reported with the reward's other problems, not instead of them.
    problems = rejected({"rewards": [{"weight": "heavy"}]})
    assert problems == [
        "rewards[0].weight: must be a number (got 'heavy')",
        f"rewards[0]: give name (a built-in: {', '.join(REWARDS)}) or function: package.module:callable",
    ]


@needs_rewards
def test_function_alone_names_the_reward_and_its_metric(tmp_path):
    from grpoflow.trainers.rewards.build import build_reward

    spec, _ = load_spec(
        patched({"rewards": [{"function": "grpoflow.examples.rewards.arithmetic:close_answer_reward"}]})
    )
    [reward] = spec.rewards
    # TRL names the metric rewards/<__name__>/mean (trl.trainer.utils.get_callable_name).
    assert build_reward(reward.name, reward.function, reward.kwargs).__name__ == "close_answer_reward"
    # The job folder's spec.yaml holds the resolved name and loads again unchanged.
    assert "name: close_answer_reward" in to_yaml(spec)
    path = tmp_path / "spec.yaml"
    path.write_text(to_yaml(spec))
    assert load_spec(path)[0] == spec


def test_every_violation_is_reported_at_once():
    problems = rejected(
        {
            f"{HP}.learning_rate": -1,  # a field error
            f"{HP}.load_in_4bit": True,  # a cross-field rule, without lora_rank
            f"{HP}.lerning_rate": 1e-5,  # an unknown key
            f"{HP}.global_batch_size": 64,
            "evaluation.metric": "nope",
            "nmae": "x",
        }
    )
    assert sorted(problems) == sorted(
        [
            f"{HP}.learning_rate: must be > 0 (got -1)",
            f"{HP}.load_in_4bit: requires lora_rank (QLoRA trains LoRA adapters)",
            f"{HP}.lerning_rate: unknown key (did you mean 'learning_rate'?)",
            f"{HP}.global_batch_size: {GB} (got 64)",
            "evaluation.metric: 'nope' is not one of this spec's rewards: exact_answer (or give the metric as a "
            "reward entry of its own: {name: ...} or {function: ...})",
            "nmae: unknown key (did you mean 'name'?)",
        ]
    )


def test_spec_error_reads_as_a_list():
    with pytest.raises(SpecError) as info:
        load_spec(patched({"gpu_count": 0, "name": "Bad"}))
    text = str(info.value)
    assert text.startswith("spec rejected: 2 problems:\n  - ")
    assert "\n  - gpu_count: must be >= 1 (got 0)" in text
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "patch, problem",
    [
        # top level
        ({"gpu_cont": 2}, "gpu_cont: unknown key (did you mean 'gpu_count'?)"),
        # nested section
        ({f"{HP}.lerning_rate": 1e-5}, f"{HP}.lerning_rate: unknown key (did you mean 'learning_rate'?)"),
        ({"sft.max_step": 5}, "sft.max_step: unknown key (did you mean 'max_steps'?)"),
        # inside a list item, located by index
        ({"rewards.0.wieght": 2}, "rewards[0].wieght: unknown key (did you mean 'weight'?)"),
        # an optional section
        ({"publish": {"repo_id": "o/m", "privte": True}}, "publish.privte: unknown key (did you mean 'private'?)"),
        # a key of another level: named there, at every level (issue 39)
        (
            {"system_prompt": "Be brief."},
            "system_prompt: unknown key here; system_prompt belongs under hyperparameters:",
        ),
        (
            {"dataset.max_steps": 3},
            "dataset.max_steps: unknown key here; max_steps belongs under sft: or under hyperparameters:",
        ),
        (
            {"evaluation.min_gain": 0.1},
            "evaluation.min_gain: unknown key here; min_gain belongs under evaluation.gate:",
        ),
        ({"rewards.0.holdout": 3}, "rewards[0].holdout: unknown key here; holdout belongs under evaluation:"),
        (
            {f"{HP}.weight": 2},
            f"{HP}.weight: unknown key here; weight belongs in each rewards: entry or under evaluation.metric:",
        ),
        (
            {"publish": {"repo_id": "o/m", "uri": "x"}},
            "publish.uri: unknown key here; uri belongs under dataset: or under evaluation.dataset:",
        ),
        (
            {"dataset.name": "x"},
            "dataset.name: unknown key here; name belongs at the top level or in each rewards: entry or under "
            "evaluation.metric: or under deploy:",
        ),
        # nothing close: list what is valid
        ({"dataset.zzz": 1}, "dataset.zzz: unknown key; valid keys: uri, prompt_column, split, max_row_bytes"),
    ],
)
def test_unknown_key_names_the_closest_valid_key(patch, problem):
    assert rejected(patch) == [problem]


TRL_OPTION = "unknown key: a TRL option (trl.GRPOConfig's {}): put it under trl:"


@pytest.mark.parametrize(
    "patch, problem",
    [
        # --- TRL's names where the spec has its own: the did-you-mean answers with the spec's key ---
        (
            {f"{HP}.max_completion_length": 9},
            f"{HP}.max_completion_length: unknown key (did you mean 'max_response_length'?)",
        ),
        ({f"{HP}.beta": 0.1}, f"{HP}.beta: unknown key (did you mean 'kl_coef'?)"),
        ({f"{HP}.num_generations": 4}, f"{HP}.num_generations: unknown key (did you mean 'rollouts_per_prompt'?)"),
        # a typo of a TRL name still finds the spec's key
        (
            {f"{HP}.max_completion_lenght": 9},
            f"{HP}.max_completion_lenght: unknown key (did you mean 'max_response_length'?)",
        ),
        # at the top level, the full dotted key
        ({"beta": 0.1}, "beta: unknown key (did you mean 'hyperparameters.kl_coef'?)"),
        # --- a TRL option misplaced: sent to trl: ---
        ({f"{HP}.loss_type": "dr_grpo"}, f"{HP}.loss_type: " + TRL_OPTION.format("loss_type")),
        ({"num_iterations": 2}, "num_iterations: " + TRL_OPTION.format("num_iterations")),
        # --- trl: fields the spec owns, each naming the spec key ---
        ({"trl": {"beta": 0.1}}, "trl.beta: set by the spec; use hyperparameters.kl_coef"),
        (
            {"trl": {"num_generations": 4}},
            "trl.num_generations: set by the spec; use hyperparameters.rollouts_per_prompt",
        ),
        (
            {"trl": {"gradient_accumulation_steps": 2}},
            "trl.gradient_accumulation_steps: set by the spec; use hyperparameters.prompts_per_step",
        ),
        ({"trl": {"save_steps": 5}}, "trl.save_steps: set by the spec; use checkpoint_every"),
        (
            {"trl": {"output_dir": "/tmp"}},
            "trl.output_dir: set by grpoflow (checkpoints go to the job folder's checkpoints/)",
        ),
        # uploads to the Hub from inside training (the worker's token, public by default, before the gate): refused
        *[
            ({"trl": {name: value}}, f"trl.{name}: an upload to the Hugging Face Hub from inside training")
            for name, value in [
                ("push_to_hub", True),
                ("hub_model_id", "someone/leak"),
                ("hub_strategy", "all_checkpoints"),
                ("hub_token", "hf_notreal"),
                ("log_completions_hub_repo", "someone/completions"),
                ("trackio_space_id", "someone/dashboard"),
            ]
        ],
        ({"trl": {"accelerator_config": "/proc/self/environ"}}, "trl.accelerator_config: give the mapping itself"),
        # a grpoflow hyperparameter put under trl:
        (
            {"trl": {"kl_coef": 0.1}},
            "trl.kl_coef: a grpoflow hyperparameter, not a TRL option; use hyperparameters.kl_coef",
        ),
        # --- unknown names: a did-you-mean over TRL's fields ---
        ({"trl": {"loss_typ": "dr_grpo"}}, "trl.loss_typ: not a field of trl.GRPOConfig (TRL "),
        # --- wrong types and choices, named ---
        ({"trl": {"num_iterations": "two"}}, "trl.num_iterations: must be an integer (got 'two')"),
        ({"trl": {"num_iterations": 1.5}}, "trl.num_iterations: must be an integer (got 1.5)"),
        ({"trl": {"epsilon_high": "high"}}, "trl.epsilon_high: must be a number or null (got 'high')"),
        ({"trl": {"mask_truncated_completions": 1}}, "trl.mask_truncated_completions: must be true or false (got 1)"),
        ({"trl": {"lr_scheduler_type": "cosin"}}, "trl.lr_scheduler_type: must be one of 'linear', 'cosine'"),
        ({"trl": {"parallelism_config": {}}}, "trl.parallelism_config: cannot be set from a spec"),
        ({"trl": [1]}, "trl: must be a mapping (got [1])"),
        # --- batch shapes GRPOConfig would reject ---
        (
            {"gpu_count": 4, f"{HP}.rollouts_per_prompt": 6, f"{HP}.prompts_per_step": 3},
            f"{HP}.prompts_per_step: rollouts_per_prompt * prompts_per_step (the completions of one step) must be a "
            "multiple of gpu_count, as each GPU trains an equal share (got 6 * 3 = 18 with gpu_count=4)",
        ),
        (
            {"trl": {"generation_batch_size": 12}},
            "trl.generation_batch_size: must be a multiple of rollouts_per_prompt",
        ),
        (
            {"trl": {"generation_batch_size": 16, "steps_per_generation": 2}},
            "trl.generation_batch_size: not together with trl.steps_per_generation",
        ),
        ({"trl": {"auto_find_batch_size": True}}, "trl.auto_find_batch_size: not supported by TRL's GRPO"),
        ({f"{HP}.prompts_per_step": 0}, f"{HP}.prompts_per_step: must be >= 1 (got 0)"),
    ],
)
def test_trl_names_and_the_trl_block(patch, problem):
    problems = rejected(patch)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


@pytest.mark.parametrize(
    "patch",
    [
        {"trl": {"loss_type": "dr_grpo", "scale_rewards": "none", "num_iterations": 2, "epsilon_high": 0.28}},
        {"trl": {"lr_scheduler_type": "constant", "top_p": 1, "generation_batch_size": 16}},  # an int is a number
        {"gpu_count": 2, f"{HP}.rollouts_per_prompt": 3, f"{HP}.prompts_per_step": 2},  # K = 6 splits over 2 GPUs
        {"trl": None},  # `trl:` with nothing under it
    ],
)
def test_trl_block_accepted_and_resolved(patch):
    spec, _ = load_spec(patched(patch))
    assert resolved_dict(spec)["trl"] == (patch.get("trl") or {})
    assert load_spec(resolved_dict(spec))[0] == spec  # the saved spec.yaml loads again


def test_overrides_parse_values_and_paths(spec_dict):
    overrides = [
        "hyperparameters.max_steps=5",  # int
        "hyperparameters.learning_rate=2e-5",  # YAML 1.1 alone would leave this a string
        "hyperparameters.kl_coef=5e-7",
        "hyperparameters.use_unsloth=true",  # bool
        "rewards.0.weight=2",  # list index
        "rewards[0].kwargs.tol=1e-3",  # bracketed index, new intermediate keys
        "evaluation.metric=exact_answer",
    ]
    data = apply_overrides(spec_dict, overrides)
    assert data[HP] == {"max_steps": 5, "learning_rate": 2e-5, "kl_coef": 5e-7, "use_unsloth": True}
    assert isinstance(data[HP]["learning_rate"], float)
    assert data["rewards"][0] == {"name": "exact_answer", "weight": 2, "kwargs": {"tol": 1e-3}}
    assert spec_dict == BASE  # the input is not modified

    spec, _ = load_spec(spec_dict, overrides)
    assert (spec.hyperparameters.max_steps, spec.hyperparameters.learning_rate) == (5, 2e-5)
    assert spec.checkpoint_every == 1


def test_bad_overrides_are_all_named(spec_dict):
    with pytest.raises(SpecError) as info:
        apply_overrides(spec_dict, ["hyperparameters.max_steps", "rewards.3.weight=1", "name.first=x", "=3"])
    assert info.value.problems == [
        "--set 'hyperparameters.max_steps': expected dotted.path=value, e.g. hyperparameters.max_steps=5",
        "--set 'rewards.3.weight=1': rewards.3: no such list item (the list has 1)",
        "--set 'name.first=x': name is not a mapping or list",
        "--set '=3': expected dotted.path=value, e.g. hyperparameters.max_steps=5",
    ]


def test_override_values_are_validated_like_the_file(spec_dict):
    with pytest.raises(SpecError) as info:
        load_spec(spec_dict, ["hyperparameters.learning_rate=-1e-5", "hyperparameters.lerning_rate=1"])
    assert info.value.problems == [
        f"{HP}.learning_rate: must be > 0 (got -1e-05)",
        f"{HP}.lerning_rate: unknown key (did you mean 'learning_rate'?)",
    ]


def test_yaml_file_reads_short_floats(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: t\nbase_model: builtin:tiny\ndataset: {uri: x.jsonl}\n"
        "rewards:\n  - name: exact_answer\n    kwargs: {tol: 1e-3}\nhyperparameters:\n  learning_rate: 5e-6\n"
    )
    spec, warnings = load_spec(path)
    assert spec.hyperparameters.learning_rate == 5e-6
    assert spec.rewards[0].kwargs == {"tol": 1e-3}  # Any-typed, so only the loader can make it a float
    assert warnings == []


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: t\nbase_model: builtin:tiny\ndataset: {uri: x.jsonl\nrewards: []\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [problem] = info.value.problems
    assert problem.startswith(f"{path}: invalid YAML at line 4")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("- a\n- b\n", "the top level must be a mapping of spec keys (got a list of 2 items)"),
        ("", "the top level must be a mapping of spec keys (got an empty file)"),
        # A token file named as the spec (an event's `spec:`): its value is never repeated into a state message.
        (
            "hf_NotARealTokenButSecret\n",
            "the top level must be a mapping of spec keys (got text of 25 characters, not repeated here)",
        ),
        ("12345\n", "the top level must be a mapping of spec keys (got a single int value, not repeated here)"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path, text, problem):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.problems == [f"{path}: {problem}"]


def test_missing_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    assert info.value.problems == [f"spec file not found: {tmp_path / 'nope.yaml'}"]


def test_a_spec_path_under_home_is_read(tmp_path, monkeypatch, spec_dict):
    # An event's `spec: ~/specs/job.yaml`: the home folder is expanded, as fsspec did before local paths went to Path.
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "job.yaml").write_text(json.dumps(spec_dict))  # JSON is YAML
    assert load_spec("~/job.yaml")[0].name == spec_dict["name"]


@pytest.mark.parametrize("max_steps", [100_000, 1_000_000_000])
def test_a_max_steps_past_any_grpo_run_is_a_warning_saying_what_it_means(spec_dict, max_steps):
    # Not refused: a run capped by budget.max_training_hours may mean it; MAX_INT already refuses an overflow.
    spec, warnings = load_spec(spec_dict, [f"hyperparameters.max_steps={max_steps:g}"])
    assert spec.hyperparameters.max_steps == max_steps
    if max_steps == 100_000:
        assert warnings == []
    else:
        assert warnings == [
            "hyperparameters.max_steps: 1,000,000,000 steps is 8,000,000,000 sampled completions (8 a step), 31.7 "
            "years at one step a second, and TRL's learning-rate schedule (linear decay by default) spreads over all "
            "of them; lower it unless meant, and cap a run by time with budget.max_training_hours"
        ]


def test_num_epochs_warns_only_when_set(spec_dict):
    assert load_spec(spec_dict)[1] == []
    _, warnings = load_spec(spec_dict, ["hyperparameters.num_epochs=3"])
    assert warnings == ["hyperparameters.num_epochs: accepted but unused by GRPO; the run length is max_steps"]


@pytest.mark.parametrize(
    "base_model, family",
    [
        ("builtin:tiny", "qwen2"),
        ("EleutherAI/pythia-70m", "gpt_neox"),
        ("EleutherAI/gpt-neox-20b", "gpt_neox"),
        ("google/gemma-2-2b", "gemma2"),
        ("google/gemma-2b", "gemma"),  # Gemma 1, 2B parameters: Liger is fine
        ("CohereForAI/c4ai-command-r-v01", "cohere"),
        ("CohereForAI/c4ai-command-r7b-12-2024", "cohere2"),
        ("ibm-granite/granite-3.0-2b-instruct", "granite"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2"),
        ("meta-llama/Llama-3.2-1B", "llama"),
        ("someone/mystery-model", None),
    ],
)
def test_model_family_from_name_offline(base_model, family):
    assert model_family(base_model) == family


def test_model_family_reads_local_config(tmp_path):
    # A local folder's config wins over its name, which here suggests nothing.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "GPT_NeoX"}))
    assert model_family(str(tmp_path)) == "gpt_neox"
    problems = rejected({"base_model": str(tmp_path), f"{HP}.use_liger": True})
    assert problems == [
        f"{HP}.use_liger: not supported for gpt_neox models such as {str(tmp_path)!r} "
        "(Liger's kernels give wrong log-probs); set use_liger: false"
    ]


def test_resolved_spec_fills_defaults_and_loads_again(tmp_path):
    spec, _ = load_spec(patched({f"{HP}.lora_rank": 8, f"{HP}.max_steps": 40}))
    resolved = resolved_dict(spec)
    assert (resolved["checkpoint_every"], resolved[HP]["lora_alpha"]) == (4, 8)
    assert json.loads(json.dumps(resolved)) == resolved
    # The job folder's spec.yaml is loaded again by the trainer: it must pass its own rules unchanged.
    path = tmp_path / "spec.yaml"
    path.write_text(to_yaml(spec))
    again, _ = load_spec(path)
    assert resolved_dict(again) == resolved
    assert list(resolved) == list(JobSpec.model_fields)  # the model's order, not sorted


def test_model_validation_alone_enforces_rules_and_resolves():
    # A Prefect flow parameter is validated by pydantic directly, without load_spec.
    with pytest.raises(ValidationError, match="load_in_4bit: requires lora_rank"):
        JobSpec.model_validate(patched({f"{HP}.load_in_4bit": True}))
    spec = JobSpec.model_validate(patched({f"{HP}.lora_rank": 4}))
    assert (spec.checkpoint_every, spec.hyperparameters.lora_alpha, spec.evaluation.metric) == (10, 4, "exact_answer")
    assert load_spec(spec)[0] == spec


def test_json_schema_describes_every_field():
    schema = JobSpec.model_json_schema()
    sections = [schema, *schema["$defs"].values()]
    assert {d["title"] for d in sections} >= {"JobSpec", "Hyperparameters", "Reward entry", "WebhookSpec"}
    for section in sections:
        assert section["additionalProperties"] is False, section["title"]
        for name, prop in section["properties"].items():
            assert prop.get("description"), f"{section['title']}.{name}"
    assert set(schema["required"]) == {"name", "base_model", "dataset", "rewards"}
    assert schema["properties"]["name"]["pattern"] == r"^[a-z0-9][a-z0-9-_.]{0,62}$"
    assert schema["$defs"]["Hyperparameters"]["properties"]["learning_rate"]["default"] == 1e-6


def test_every_model_forbids_extra_keys():
    models = [m for m in vars(spec_models).values() if isinstance(m, type) and issubclass(m, BaseModel)]
    assert len(models) > 8
    for model in models:
        assert model is BaseModel or model.model_config.get("extra") == "forbid", model


def test_hyperparameter_table_is_generated_from_the_model(capsys):
    # The table is no longer pasted into README.md: the docs' spec reference page is generated from the models
    # (docs/gen_reference.py; tests/test_docs.py checks the page).
    runpy.run_module("grpoflow.core.spec", run_name="__main__")
    printed = capsys.readouterr().out.strip()
    assert printed == hyperparameter_table()
    table = printed
    # One row per field, each with the field's own description (the text the Prefect form shows).
    fields = spec_models.Hyperparameters.model_fields
    rows = table.splitlines()[2:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == list(fields)
    assert all(field.description in row for field, row in zip(fields.values(), rows, strict=True))


@pytest.mark.parametrize(
    "override",
    [
        "hyperparameters.max_steps=true",  # lax pydantic would read 1: a one-step run
        "hyperparameters.learning_rate=false",  # 0.0, rejected as <= 0 only by luck
        "hyperparameters.lora_rank=true",  # LoRA rank 1
        "evaluation.holdout=true",  # one prompt held out
        "rewards.0.weight=true",
    ],
)
def test_booleans_are_not_numbers(override):
    with pytest.raises(SpecError) as caught:
        load_spec(BASE, [override])
    field = override.split("=")[0].replace("rewards.0", "rewards[0]")
    assert caught.value.problems == [f"{field}: must be a number, not true or false (got {override.endswith('true')})"]


def test_booleans_stay_booleans():
    spec, _ = load_spec(BASE, ["sft.enabled=true", "hyperparameters.use_liger=false"])
    assert spec.sft.enabled is True and spec.hyperparameters.use_liger is False


# --- generation: and distributed: (the rollout engine and the sharding strategy) -------------------------------------

ENGINE_CASES = [
    pytest.param({"generation.engine": "paged"}, {"generation.engine": "paged"}, id="paged"),
    pytest.param(
        {"generation.engine": "vllm", "generation.vllm_mode": "server", "generation.vllm_server_url": "http://h:8000"},
        {"generation.vllm_mode": "server", "generation.vllm_server_url": "http://h:8000"},
        id="vllm-server-url",
    ),
    pytest.param(
        {
            "generation.engine": "vllm",
            "gpu_count": 4,
            "generation.tensor_parallel_size": 2,
            f"{HP}.rollouts_per_prompt": 8,
        },
        {"generation.tensor_parallel_size": 2, "generation.gpu_memory_utilization": 0.3},
        id="vllm-colocate-tp2",
    ),
    pytest.param(
        {"generation.engine": "sglang"},
        "generation.engine: must be 'transformers', 'paged' or 'vllm' (got 'sglang')",
        id="engine-unknown",
    ),
    pytest.param(
        {"generation.vllm_mode": "server"},
        "generation.vllm_mode: applies only with generation.engine: vllm",
        id="vllm-key-without-vllm",
    ),
    pytest.param(
        {"generation.engine": "vllm", "generation.vllm_server_url": "http://h:8000"},
        "generation.vllm_server_url: only with vllm_mode: server",
        id="url-with-colocate",
    ),
    pytest.param(
        {"generation.engine": "vllm", "generation.vllm_mode": "server", "generation.vllm_server_url": "h:8000"},
        "generation.vllm_server_url: must be an http(s) URL",
        id="url-not-http",
    ),
    pytest.param(
        {"generation.engine": "vllm", "gpu_count": 2, "generation.tensor_parallel_size": 3},
        "generation.tensor_parallel_size: with vllm_mode colocate it must divide gpu_count",
        id="tp-not-dividing-gpus",
    ),
    pytest.param(
        {"generation.engine": "vllm", "generation.gpu_memory_utilization": 1.5},
        "generation.gpu_memory_utilization: must be <= 1",
        id="memory-share-above-1",
    ),
    pytest.param(
        {"generation.engine": "paged", f"{HP}.use_unsloth": True},
        "generation.engine: 'paged' is not supported with use_unsloth",
        id="paged-with-unsloth",
    ),
    pytest.param({"distributed.strategy": "fsdp2", "gpu_count": 2}, {"distributed.strategy": "fsdp2"}, id="fsdp2"),
    pytest.param(
        {"distributed.strategy": "zero1"},
        "distributed.strategy: must be 'ddp', 'fsdp2', 'zero2' or 'zero3' (got 'zero1')",
        id="strategy-unknown",
    ),
    pytest.param(
        {"distributed.strategy": "zero3"},
        "distributed.strategy: zero3 shards training over several",
        id="zero3-one-gpu",
    ),
    pytest.param(
        {"distributed.num_machines": 2, "distributed.shared_volume": "rwx"},
        "output_uri: with distributed.num_machines 2 the job ends on a store the cluster reaches",
        id="machines-local-output",
    ),
    pytest.param(
        {"distributed.num_machines": 2, "output_uri": "s3://bucket/runs"},
        "distributed.shared_volume: 2 machines share the job folder and its checkpoints on a ReadWriteMany volume",
        id="machines-no-shared-volume",
    ),
    pytest.param(
        {"distributed.num_machines": 2, "distributed.shared_volume": "rwx", "output_uri": "s3://bucket/runs"},
        {"distributed.num_machines": 2, "distributed.shared_volume": "rwx"},
        id="machines-on-s3",
    ),
    pytest.param(
        {"distributed.num_machines": 3, "distributed.shared_volume": "rwx", "output_uri": "s3://bucket/runs"},
        "distributed.num_machines: rollouts_per_prompt * prompts_per_step (8) must be a multiple of gpu_count * "
        "num_machines (1 * 3)",
        id="machines-uneven-share",
    ),
    pytest.param({"trl.use_vllm": True}, "trl.use_vllm: set by the spec; use generation.engine", id="trl-use_vllm"),
    pytest.param(
        {"trl.use_transformers_continuous_batching": True},
        "trl.use_transformers_continuous_batching: set by the spec; use generation.engine",
        id="trl-continuous-batching",
    ),
    pytest.param({"trl.fsdp": "full_shard"}, "trl.fsdp: set by the spec; use distributed.strategy", id="trl-fsdp"),
    pytest.param(
        {f"{HP}.use_vllm": True}, f"{HP}.use_vllm: unknown key (did you mean 'generation.engine'?)", id="hp-use_vllm"
    ),
]


@pytest.mark.parametrize("patch, expected", ENGINE_CASES)
def test_generation_and_distributed_rules(patch, expected):
    test_rules(patch, expected)


def test_load_in_4bit_cannot_be_sharded():
    problems = rejected(
        {"distributed.strategy": "zero3", "gpu_count": 2, f"{HP}.lora_rank": 8, f"{HP}.load_in_4bit": True}
    )
    assert (
        "hyperparameters.load_in_4bit: a 4-bit QLoRA base cannot be sharded by zero3; use ddp or drop load_in_4bit"
        in problems
    )


def test_resolved_spec_keeps_vllm_settings_only_for_vllm(tmp_path):
    # The saved spec.yaml loads again (the vLLM keys would break their own rule under another engine).
    for generation in ({"engine": "paged"}, {"engine": "vllm", "vllm_mode": "server"}):
        spec, _ = load_spec(patched({"generation": generation}))
        saved = resolved_dict(spec)
        assert (set(saved["generation"]) == {"engine"}) is (generation["engine"] != "vllm")
        assert load_spec(saved)[0] == spec


@pytest.mark.parametrize("example", sorted(p.name for p in (Path(__file__).parents[2] / "examples").glob("*.yaml")))
def test_example_specs_validate(example):
    spec, _ = load_spec(Path(__file__).parents[2] / "examples" / example)
    if example == "production.yaml":  # a 7B full fine-tune: sharded, vLLM in-process
        assert (spec.gpu_count, spec.distributed.strategy, spec.generation.engine) == (8, "zero3", "vllm")


def test_default_vllm_settings_are_no_request():
    # The Prefect form sends every field of a section with its default: that asks for nothing vLLM-specific.
    from grpoflow.core.spec.models import GenerationSpec

    spec, _ = load_spec(patched({"generation": GenerationSpec().model_dump()}))
    assert spec.generation.engine == "transformers"


def test_qlora_without_bitsandbytes_is_refused_at_validate(spec_dict, monkeypatch):
    # As a missing tracker: said when the spec loads, not 30 s into the training child.
    qlora = ["hyperparameters.lora_rank=8", "hyperparameters.load_in_4bit=true"]
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # importlib.util.find_spec now finds no bitsandbytes
    with pytest.raises(SpecError) as caught:
        load_spec(spec_dict, qlora)
    assert caught.value.problems == [
        "hyperparameters.load_in_4bit: needs the bitsandbytes package, which is not installed: pip install "
        "'grpoflow[qlora]' (got True)"
    ]
    assert load_spec(spec_dict, ["hyperparameters.lora_rank=8"])[0].hyperparameters.load_in_4bit is False


@pytest.mark.parametrize(
    "overrides, warned",
    [
        (["hyperparameters.lora_rank=8"], "1e-06 (the default, sized for a full fine-tune) with LoRA (lora_rank 8)"),
        (["hyperparameters.lora_rank=8", "hyperparameters.learning_rate=5e-6"], "5e-06 with LoRA (lora_rank 8)"),
        (["hyperparameters.lora_rank=8", "hyperparameters.learning_rate=2e-5"], None),  # the README's LoRA rate
        ([], None),  # a full fine-tune at its default
    ],
)
def test_lora_at_a_full_fine_tune_rate_is_a_warning(spec_dict, overrides, warned):
    _, warnings = load_spec(spec_dict, overrides)
    if warned is None:
        assert warnings == []
    else:
        assert warnings == [
            f"hyperparameters.learning_rate: {warned}: LoRA adapters usually need 1e-5 to 2e-4 (~2e-5 is a good "
            "start), else they barely move from zero; set learning_rate"
        ]


def test_validate_says_where_a_key_belongs_and_what_a_metric_entry_means(tmp_path):
    """`grpoflow validate` as a user runs it: `system_prompt:` at the top level is one line saying it belongs under
    hyperparameters (exit 2); the README's `metric: {name: exact_answer}` on a job whose reward is exact_answer is
    that reward (exit 0), where it was refused with two contradictory lines."""
    # tests.conftest.cli, not capsys: a handler left on capsys's closed stream breaks a later test's logging.
    from tests.conftest import cli

    data = Path(__file__).parents[2] / "examples" / "data" / "arithmetic.jsonl"
    head = f"name: t\nbase_model: builtin:tiny\ndataset: {{uri: {data}}}\nrewards: [{{name: exact_answer}}]\n"
    misplaced, metric = tmp_path / "misplaced.yaml", tmp_path / "metric.yaml"
    misplaced.write_text(head + "system_prompt: Answer with a number.\n")
    readme_metric = "evaluation:\n  metric: {name: exact_answer}\n"  # as the README's example wrote it
    metric.write_text(head + "hyperparameters: {max_response_length: 16}\n" + readme_metric)
    code, _, err = cli("validate", misplaced)
    assert code == 2
    assert err.strip().splitlines() == [
        "grpoflow: spec rejected: 1 problem:",
        "  - system_prompt: unknown key here; system_prompt belongs under hyperparameters:",
    ]
    code, out, _ = cli("validate", metric)
    assert code == 0
    assert "  metric: exact_answer\n" in out
