"""The job spec's cross-field rules: what no single field can check (QLoRA needs lora_rank, Liger's unsupported model
families, reward names...).

`rule_problems` reads a raw spec dict leniently, so a spec whose fields are invalid still gets its rule violations in
the same report as its field errors. Every default it needs is read from the models' fields, never restated.
"""

import difflib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from grpoflow.core.catalog import BUILTIN_REWARDS
from grpoflow.core.graders import grader_problems
from grpoflow.core.judge import judge_kwargs_problems
from grpoflow.core.spec.trl_fields import trl_fields
from grpoflow.core.uris import is_remote, url_credentials

# Families whose Liger kernels give wrong log-probs; model_type values from transformers' configs.
LIGER_UNSUPPORTED = ("gpt_neox", "gemma2", "cohere", "granite")

_FAMILY_GUESSES = (
    (r"pythia|gpt[-_]?neo[-_]?x", "gpt_neox"),
    (r"gemma[-_]?2(?!\d*b)", "gemma2"),  # "gemma-2b" is Gemma 1
    (r"gemma[-_]?3", "gemma3"),
    (r"gemma", "gemma"),
    (r"command[-_]?r7b|command[-_]?a(?![a-z])", "cohere2"),
    (r"cohere|command[-_]?r|c4ai|aya", "cohere"),
    (r"granite", "granite"),
    (r"qwen[-_]?3", "qwen3"),
    (r"qwen[-_]?2", "qwen2"),
    (r"llama", "llama"),
    (r"mistral", "mistral"),
)


@dataclass(frozen=True)
class TRL:
    """The trl.GRPOConfig fields a hyperparameter sets: a marker on its type (`Annotated[float, TRL("beta")]`), read
    by trainers/grpo.py (the values it passes) and by the `trl:` block's check (the keys it refuses).

    Args:
        names (`str`): the GRPOConfig fields; none for a hyperparameter only grpoflow reads (`GRPOFLOW_ONLY`: PEFT's
            settings, the model loader's, Unsloth's, grpoflow's own trainer's).
        copied (`bool`, *optional*, defaults to `True`): the value goes over as it is; False: grpo.py derives it.
        also (`tuple[str, ...]`, *optional*): TRL fields this hyperparameter makes meaningless, refused in `trl:` too.
    """

    names: tuple[str, ...]
    copied: bool = True
    also: tuple[str, ...] = ()

    def __init__(self, *names: str, copied: bool = True, also: tuple[str, ...] = ()):
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "copied", copied)
        object.__setattr__(self, "also", also)


GRPOFLOW_ONLY = TRL()


def trl_markers(model: type[BaseModel]) -> dict[str, TRL | None]:
    """Each field of `model` with its `TRL` marker, None where it has none (a test requires one on every
    hyperparameter)."""
    return {name: next((m for m in f.metadata if isinstance(m, TRL)), None) for name, f in model.model_fields.items()}


@functools.cache
def trl_spec_keys(hyperparameters: type[BaseModel]) -> dict[str, str]:
    """The trl.GRPOConfig fields the spec sets, each with the spec key that sets it: the hyperparameters' (the
    `Hyperparameters` model) from their `TRL` markers, the other sections' from `SECTION_TRL_KEYS`. A `trl:` block may
    set none of them."""
    keys = {}
    for field, marker in trl_markers(hyperparameters).items():
        for name in (*marker.names, *marker.also) if marker else ():
            keys[name] = f"hyperparameters.{field}"
    return {**keys, **SECTION_TRL_KEYS}


