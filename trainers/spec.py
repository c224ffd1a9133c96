"""The job spec: pydantic models of a grpoflow job and its GRPO hyperparameters, and the loader that checks them.

`load_spec` reads a YAML file (or a dict, e.g. a Prefect flow parameter), applies `--set dotted.path=value` overrides
and returns the validated `JobSpec` plus warnings. A rejected spec raises `SpecError`, which lists every violation at
once as "dotted.location: message" lines. `resolved_dict` / `to_yaml` give the spec with every default filled, as
written to the job folder's `spec.yaml`.
"""

import copy
import difflib
import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

import fsspec
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

SLUG_PATTERN = r"^[a-z0-9][a-z0-9-_.]{0,62}$"
# Spelled without \w so that the UI's JavaScript check and Python's agree (ASCII only).
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The Hub's rules for each half of owner/name: 1-96 of [A-Za-z0-9_.-], no "--" or "..", no "-" or "." at either end.
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID_PATTERN = rf"^(?!.*(?:--|\.\.)){_HUB_PART}/{_HUB_PART}$"
# Families whose Liger kernels give wrong log-probs; model_type values from transformers' configs.
LIGER_UNSUPPORTED = ("gpt_neox", "gemma2", "cohere", "granite")
# Caps that turn a YAML alias bomb, a runaway nesting or a huge value into one clear error, instead of a hang, a
# RecursionError or a job that fails after the model has loaded. No real spec comes near them.
MAX_SPEC_BYTES = 1 << 20  # the spec file; and the spec's text with its YAML aliases expanded
MAX_SPEC_VALUES = 100_000  # scalars, lists and mappings, with YAML aliases expanded
MAX_SPEC_DEPTH = 32  # nesting levels
MAX_INT = 2**31 - 1  # every integer field (steps, lengths, counts) fits an int32 wherever it ends up
MAX_SEED = 2**32 - 1  # numpy's range, which transformers.set_seed enforces only once training starts