# The trl.GRPOConfig fields that the spec's sections other than hyperparameters set (trainers/grpo.py's grpo_config),
# each with the spec key that sets it.
SECTION_TRL_KEYS = {
    "reward_weights": "rewards[].weight",
    "save_steps": "checkpoint_every",
    "save_strategy": "checkpoint_every",
    "report_to": "tracking.report_to",
    "project": "tracking.project",
    "run_name": "tracking.run_name",
    "log_completions": "tracking.log_completions",
    "num_completions_to_print": "tracking.num_completions_to_print",
    "use_vllm": "generation.engine",
    "use_transformers_continuous_batching": "generation.engine",
    "use_transformers_paged": "generation.engine",
    "vllm_mode": "generation.vllm_mode",
    "vllm_server_base_url": "generation.vllm_server_url",
    "vllm_server_host": "generation.vllm_server_url",
    "vllm_server_port": "generation.vllm_server_url",
    "vllm_gpu_memory_utilization": "generation.gpu_memory_utilization",
    "vllm_tensor_parallel_size": "generation.tensor_parallel_size",
    "eval_strategy": "evaluation.every",
    "eval_steps": "evaluation.every",
    "eval_on_start": "evaluation.every (the score before training is step 0 of evaluation.json's series)",
    "load_best_model_at_end": "evaluation.select",
    "metric_for_best_model": "evaluation.metric",
    "greater_is_better": "evaluation.select",
    "fsdp": "distributed.strategy",
    "fsdp_config": "distributed.strategy",
    "deepspeed": "distributed.strategy",
}
# The trl.GRPOConfig fields the machine or the job folder decides, and why: a `trl:` block may set none of them.
TRL_SET_BY_GRPOFLOW = {
    "output_dir": "checkpoints go to the job folder's checkpoints/",
    "logging_steps": "metrics.jsonl has one line per step",
    "bf16": "bf16 follows the machine",
    "use_cpu": "follows the machine and gpu_count",
    "model_init_kwargs": "the dtype follows the machine",
}
# The trl.GRPOConfig fields that upload to the Hugging Face Hub from inside training with the worker's token, public
# by default: before the promotion gate and a person's approval, from any spec a deployment runs. What to use instead.
_PUBLISH = "grpoflow publishes the kept model through publish: (publish.repo_id), after the gate and any approval"
_TRACKIO = "tracking.report_to: [trackio] logs locally; a Space is the pool's setting (TRACKIO_SPACE_ID)"
TRL_UPLOADS = {
    "push_to_hub": _PUBLISH,
    "hub_model_id": _PUBLISH,
    "hub_strategy": _PUBLISH,
    "hub_private_repo": _PUBLISH,
    "hub_always_push": _PUBLISH,
    "hub_revision": _PUBLISH,
    "hub_token": "a token in a spec is stored in spec.yaml, Prefect's database and events; " + _PUBLISH,
    "log_completions_hub_repo": "every step's prompts and completions are in rollouts/ (grpoflow rollouts JOB)",
    "trackio_space_id": _TRACKIO,
    "trackio_bucket_id": _TRACKIO,
    "trackio_static_space_id": _TRACKIO,
}
_TYPE_NAMES = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "list": "a list",
    "dict": "a mapping",
    "None": "null",
}


def model_family(base_model: str) -> str | None:
    """The model's family (transformers' `model_type`), found offline.

    A local folder with `config.json` gives its `model_type`; otherwise the family is guessed from the name.

    Args:
        base_model (`str`): an HF repo id, a local path, or `builtin:tiny`.

    Returns:
        `str | None`: e.g. "gpt_neox", "gemma2", "cohere", "granite", "qwen2"; None when unknown.
    """
    if base_model == "builtin:tiny":
        return "qwen2"
    config = Path(base_model).expanduser() / "config.json"
    if config.is_file():
        try:
            family = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            family = None
        return family.lower() if isinstance(family, str) else None
    name = base_model.lower()
    for pattern, family in _FAMILY_GUESSES:
        if re.search(pattern, name):
            return family
    return None


@functools.cache
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def _lax(section: dict, model: type[BaseModel], key: str) -> Any:
    """`section[key]` coerced to `model`'s field type as pydantic would; the field's default when absent or invalid
    (its field error says why). The field's bounds are not applied: a rule sees the value the user gave."""
    field = model.model_fields[key]
    try:
        return _adapter(field.annotation).validate_python(section.get(key, field.default))
    except ValidationError:
        return field.default


def rule_problems(data: dict, spec_model: type[BaseModel]) -> list[str]:
    """The cross-field violations in a spec dict, even one whose fields are invalid.

    It reads the raw dict leniently (an invalid value counts as its default), so a spec gets its field errors and
    its rule violations in one report. A key present in `data` counts as explicitly set.

    Args:
        data (`dict`): the spec as a (possibly invalid) mapping.
        spec_model (`type[BaseModel]`): `JobSpec`, whose fields give every default (passed in, so that the models
            can run these rules without the two modules importing each other).

    Returns:
        `list[str]`: "dotted.location: message" lines; empty when the rules hold.
    """
    Hyperparameters = spec_model.model_fields["hyperparameters"].annotation  # noqa: N806 (a model class)
    hp = data.get("hyperparameters") if isinstance(data.get("hyperparameters"), dict) else {}
    gpus = _lax(data, spec_model, "gpu_count")
    has_rank = hp.get("lora_rank") is not None
    unsloth, liger = _lax(hp, Hyperparameters, "use_unsloth"), _lax(hp, Hyperparameters, "use_liger")
    problems = []
    if _lax(hp, Hyperparameters, "load_in_4bit"):
        if not has_rank:
            problems.append("hyperparameters.load_in_4bit: requires lora_rank (QLoRA trains LoRA adapters)")
        if gpus > 1:
            problems.append(f"hyperparameters.load_in_4bit: QLoRA runs on a single GPU only (got gpu_count={gpus})")
    if hp.get("lora_alpha") is not None and not has_rank:
        problems.append("hyperparameters.lora_alpha: requires lora_rank (alpha scales LoRA adapters)")
    if hp.get("lora_target_modules") is not None and not has_rank:
        problems.append("hyperparameters.lora_target_modules: requires lora_rank (it picks where LoRA adapters go)")
    if unsloth and gpus > 1:
        problems.append(f"hyperparameters.use_unsloth: single GPU only (got gpu_count={gpus})")
    if "max_prompt_length" in hp and not unsloth:
        problems.append(
            "hyperparameters.max_prompt_length: only used with use_unsloth: true (TRL's GRPO does not truncate "
            "prompts); remove it or set use_unsloth: true"
        )
    rollouts, prompts = _lax(hp, Hyperparameters, "rollouts_per_prompt"), _lax(hp, Hyperparameters, "prompts_per_step")
    if liger:
        problems += _liger_problems(data.get("base_model"), gpus, unsloth)
    trl = data.get("trl") if isinstance(data.get("trl"), dict) else {}
    problems += _batch_problems(trl, rollouts, prompts, gpus)
    problems += _engine_problems(data, spec_model, gpus, unsloth, hp)
    problems += _agent_problems(data, unsloth, trl)
    problems += _evaluation_problems(data, spec_model, _lax(hp, Hyperparameters, "max_steps"))
    return problems + _reward_problems(data) + _trl_problems(trl, Hyperparameters)


def _section(data: dict, key: str) -> dict:
    return data.get(key) if isinstance(data.get(key), dict) else {}