class SpecError(ValueError):
    """A rejected spec: `problems` holds every violation, each "dotted.location: message"."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"spec rejected: {len(self.problems)} problem(s):\n{lines}")


class _Section(BaseModel):
    # inf and NaN are YAML floats (.inf, .nan) that no field means; rejecting them here covers every float field.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _matching(pattern: str, hint: str) -> Any:
    """A string type checked against `pattern`, failing with `hint`; the pattern also goes into the JSON schema."""

    def check(value: str) -> str:
        # fullmatch: with re.match, "$" would also accept a trailing newline.
        if not re.fullmatch(pattern, value):
            raise ValueError(hint)
        return value

    return Annotated[str, AfterValidator(check), Field(json_schema_extra={"pattern": pattern})]


# Integer fields: the bound turns a typo like 1e30 into an error at submit time rather than an overflow later.
Int = Annotated[int, Field(le=MAX_INT)]
Slug = _matching(
    SLUG_PATTERN, "must be 1-63 lowercase letters, digits, '-', '_' or '.', starting with one of the first two"
)
FunctionRef = _matching(FUNCTION_PATTERN, "must be 'package.module:callable' (a dotted module path, a colon, a name)")
EnvName = _matching(ENV_NAME_PATTERN, "must be an environment variable name (letters, digits, '_'; no leading digit)")
RepoId = _matching(
    REPO_ID_PATTERN,
    "must be 'owner/name', each 1-96 letters, digits, '-', '_' or '.', without '--' or '..', "
    "not starting or ending with '-' or '.'",
)


class Hyperparameters(_Section):
    """The GRPO hyperparameters (DESIGN.md): names, defaults and rules are the contract."""

    learning_rate: float = Field(1e-6, gt=0, description="Optimizer learning rate.")
    num_epochs: Int = Field(1, ge=1, description="Accepted but unused by GRPO: the run length is max_steps.")
    max_steps: Int = Field(
        100, ge=1, description="Training steps; one step is one prompt and its rollouts_per_prompt completions."
    )
    rollouts_per_prompt: Int = Field(8, ge=2, description="Completions sampled per prompt (the GRPO group size).")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty weight; 0 means no KL term and no reference model.")
    max_prompt_length: Int = Field(1024, ge=1, description="Prompt truncation length; only with use_unsloth.")
    max_response_length: Int = Field(2048, ge=1, description="Completions are truncated to this many tokens.")
    global_batch_size: Int | None = Field(
        None, description="Not supported by GRPO: each step's batch is one prompt's rollouts_per_prompt completions."
    )
    seed: int = Field(
        42,
        ge=0,
        le=MAX_SEED,
        description="Random seed, 0 to 2**32 - 1: the same seed, data and machine give the same metrics.",
    )
    system_prompt: str | None = Field(
        None, description="When set, each string prompt becomes a system + user chat via the chat template."
    )
    lora_rank: Int | None = Field(None, ge=1, description="LoRA rank; null means a full fine-tune.")
    lora_alpha: Int | None = Field(None, ge=1, description="LoRA alpha; defaults to lora_rank.")
    load_in_4bit: bool = Field(False, description="QLoRA: NF4 base plus LoRA adapters; needs lora_rank, one GPU.")
    use_unsloth: bool = Field(False, description="Train with Unsloth (opt-in, single GPU only).")
    use_liger: bool = Field(False, description="Liger kernels (opt-in; not multi-GPU, Unsloth, NeoX, Gemma 2, ...).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for the rollouts.")
    skip_zero_variance_groups: bool = Field(
        False,
        description=(
            "Skip the forward/backward pass and optimizer step of steps whose completions all got the same reward "
            "(all advantages 0: no gradient when kl_coef = 0; no effect otherwise). Parameters and Adam state stay "
            "unchanged on a skipped step, where plain TRL still moves them by momentum; the LR schedule advances."
        ),
    )

    @field_validator("global_batch_size", mode="before")
    @classmethod
    def _no_global_batch_size(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "not supported by GRPO: each step's batch is one prompt's rollouts_per_prompt completions"
            )


class DatasetSpec(_Section):
    """Where the prompts come from."""

    uri: str = Field(min_length=1, description="Local path, file://, s3://..., or hf://datasets/<repo>[/<split>].")
    prompt_column: str = Field("prompt", description="Column holding a string prompt or a list of chat messages.")
    split: str | None = Field(None, description="Dataset split, for hf:// URIs.")
    max_row_bytes: Int = Field(
        1_000_000,
        ge=1,
        description="Longest line a JSON Lines or CSV file may have, in bytes; a longer one rejects the dataset "
        "(found by streaming the file, before any of it is parsed).",
    )


class RewardSpec(_Section):
    """One reward; the spec's rewards are summed with their weights."""

    name: str = Field(min_length=1, description="A built-in reward's name, or a label when function is set.")
    function: FunctionRef | None = Field(None, description="A custom reward, as 'package.module:callable'.")
    weight: float = Field(1.0, description="Weight of this reward in the sum.")
    kwargs: dict[str, Any] = Field({}, description="Arguments for parameterised rewards.")


class SFTSpec(_Section):
    """The optional supervised format warm-up before GRPO."""

    enabled: bool = Field(False, description="Run the SFT warm-up.")
    completion_column: str = Field("completion", description="Column holding the target completions.")
    max_steps: Int = Field(200, ge=1, description="SFT training steps.")
    learning_rate: float = Field(
        2e-5, gt=0, description="SFT learning rate (TRL's default; a tiny model from scratch wants far more, ~3e-3)."
    )
    batch_size: Int = Field(8, ge=1, description="SFT per-device batch size.")