def _engine_problems(data: dict, spec_model: type[BaseModel], gpus: int, unsloth: bool, hp: dict) -> list[str]:
    """The `generation:` and `distributed:` blocks against each other and the rest of the spec."""
    Generation = spec_model.model_fields["generation"].annotation  # noqa: N806 (model classes)
    Distributed = spec_model.model_fields["distributed"].annotation  # noqa: N806
    generation, distributed, problems = _section(data, "generation"), _section(data, "distributed"), []
    engine = _lax(generation, Generation, "engine")
    if engine != "vllm":
        for key in ("vllm_mode", "vllm_server_url", "gpu_memory_utilization", "tensor_parallel_size"):
            # A default value is no request (the Prefect form sends every field with its default).
            if key in generation and generation[key] != Generation.model_fields[key].default:
                problems.append(f"generation.{key}: applies only with generation.engine: vllm (got engine {engine!r})")
    elif _lax(generation, Generation, "vllm_mode") == "colocate":
        tensor_parallel = _lax(generation, Generation, "tensor_parallel_size")
        if "vllm_server_url" in generation and generation["vllm_server_url"] is not None:
            problems.append("generation.vllm_server_url: only with vllm_mode: server (colocate runs vLLM in-process)")
        if _is_int(tensor_parallel) and tensor_parallel > 0 and gpus % tensor_parallel:
            problems.append(
                f"generation.tensor_parallel_size: with vllm_mode colocate it must divide gpu_count, as each group of "
                f"tensor_parallel_size training GPUs holds one vLLM engine (got {tensor_parallel} with "
                f"gpu_count={gpus})"
            )
    if engine != "transformers" and unsloth:
        problems.append(f"generation.engine: {engine!r} is not supported with use_unsloth (Unsloth generates itself)")
    strategy, machines = _lax(distributed, Distributed, "strategy"), _lax(distributed, Distributed, "num_machines")
    if strategy != "ddp":
        if gpus * (machines if _is_int(machines) and machines > 1 else 1) < 2:
            problems.append(
                f"distributed.strategy: {strategy} shards training over several processes: it needs gpu_count > 1 "
                f"(got gpu_count={gpus}); use ddp (the default) on one GPU"
            )
        if _lax(hp, spec_model.model_fields["hyperparameters"].annotation, "load_in_4bit"):
            problems.append(
                f"hyperparameters.load_in_4bit: a 4-bit QLoRA base cannot be sharded by {strategy}; use ddp or "
                "drop load_in_4bit"
            )
    if _is_int(machines) and machines > 1:
        problems += _machine_problems(data, spec_model, machines, gpus, engine, unsloth, hp)
    return problems


def _machine_problems(
    data: dict, spec_model: type[BaseModel], machines: int, gpus: int, engine: str, unsloth: bool, hp: dict
) -> list[str]:
    """`distributed.num_machines` > 1 (a Kubeflow Trainer TrainJob, cluster/multinode.py) against the rest of the
    spec."""
    problems = []
    output_uri = _lax(data, spec_model, "output_uri")
    if not is_remote(output_uri):
        problems.append(
            f"output_uri: with distributed.num_machines {machines} the job ends on a store the cluster reaches: set "
            f"output_uri to s3://bucket/prefix (got the local {output_uri!r})"
        )
    if not _section(data, "distributed").get("shared_volume"):
        problems.append(
            f"distributed.shared_volume: {machines} machines share the job folder and its checkpoints on a "
            "ReadWriteMany volume: give its PersistentVolumeClaim's name (mounted in the flow run's pod too)"
        )
    Hyperparameters = spec_model.model_fields["hyperparameters"].annotation  # noqa: N806 (a model class)
    single = [f for f in ("load_in_4bit", "use_liger") if _lax(hp, Hyperparameters, f)] + ["use_unsloth"] * unsloth
    for flag in single:
        problems.append(f"hyperparameters.{flag}: not supported with distributed.num_machines > 1 (got {machines})")
    if engine == "vllm":
        problems.append(
            f"generation.engine: vllm is not supported with distributed.num_machines > 1 yet (got {machines}); use "
            "transformers or paged"
        )
    completions = _lax(hp, Hyperparameters, "rollouts_per_prompt") * _lax(hp, Hyperparameters, "prompts_per_step")
    if _is_int(gpus) and gpus >= 1 and completions % (gpus * machines):
        problems.append(
            f"distributed.num_machines: rollouts_per_prompt * prompts_per_step ({completions}) must be "
            f"a multiple of gpu_count * num_machines ({gpus} * {machines}), as each process trains an equal share"
        )
    return problems


def _agent_problems(data: dict, unsloth: bool, trl: dict) -> list[str]:
    """`tools:` and `environment:` (TRL's multi-turn rollouts) against the rest of the spec; what they import and
    do is checked by preflight (trainers/agents.py)."""
    tools = data.get("tools") if isinstance(data.get("tools"), list) else []
    agent, problems = bool(tools) or data.get("environment") is not None, []
    for i, ref in enumerate(tools):
        if isinstance(ref, str) and ref in tools[:i]:
            problems.append(f"tools[{i}]: {ref!r} is listed twice (the model sees one tool per name)")
    if agent and unsloth:
        problems.append(
            "hyperparameters.use_unsloth: not supported with tools or environment (Unsloth generates itself, "
            "without TRL's tool-calling loop)"
        )
    if not agent and trl.get("max_tool_calling_iterations") is not None:
        problems.append(
            "trl.max_tool_calling_iterations: applies only with tools or environment; set one or remove it"
        )
    return problems


def _batch_problems(trl: dict, rollouts: int, prompts: int, gpus: int) -> list[str]:
    """The batch shapes GRPOConfig would reject: one optimizer step trains on K = rollouts_per_prompt *
    prompts_per_step completions, K // gpu_count per process, and generates them in batches of a multiple of K."""
    completions, problems = rollouts * prompts, []
    if gpus > 1 and completions % gpus:
        if prompts == 1:
            problems.append(
                f"hyperparameters.rollouts_per_prompt: must be a multiple of gpu_count, as each GPU generates an "
                f"equal share of a group (got {rollouts} with gpu_count={gpus})"
            )
        else:
            problems.append(
                f"hyperparameters.prompts_per_step: rollouts_per_prompt * prompts_per_step (the completions of one "
                f"step) must be a multiple of gpu_count, as each GPU trains an equal share (got {rollouts} * "
                f"{prompts} = {completions} with gpu_count={gpus})"
            )
    generation, steps = trl.get("generation_batch_size"), trl.get("steps_per_generation")
    if generation is not None and steps is not None:
        problems.append("trl.generation_batch_size: not together with trl.steps_per_generation; set one of them")
    elif _is_int(generation) and generation % completions:
        problems.append(
            f"trl.generation_batch_size: must be a multiple of rollouts_per_prompt * prompts_per_step (the "
            f"{completions} completions of one step; got {generation})"
        )
    if trl.get("auto_find_batch_size") is True:
        problems.append(
            "trl.auto_find_batch_size: not supported by TRL's GRPO (shrinking the batch breaks the groups)"
        )
    return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _trl_problems(trl: dict, hyperparameters: type[BaseModel]) -> list[str]:
    """Each `trl:` entry checked against the frozen record of trl.GRPOConfig's fields (trl_fields.json)."""
    record, problems, spec_keys = trl_fields(), [], trl_spec_keys(hyperparameters)
    fields = record["fields"]
    for name, value in trl.items():
        where = f"trl.{name}"
        if name in spec_keys:
            problems.append(f"{where}: set by the spec; use {spec_keys[name]}")
        elif name in TRL_SET_BY_GRPOFLOW:
            problems.append(f"{where}: set by grpoflow ({TRL_SET_BY_GRPOFLOW[name]})")
        elif name == "accelerator_config" and not isinstance(value, dict):
            problems.append(f"{where}: give the mapping itself; a path would have training read a file of the worker")
        elif name in TRL_UPLOADS:
            problems.append(
                f"{where}: an upload to the Hugging Face Hub from inside training, with the worker's token, before "
                f"the promotion gate and approval: refused; {TRL_UPLOADS[name]}"
            )
        elif name in hyperparameters.model_fields:
            problems.append(f"{where}: a grpoflow hyperparameter, not a TRL option; use hyperparameters.{name}")
        elif name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see trl.GRPOConfig's fields"
            problems.append(f"{where}: not a field of trl.GRPOConfig (TRL {record['trl_version']}); {hint}")
        elif problem := _trl_type_problem(value, fields[name]):
            problems.append(f"{where}: {problem} (got {shown(value)})")
    return problems