class EvaluationSpec(_Section):
    """The held-out before/after evaluation."""

    holdout: float = Field(
        0.1, ge=0, description="Prompts held out of training: a fraction in (0, 1), a count if >= 1; 0 disables."
    )
    metric: str | None = Field(None, description="The reward (by name) to score with; default: the first reward.")
    max_new_tokens: Int | None = Field(None, ge=1, description="Generation length; default: max_response_length.")

    @field_validator("holdout")
    @classmethod
    def _whole_count(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("must be a fraction below 1 or a whole number of prompts")
        return value


class PublishSpec(_Section):
    """Publishing the trained model to the Hugging Face Hub."""

    repo_id: RepoId = Field(description="Hub repository, 'owner/name'.")
    artifact: Literal["merged", "adapter"] = Field("merged", description="Push the merged weights or the adapter.")
    private: bool = Field(True, description="Create the repository as private.")


class DeploySpec(_Section):
    """Registering a serving deployment from the merged weights."""

    name: Slug = Field(description="Deployment name (a slug).")


class WebhookSpec(_Section):
    """A webhook receiving the job's events (Standard Webhooks)."""

    url: str = Field(description="http(s) URL receiving the events.")
    secret_env: EnvName | None = Field(
        None, description="Name of the environment variable holding the signing secret (never the secret itself)."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL")
        return value


class JobSpec(_Section):
    """A grpoflow job: dataset, base model and rewards in, a GRPO-fine-tuned model out."""

    name: Slug = Field(description="Job name (a slug); becomes part of the job id.")
    base_model: str = Field(min_length=1, description="HF repo id, local path, or builtin:tiny (offline, shipped).")
    dataset: DatasetSpec = Field(description="The prompt dataset.")
    rewards: list[RewardSpec] = Field(min_length=1, description="Rewards, summed with their weights.")
    sft: SFTSpec = Field(SFTSpec(), description="Optional SFT format warm-up before GRPO.")
    evaluation: EvaluationSpec = Field(EvaluationSpec(), description="Held-out before/after evaluation.")
    hyperparameters: Hyperparameters = Field(Hyperparameters(), description="GRPO hyperparameters.")
    gpu_count: Int = Field(1, ge=1, description="GPUs for training; more than one runs under accelerate launch.")
    checkpoint_every: Int | None = Field(
        None, ge=1, description="Steps between checkpoints; default: max_steps // 10."
    )
    output_uri: str = Field(
        "runs", min_length=1, description="Local folder or s3://bucket/prefix; the job folder goes under it."
    )
    stop_on_alert: bool = Field(False, description="Stop training on a health alert.")
    publish: PublishSpec | None = Field(None, description="Optional: push the model to the Hugging Face Hub.")
    deploy: DeploySpec | None = Field(None, description="Optional: register a serving deployment.")
    webhooks: list[WebhookSpec] = Field([], description="Optional webhooks receiving the job's events.")

    @field_validator("output_uri")
    @classmethod
    def _writable_scheme(cls, value: str) -> str:
        # Remote roots go through fsspec (tasks/storage.py): a scheme it cannot open would only fail after training.
        if m := re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", value):
            try:
                fsspec.get_filesystem_class(m.group(1).lower())
            except (ValueError, ImportError) as exc:
                raise ValueError(
                    f"cannot write to {m.group(1)}:// ({exc}); give a local folder or e.g. s3://bucket/prefix"
                ) from None
        return value

    @field_validator("sft", "evaluation", "hyperparameters", "webhooks", mode="before")
    @classmethod
    def _empty_section(cls, value: Any, info: ValidationInfo) -> Any:
        # A YAML key with nothing under it (`sft:`) is null; read it as "all defaults".
        return ([] if info.field_name == "webhooks" else {}) if value is None else value

    @model_validator(mode="after")
    def _rules_then_defaults(self) -> "JobSpec":
        problems = rule_problems(self.model_dump(exclude_unset=True))
        if problems:
            raise PydanticCustomError(
                "spec_rules", "{summary}", {"summary": "; ".join(problems), "problems": problems}
            )
        # Resolve the defaults that depend on other fields, so consumers and the saved spec see concrete values.
        hp = self.hyperparameters
        if hp.lora_rank is not None and hp.lora_alpha is None:
            hp.lora_alpha = hp.lora_rank
        if self.checkpoint_every is None:
            self.checkpoint_every = max(1, hp.max_steps // 10)
        if self.evaluation.metric is None:
            self.evaluation.metric = self.rewards[0].name
        if self.evaluation.max_new_tokens is None:
            self.evaluation.max_new_tokens = hp.max_response_length
        return self


# --- cross-field rules --------------------------------------------------------------------------------------------


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


@functools.cache
def _adapter(kind: type) -> TypeAdapter:
    return TypeAdapter(kind)


def _lax(section: dict, key: str, kind: type, default: Any) -> Any:
    """`section[key]` coerced as pydantic would; the default when absent or invalid (its field error says why)."""
    try:
        return _adapter(kind).validate_python(section.get(key, default))
    except ValidationError:
        return default


def _builtin_rewards() -> list[str] | None:
    try:
        from trainers.rewards import REWARDS
    except ImportError:
        return None
    return list(REWARDS)


def rule_problems(data: dict) -> list[str]:
    """The cross-field violations in a spec dict, even one whose fields are invalid.

    It reads the raw dict leniently (an invalid value counts as its default), so a spec gets its field errors and
    its rule violations in one report. A key present in `data` counts as explicitly set.

    Args:
        data (`dict`): the spec as a (possibly invalid) mapping.

    Returns:
        `list[str]`: "dotted.location: message" lines; empty when the rules hold.
    """
    hp = data.get("hyperparameters") if isinstance(data.get("hyperparameters"), dict) else {}
    gpus = _lax(data, "gpu_count", int, 1)
    has_rank = hp.get("lora_rank") is not None
    unsloth, liger = _lax(hp, "use_unsloth", bool, False), _lax(hp, "use_liger", bool, False)
    problems = []
    if _lax(hp, "load_in_4bit", bool, False):
        if not has_rank:
            problems.append("hyperparameters.load_in_4bit: requires lora_rank (QLoRA trains LoRA adapters)")
        if gpus > 1:
            problems.append(f"hyperparameters.load_in_4bit: QLoRA runs on a single GPU only (got gpu_count={gpus})")
    if hp.get("lora_alpha") is not None and not has_rank:
        problems.append("hyperparameters.lora_alpha: requires lora_rank (alpha scales LoRA adapters)")
    if unsloth and gpus > 1:
        problems.append(f"hyperparameters.use_unsloth: single GPU only (got gpu_count={gpus})")
    if "max_prompt_length" in hp and not unsloth:
        problems.append(
            "hyperparameters.max_prompt_length: only used with use_unsloth: true (TRL's GRPO does not truncate "
            "prompts); remove it or set use_unsloth: true"
        )
    rollouts = _lax(hp, "rollouts_per_prompt", int, 8)
    if gpus > 1 and rollouts % gpus:
        problems.append(
            f"hyperparameters.rollouts_per_prompt: must be a multiple of gpu_count, as each GPU generates an equal "
            f"share of a group (got {rollouts} with gpu_count={gpus})"
        )
    if liger:
        problems += _liger_problems(data.get("base_model"), gpus, unsloth)
    return problems + _reward_problems(data)


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


def _reward_problems(data: dict) -> list[str]:
    rewards = data.get("rewards") if isinstance(data.get("rewards"), list) else []
    builtins, names, problems = _builtin_rewards(), [], []
    for i, reward in enumerate(rewards):
        name = reward.get("name") if isinstance(reward, dict) else None
        if not isinstance(name, str):
            continue
        if name in names:
            problems.append(f"rewards[{i}].name: duplicate reward name {name!r}; each reward needs its own name")
        names.append(name)
        if reward.get("function") is None and builtins is not None and name not in builtins:
            problems.append(
                f"rewards[{i}].name: unknown built-in reward {name!r}; choose one of: {', '.join(builtins)} "
                "(or set function: package.module:callable)"
            )
    evaluation = data.get("evaluation") if isinstance(data.get("evaluation"), dict) else {}
    metric = evaluation.get("metric")
    if isinstance(metric, str) and names and metric not in names:
        problems.append(
            f"evaluation.metric: {metric!r} is not one of this spec's rewards: {', '.join(dict.fromkeys(names))}"
        )
    return problems


# --- pydantic errors as "dotted.location: message" ------------------------------------------------------------------

_MESSAGES = {
    "missing": "required",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "int_parsing_size": f"must be an integer <= {MAX_INT}",
    "less_than_equal": "must be <= {le}",
    "finite_number": "must be a finite number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "too_short": "must have at least {min_length} item(s)",
    "literal_error": "must be {expected}",
    "value_error": "{error}",
}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _dotted(loc: Iterable) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "spec"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class whose fields live at `loc` (list indices skipped), for suggesting key names."""
    model = JobSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _inner_model(field.annotation) if field else None
        if model is None:
            return None
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and not get_args(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_inner_model, get_args(annotation)) if m is not None), None)


def _unknown_key(loc: tuple) -> str:
    model = _model_at(loc[:-1])
    valid = list(model.model_fields) if model else []
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key; valid keys: {', '.join(valid)}" if valid else "unknown key"


def _describe(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return _unknown_key(error["loc"])
    template = _MESSAGES.get(kind)
    # Bounds on float fields arrive as floats: say "> 0", not "> 0.0".
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in error.get("ctx", {}).items()}
    text = template.format(**ctx) if template else error["msg"][:1].lower() + error["msg"][1:]
    return text if kind == "missing" else f"{text} (got {_show(error['input'])})"


def _problems(exc: ValidationError, data: dict) -> list[str]:
    problems, rules_ran = [], False
    for error in exc.errors():
        if error["type"] == "spec_rules":
            problems += error["ctx"]["problems"]
            rules_ran = True
        else:
            problems.append(f"{_dotted(error['loc'])}: {_describe(error)}")
    # The model's own rule pass only runs when every field is valid; otherwise check the raw dict.
    if not rules_ran:
        problems += rule_problems(data)
    return list(dict.fromkeys(problems))


# --- loading ----------------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """Safe YAML, plus: `1e-5` is a float, a key appears once per mapping, and nesting is capped.

    YAML 1.1 reads `1e-5` as a string (it wants `1.0e-5`); learning rates are written the short way. PyYAML keeps the
    last of two equal keys without a word, which hides a typo. Its composer recurses once per level, so a deeply
    nested file would end in a RecursionError; the cap stops it first, with the line.
    """

    _depth = 0

    def compose_node(self, parent, index):
        if self._depth >= MAX_SPEC_DEPTH:
            problem = f"nested more than {MAX_SPEC_DEPTH} levels deep"
            raise yaml.composer.ComposerError(None, None, problem, self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        first = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            if (key.tag, key.value) in first:
                line = first[key.tag, key.value].line + 1
                problem = f"found duplicate key {key.value!r} (first on line {line}); keep one"
                raise yaml.composer.ComposerError(None, None, problem, key.start_mark)
            first[key.tag, key.value] = key.start_mark
        return node


class _Dumper(yaml.SafeDumper):
    """Writes what `_Loader` reads back the same: a string such as "1e5" is quoted, or it would come back a float."""


for _yaml in (_Loader, _Dumper):
    _yaml.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789.")
    )


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # With allow_unicode, PyYAML writes these line breaks raw inside single quotes, where reading folds them to spaces;
    # double quotes escape them.
    style = '"' if any(c in value for c in "\x85\u2028\u2029") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """Apply `dotted.path=value` overrides (the CLI's `--set`) to a spec dict.

    Values are parsed as YAML (`5` is an int, `2e-5` a float, `true` a bool); paths may index lists
    (`rewards.0.weight=2` or `rewards[0].weight=2`). Missing intermediate mappings are created.

    Args:
        data (`dict`): the spec as a mapping; not modified.
        overrides (`Iterable[str]`): the overrides, applied in order.

    Returns:
        `dict`: a copy of `data` with the overrides applied.

    Raises:
        `SpecError`: listing every malformed override.
    """
    data, problems = copy.deepcopy(data), []
    for override in overrides:
        path, sep, raw = override.partition("=")
        keys = re.sub(r"\[(\d+)\]", r".\1", path.strip()).split(".")
        if not sep or not all(keys):
            problems.append(f"--set {override!r}: expected dotted.path=value, e.g. hyperparameters.max_steps=5")
            continue
        try:
            value = yaml.load(raw, Loader=_Loader)
        except yaml.YAMLError:  # not YAML (e.g. an unbalanced quote): the text as given
            value = raw
        try:
            _set_path(data, keys, value)
        except (KeyError, IndexError, TypeError) as exc:
            problems.append(f"--set {override!r}: {exc.args[0]}")
    if problems:
        raise SpecError(problems)
    return data


def _set_path(node: Any, keys: list[str], value: Any) -> None:
    for depth, key in enumerate(keys):
        where = ".".join(keys[: depth + 1])
        last = depth == len(keys) - 1
        if isinstance(node, list):
            # isdecimal and ASCII: "²".isdigit() is true, yet int("²") fails.
            if not (key.isascii() and key.isdecimal()) or int(key) >= len(node):
                raise IndexError(f"{where}: no such list item (the list has {len(node)})")
            key = int(key)
        elif not isinstance(node, dict):
            raise TypeError(f"{'.'.join(keys[:depth])} is not a mapping or list")
        elif not last and node.get(key) is None:
            node[key] = {}
        if last:
            node[key] = value
        else:
            node = node[key]


def _read(source: "str | Path | dict | JobSpec", storage_options: dict | None = None) -> dict:
    if isinstance(source, JobSpec):
        return source.model_dump(exclude_unset=True)
    if isinstance(source, dict):
        return source
    # A URL (s3://bucket/spec.yaml) is read through fsspec; Path() would fold its "//".
    path = source if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", str(source)) else Path(source)
    if isinstance(path, Path) and path.exists() and not (path.is_file() or path.is_dir()):
        # Opening a named pipe would wait for a writer forever, and /dev/zero never ends.
        raise SpecError(f"{path}: not a regular file (a pipe, socket or device); give the path of a YAML file")
    try:
        with fsspec.open(str(path), "rb", **(storage_options or {})) as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"spec file not found: {path}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec file ({exc.strerror or exc})") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"{path}: the spec file is larger than {MAX_SPEC_BYTES:,} bytes (1 MiB); a job spec is a few KB"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); save it as UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: invalid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the top level must be a mapping of spec keys (got {_show(data)})")
    return data


class _Shapeless(Exception):
    """A spec no consumer could handle: cyclic, nested too deeply, or too large with its aliases expanded."""


def _check_shape(data: dict) -> dict:
    """Rejects what would hang or crash the validator, the job folder's spec.yaml or a Prefect parameter.

    YAML aliases share one object, so a "billion laughs" file loads small, then expands in every consumer that walks
    it; a self-referencing alias never ends. The walk below counts each shared object once (memoized), so it is
    linear in the file even when the expansion is astronomically large.
    """
    memo, sizes = {}, {}
    try:
        for key, value in data.items():
            values, chars = _measure(value, (key,), memo, set())
            sizes[key] = (values + 1, chars + len(str(key)))
    except _Shapeless as exc:
        raise SpecError(str(exc)) from None
    values, chars = (sum(column) for column in zip(*sizes.values(), strict=True)) if sizes else (0, 0)
    if values > MAX_SPEC_VALUES or chars > MAX_SPEC_BYTES:
        biggest = max(sizes, key=lambda key: sizes[key])
        raise SpecError(
            f"{biggest}: too large: with YAML aliases expanded, the spec holds {values:,} values and {chars:,} "
            f"characters (the limits are {MAX_SPEC_VALUES:,} and {MAX_SPEC_BYTES:,})"
        )
    return data


def _measure(node: Any, loc: tuple, memo: dict, active: set) -> tuple[int, int]:
    """(values, characters) under `node` with shared objects counted each time they appear."""
    if isinstance(node, str | bytes):
        if len(node) > MAX_SPEC_BYTES:
            raise _Shapeless(f"{_dotted(loc)}: {len(node):,} characters; a spec holds at most {MAX_SPEC_BYTES:,}")
        return 1, len(node)
    if not isinstance(node, dict | list | tuple | set | frozenset):
        return 1, 0
    if id(node) in memo:
        return memo[id(node)]
    if id(node) in active:
        raise _Shapeless(f"{_dotted(loc)}: refers to itself (a recursive YAML alias); write the value out")
    if len(loc) >= MAX_SPEC_DEPTH:
        raise _Shapeless(f"{_dotted(loc)}: nested more than {MAX_SPEC_DEPTH} levels deep")
    active.add(id(node))
    values, chars = 1, 0
    for key, child in node.items() if isinstance(node, dict) else enumerate(node):
        child_values, child_chars = _measure(child, (*loc, key), memo, active)
        values += child_values + isinstance(node, dict)
        chars += child_chars + (len(key) if isinstance(key, str) else 0)
    active.discard(id(node))
    memo[id(node)] = (values, chars)
    return values, chars


def load_spec(
    source: "str | Path | dict | JobSpec", overrides: Iterable[str] = (), storage_options: dict | None = None
) -> tuple[JobSpec, list[str]]:
    """Load, override and validate a job spec, reporting every violation at once.

    Args:
        source (`str`, `Path`, `dict` or `JobSpec`): a YAML spec file (a local path or a URL fsspec opens, e.g.
            `s3://bucket/spec.yaml`), or the spec itself (e.g. a flow parameter).
        overrides (`Iterable[str]`, *optional*, defaults to `()`): `dotted.path=value` overrides, see
            `apply_overrides`.
        storage_options (`dict`, *optional*): fsspec options for a spec file given as a URL.

    Returns:
        `tuple[JobSpec, list[str]]`: the validated spec (dependent defaults resolved) and warnings for the user.

    Raises:
        `SpecError`: the spec is rejected; `.problems` lists every violation as "dotted.location: message".
    """
    data = _check_shape(_read(source, storage_options))
    data = _check_shape(apply_overrides(data, overrides))
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_problems(exc, data)) from None
    warnings = []
    if "num_epochs" in spec.hyperparameters.model_fields_set:
        warnings.append("hyperparameters.num_epochs: accepted but unused by GRPO; the run length is max_steps")
    return spec, warnings


def resolved_dict(spec: JobSpec) -> dict:
    """The spec with every default filled, JSON-compatible (what the job folder's `spec.yaml` holds).

    Args:
        spec (`JobSpec`): a validated spec.

    Returns:
        `dict`: the resolved spec; `max_prompt_length` appears only with `use_unsloth`, since writing it otherwise
        would make the saved spec break its own rule when loaded again.
    """
    data = spec.model_dump(mode="json")
    if not spec.hyperparameters.use_unsloth:
        del data["hyperparameters"]["max_prompt_length"]
    return data


def to_yaml(spec: JobSpec) -> str:
    """The resolved spec (`resolved_dict`) as YAML, keys in the models' order."""
    return yaml.dump(resolved_dict(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True)