def _trl_type_problem(value: Any, field: dict) -> str | None:
    kinds, choices = field["types"], field["choices"]
    kind = "None" if value is None else "float" if isinstance(value, float) else type(value).__name__
    if kind == "int" and "int" not in kinds and "float" in kinds:
        kind = "float"  # an integer is a number
    if kind not in kinds:
        if "object" in kinds and len(kinds) <= 2:
            return "cannot be set from a spec (it takes a Python object)"
        return "must be " + " or ".join(_TYPE_NAMES[k] for k in kinds if k in _TYPE_NAMES)
    if kind == "str" and choices and value not in choices:
        return "must be one of " + ", ".join(map(repr, choices))
    return None


def shown(value: Any) -> str:
    """`value` as a message quotes it: its repr, cut to 60 characters; a value holding a URL with credentials is not
    quoted at all (messages reach terminals, CI logs and Prefect's)."""
    if _holds_credentials(value):
        return "a value holding credentials, not shown"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _holds_credentials(value: Any) -> bool:
    if isinstance(value, dict):
        return any(map(_holds_credentials, [*value.keys(), *value.values()]))
    if isinstance(value, list | tuple):
        return any(map(_holds_credentials, value))
    return isinstance(value, str) and url_credentials(value) is not None


def _liger_problems(base_model: Any, gpus: int, unsloth: bool) -> list[str]:
    problems = []
    if gpus > 1:
        problems.append(f"hyperparameters.use_liger: not supported with gpu_count > 1 (got gpu_count={gpus})")
    if unsloth:
        problems.append("hyperparameters.use_liger: not supported together with use_unsloth")
    family = model_family(base_model) if isinstance(base_model, str) else None
    if family and family.startswith(LIGER_UNSUPPORTED):
        problems.append(
            f"hyperparameters.use_liger: not supported for {family} models such as {base_model!r} "
            "(Liger's kernels give wrong log-probs); set use_liger: false"
        )
    return problems


def function_name(function: str) -> str:
    """The callable's name in a 'package.module:callable' reference: what TRL names a reward's metric after."""
    return function.rpartition(":")[2]


def model_name(model: str) -> str:
    """A reward model's default name: the last part of its path or Hub id, as TRL names its metric.

    >>> model_name("OpenAssistant/reward-model-deberta-v3-large-v2"), model_name("runs/rm/")
    ('reward-model-deberta-v3-large-v2', 'rm')
    """
    return model.rstrip("/").rpartition("/")[2] or model


def _reward_name(reward: Any) -> Any:
    """The reward's name as the model resolves it: given, or the function's name, or the reward model's."""
    if not isinstance(reward, dict):
        return None
    name, function, model = reward.get("name"), reward.get("function"), reward.get("model")
    grader = reward.get("grader")
    if name is None and isinstance(grader, dict) and isinstance(grader.get("name"), str):
        return grader["name"]
    if name is None and isinstance(function, str):
        return function_name(function)
    if name is None and isinstance(model, str) and model:
        return model_name(model)
    return name


def _judge_problems(where: str, kwargs: Any) -> list[str]:
    """An llm_judge entry's kwargs problems that need no network and no environment (trainers/rewards/judge.py)."""
    if not isinstance(kwargs, dict):
        return []  # the field error says so
    return [f"{where}.kwargs.{key}: {message}" for key, message in judge_kwargs_problems(kwargs)]


def _entry_problems(where: str, reward: dict, builtins: list[str] | None) -> list[str]:
    """One entry in the rewards' form (a job reward, or `evaluation.metric` given as an entry) against the rules that
    tie its keys together; `where` is its location (`rewards[2]`, `evaluation.metric`)."""
    if reward.get("grader") is not None:
        return _grader_entry_problems(where, reward)
    name = _reward_name(reward)
    if name is None and reward.get("function") is None and not reward.get("model"):
        choices = f"a built-in: {', '.join(builtins)}" if builtins else "a built-in reward"
        return [f"{where}: give name ({choices}) or function: package.module:callable"]
    if reward.get("model") is not None:
        problems = []
        if reward.get("function") is not None:
            problems.append(f"{where}: give function or model, not both (a reward is one or the other)")
        if reward.get("kwargs"):
            problems.append(f"{where}.kwargs: a reward model takes no kwargs; remove them")
        return problems
    if reward.get("function") is None and isinstance(name, str) and builtins is not None and name not in builtins:
        return [
            f"{where}.name: unknown built-in reward {name!r}; choose one of: {', '.join(builtins)} "
            "(or set function: package.module:callable)"
        ]
    if reward.get("function") is None and name == "llm_judge":
        return _judge_problems(where, reward.get("kwargs", {}))
    return []


def _grader_entry_problems(where: str, reward: dict) -> list[str]:
    """A `grader:` entry: the object checked with the openai package's types (core/graders.py), its name
    the reward's, nothing else beside it but weight and kwargs."""
    problems = [
        f"{where}.{key}: a grader entry is the grader object alone (with weight and kwargs); remove {key}"
        for key in ("function", "model")
        if reward.get(key) is not None
    ]
    grader, name = reward["grader"], reward.get("name")
    if name is not None and isinstance(grader, dict) and name != grader.get("name"):
        problems.append(
            f"{where}.name: a grader's reward is named by grader.name ({grader.get('name')!r}); remove name"
        )
    return problems + [f"{where}.{path}: {message}" for path, message in grader_problems(grader, reward.get("kwargs"))]


def _reward_problems(data: dict) -> list[str]:
    rewards = data.get("rewards") if isinstance(data.get("rewards"), list) else []
    builtins, names, problems = list(BUILTIN_REWARDS), [], []
    for i, reward in enumerate(rewards):
        if not isinstance(reward, dict):
            continue
        problems += _entry_problems(f"rewards[{i}]", reward, builtins)
        name = _reward_name(reward)
        if not isinstance(name, str):
            continue
        if name in names:
            problems.append(f"rewards[{i}].name: duplicate reward name {name!r}; each reward needs its own name")
        names.append(name)
    weights = [r.get("weight", 1.0) if isinstance(r, dict) else 1.0 for r in rewards]
    if weights and all(isinstance(w, int | float) and not isinstance(w, bool) and w == 0 for w in weights):
        problems.append(
            "rewards: every weight is 0, so every completion's reward is 0 and GRPO has nothing to learn from; give "
            "at least one reward a non-zero weight"
        )
    metric, environment = _section(data, "evaluation").get("metric"), data.get("environment")
    environment = function_name(environment) if isinstance(environment, str) else None
    if environment is not None and metric == environment:
        return problems  # the environment's get_reward(), named as training logs it (rewards/<name>/mean)
    return problems + _metric_problems(metric, names, builtins, environment)


def _bare_name(entry: Any) -> Any:
    """The name of a reward entry that gives nothing else (`{name: exact_answer}`, or the Prefect form's entry with
    every other field at its default); None for any other entry."""
    if not isinstance(entry, dict):
        return None
    rest = {k: v for k, v in entry.items() if k != "name" and v not in (None, {}) and not (k == "weight" and v == 1.0)}
    return None if rest else entry.get("name")


def metric_by_name(data: Any) -> Any:
    """`data` with `evaluation.metric: {name: X}` read as `metric: X` when X is a reward of the job: an entry that
    only names a job reward means that reward (the README once showed it so), not a second copy of it."""
    evaluation = data.get("evaluation") if isinstance(data, dict) else None
    metric = evaluation.get("metric") if isinstance(evaluation, dict) else None
    rewards = data.get("rewards") if isinstance(data, dict) and isinstance(data.get("rewards"), list) else []
    name = _bare_name(metric)
    if not isinstance(name, str) or name not in map(_reward_name, rewards):
        return data
    return {**data, "evaluation": {**evaluation, "metric": name}}


def _metric_problems(
    metric: Any, names: list[str], builtins: list[str] | None, environment: str | None = None
) -> list[str]:
    """`evaluation.metric`: a job reward's name (or the `environment`'s), or an entry of its own whose name no reward
    of the job has."""
    if isinstance(metric, str) and names and metric not in names:
        scored_by = f"or the environment, {environment}, " if environment else ""
        return [
            f"evaluation.metric: {metric!r} is not one of this spec's rewards: {', '.join(dict.fromkeys(names))} "
            f"({scored_by}or give the metric as a reward entry of its own: {{name: ...}} or {{function: ...}})"
        ]
    if not isinstance(metric, dict) or _bare_name(metric) in names:
        return []  # a job reward's name alone is that reward (`metric_by_name`)
    name = _reward_name(metric)
    if isinstance(name, str) and name in names:
        # One line, and no other about this entry: its name alone says what it was meant to be.
        return [
            f"evaluation.metric.name: {name!r} is already a reward of this job; write metric: {name} to score with "
            "that reward, or give this held-out metric a name of its own"
        ]
    problems = _entry_problems("evaluation.metric", metric, builtins)
    if metric.get("weight", 1.0) != 1.0:  # the saved spec writes the default out
        problems.append("evaluation.metric.weight: a held-out metric is not added to the rewards; remove weight")
    return problems


def _evaluation_problems(data: dict, spec_model: type[BaseModel], max_steps: Any) -> list[str]:
    """`evaluation.holdout` against `evaluation.dataset`; `evaluation.every` and `evaluation.select` against the
    held-out prompts, max_steps and checkpoint_every."""
    Evaluation = spec_model.model_fields["evaluation"].annotation  # noqa: N806 (a model class)
    evaluation = _section(data, "evaluation")
    every, select = _lax(evaluation, Evaluation, "every"), _lax(evaluation, Evaluation, "select")
    if not _is_int(every):
        return []
    suggestion = max(1, max_steps // 10) if _is_int(max_steps) else 10
    holdout, validation = _lax(evaluation, Evaluation, "holdout"), evaluation.get("dataset") is not None
    problems = []
    if validation and "holdout" in evaluation and holdout != 0:
        problems.append(
            "evaluation.holdout: evaluation.dataset is scored instead of prompts held out of the training set; "
            "remove holdout to score the validation set, or remove evaluation.dataset to hold prompts out"
        )
    if every > 0 and holdout == 0 and not validation:
        problems.append(
            "evaluation.every: scores the held-out prompts: set evaluation.holdout above 0 (or give "
            "evaluation.dataset), or every to 0"
        )
    if every > 0 and _is_int(max_steps) and every > max_steps:
        problems.append(
            f"evaluation.every: {every} is more than max_steps ({max_steps}), so no held-out score would be taken "
            f"during training; set it to at most max_steps (e.g. {suggestion})"
        )
    if select == "best" and every <= 0:
        problems.append(
            "evaluation.select: best picks among the held-out scores taken during training: set evaluation.every "
            f"(e.g. {suggestion}) or select: last"
        )
    checkpoint_every = data.get("checkpoint_every")
    if select == "best" and every > 0 and checkpoint_every is not None and checkpoint_every != every:
        problems.append(
            f"checkpoint_every: with evaluation.select: best a checkpoint is saved at each held-out evaluation; leave "
            f"checkpoint_every unset or set it to evaluation.every ({every})"
        )
    return problems
