"""Loading a job spec: the hardened YAML reader, `--set` overrides, shape caps, pydantic's errors in the spec's words.

`load_spec` reads a YAML file (or a dict, e.g. a Prefect flow parameter), applies `--set dotted.path=value` overrides
and returns the validated `JobSpec` plus warnings. A rejected spec raises `SpecError`, which lists every violation at
once as "dotted.location: message" lines. `resolved_dict` / `to_yaml` give the spec with every default filled, as
written to the job folder's `spec.yaml`.
"""

import copy
import difflib
import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_args, get_origin

import fsspec
import yaml
from pydantic import BaseModel, ValidationError

from grpoflow.core.spec.fields import MAX_INT
from grpoflow.core.spec.hyperparameters import Hyperparameters
from grpoflow.core.spec.models import METRIC_ENTRY, METRIC_NAME, JobSpec
from grpoflow.core.spec.rules import rule_problems, shown, trl_spec_keys
from grpoflow.core.spec.trl_fields import trl_fields
from grpoflow.core.uris import outside_stores, unopenable, url_scheme

# Caps that turn a YAML alias bomb, a runaway nesting or a huge value into one clear error, instead of a hang, a
# RecursionError or a job that fails after the model has loaded. No real spec comes near them.
MAX_SPEC_BYTES = 1 << 20  # the spec file; and the spec's text with its YAML aliases expanded
MAX_SPEC_VALUES = 100_000  # scalars, lists and mappings, with YAML aliases expanded
MAX_SPEC_DEPTH = 32  # nesting levels


class SpecError(ValueError):
    """A rejected spec: `problems` holds every violation, each "dotted.location: message"."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        super().__init__(f"spec rejected: {count}:\n{lines}")


# --- pydantic errors as "dotted.location: message" ------------------------------------------------------------------

_MESSAGES = {
    "missing": "required",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "int_parsing_size": f"must be an integer <= {MAX_INT}",
    "less_than": "must be < {lt}",
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


# Where GRPO options live: at these levels a TRL name is answered with the spec key that sets it, or sent to trl:.
_GRPO_LEVELS = ("spec", "hyperparameters")


def _aliases(section: str) -> dict[str, str]:
    """TRL's names for the spec's keys, as suggested at `section`: the key itself when it lives there, else its
    dotted path (at the top level and in hyperparameters only)."""
    aliases = {}
    for name, key in trl_spec_keys(Hyperparameters).items():
        parent, _, leaf = key.rpartition(".")
        if (parent or "spec") == section:
            aliases[name] = leaf
        elif section in _GRPO_LEVELS:
            aliases[name] = key
    return aliases


@functools.cache
def _key_homes(model: type[BaseModel] = JobSpec, section: str = "spec") -> dict[str, list[str]]:
    """Every key of the spec, with the sections it is valid in ("spec" the top level, "rewards[]" a list's items)."""
    homes: dict[str, list[str]] = {}
    for name, field in model.model_fields.items():
        homes.setdefault(name, []).append(section)
        if (inner := _inner_model(field.annotation)) is not None:
            path = name if section == "spec" else f"{section}.{name}"
            listed = get_origin(field.annotation) is list  # rewards, webhooks: the keys of each item
            for key, sections in _key_homes(inner, path + "[]" * listed).items():
                homes.setdefault(key, []).extend(sections)
    return homes


def _where_in(section: str) -> str:
    """Where a key of `section` goes, in words: `under hyperparameters:`, `in each rewards: entry`, `at the top
    level`."""
    if section == "spec":
        return "at the top level"
    if section.endswith("[]"):
        return f"in each {section[:-2]}: entry"
    return f"under {section}:"


def _elsewhere(loc: tuple, name: str) -> str | None:
    """The hint "`name` belongs under `hyperparameters:`" when `name` is a key of another level of the spec."""
    here = _dotted(part if not isinstance(part, int) else "[]" for part in loc).replace(".[]", "[]")
    homes = [section for section in _key_homes().get(name, []) if section != here]
    if not homes:
        return None
    return f"unknown key here; {name} belongs {' or '.join(map(_where_in, homes))}"


def _unknown_key(loc: tuple) -> str:
    model = _model_at(loc[:-1])
    valid = list(model.model_fields) if model else []
    section, name = _dotted(loc[:-1]), str(loc[-1])
    aliases = {k: v for k, v in _aliases(section).items() if k not in valid}
    if elsewhere := _elsewhere(loc[:-1], name):
        return elsewhere
    if name not in aliases and section in _GRPO_LEVELS and name in trl_fields()["fields"]:
        return f"unknown key: a TRL option (trl.GRPOConfig's {name}): put it under trl:"
    close = difflib.get_close_matches(name, valid + list(aliases), n=1)
    if close:
        return f"unknown key (did you mean {aliases.get(close[0], close[0])!r}?)"
    return f"unknown key; valid keys: {', '.join(valid)}" if valid else "unknown key"


def _describe(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return _unknown_key(error["loc"])
    template = _MESSAGES.get(kind)
    # Bounds on float fields arrive as floats: say "> 0", not "> 0.0".
    ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in error.get("ctx", {}).items()}
    text = template.format(**ctx) if template else error["msg"][:1].lower() + error["msg"][1:]
    # A URL with credentials is not echoed back: the terminal and CI logs would show the secret.
    return text if kind in ("missing", "url_credentials") else f"{text} (got {shown(error['input'])})"


def _problems(exc: ValidationError, data: dict) -> list[str]:
    problems, rules_ran = [], False
    for error in exc.errors():
        if error["type"] == "spec_rules":
            problems += error["ctx"]["problems"]
            rules_ran = True
        else:
            # A tagged union's tag (evaluation.metric's) is no key of the spec.
            error["loc"] = tuple(part for part in error["loc"] if part not in (METRIC_NAME, METRIC_ENTRY))
            problems.append(f"{_dotted(error['loc'])}: {_describe(error)}")
    # The model's own rule pass only runs when every field is valid; otherwise check the raw dict.
    if not rules_ran:
        problems += rule_problems(data, JobSpec)
    return list(dict.fromkeys(problems))


# --- reading YAML ---------------------------------------------------------------------------------------------------


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


def _read(source: "str | Path | dict | JobSpec", storage_options: dict | None = None) -> dict:
    if isinstance(source, JobSpec):
        return source.model_dump(exclude_unset=True)
    if isinstance(source, dict):
        return source
    # A URL (s3://bucket/spec.yaml) is read through fsspec; Path() would fold its "//".
    path = source if url_scheme(source) else Path(source).expanduser()
    if (refused := outside_stores(source)) or (refused := unopenable(source)):
        raise SpecError(f"{source}: {refused}")
    if isinstance(path, Path) and path.exists() and not (path.is_file() or path.is_dir()):
        # Opening a named pipe would wait for a writer forever, and /dev/zero never ends.
        raise SpecError(f"{path}: not a regular file (a pipe, socket or device); give the path of a YAML file")
    try:
        with fsspec.open(path, "rb", **(storage_options or {})) if isinstance(path, str) else path.open("rb") as f:
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
    except ValueError as exc:  # PyYAML's own, unwrapped: a "\U" escape past U+10FFFF, a date like 2026-13-45
        raise SpecError(f"{path}: invalid YAML: a value YAML cannot build ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the top level must be a mapping of spec keys (got {_top_level(data)})")
    return data


def _top_level(data: Any) -> str:
    """What a file that is no spec holds, never its value: a one-line file an event's `spec:` names (a token file,
    `~/.cache/huggingface/token`) would otherwise be repeated into the run's state message and logs."""
    if data is None:
        return "an empty file"
    if isinstance(data, list):
        return f"a list of {len(data)} item{'s' * (len(data) != 1)}"
    if isinstance(data, str):
        return f"text of {len(data)} characters, not repeated here"
    return f"a single {type(data).__name__} value, not repeated here"


# --- --set overrides ------------------------------------------------------------------------------------------------


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
        except (yaml.YAMLError, ValueError):  # not YAML (an unbalanced quote, a bad escape): the text as given
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


# --- shape caps -----------------------------------------------------------------------------------------------------


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


# --- the entry points -----------------------------------------------------------------------------------------------


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
    if (warning := lora_rate_warning(spec.hyperparameters)) is not None:
        warnings.append(warning)
    if (warning := max_steps_warning(spec.hyperparameters)) is not None:
        warnings.append(warning)
    return spec, warnings


# GRPO runs take hundreds to a few thousand steps; far more is most likely a typo (1e9 for 1e3).
MANY_STEPS = 100_000


def max_steps_warning(hp) -> str | None:
    """The warning for a max_steps beyond `MANY_STEPS`, saying what the number means. A warning, not a refusal: a
    long run capped by budget.max_training_hours is legitimate, and MAX_INT already refuses what would overflow."""
    if hp.max_steps <= MANY_STEPS:
        return None
    per_step = hp.rollouts_per_prompt * hp.prompts_per_step
    days = hp.max_steps / 86_400
    span = f"{days:,.1f} days" if days < 365 else f"{days / 365.25:,.1f} years"
    return (
        f"hyperparameters.max_steps: {hp.max_steps:,} steps is {hp.max_steps * per_step:,} sampled completions "
        f"({per_step} a step), {span} at one step a second, and TRL's learning-rate schedule (linear "
        "decay by default) spreads over all of them; lower it unless meant, and cap a run by time with "
        "budget.max_training_hours"
    )


# Below this, LoRA adapters barely move in a GRPO run's few hundred steps; the default (1e-6) is a full fine-tune's.
LORA_MIN_LEARNING_RATE = 1e-5


def lora_rate_warning(hp) -> str | None:
    """The warning for a LoRA job left at a full fine-tune's learning rate (the default 1e-6, or anything below
    `LORA_MIN_LEARNING_RATE`): it trains, but the adapters (which start at zero) hardly change."""
    if hp.lora_rank is None or hp.learning_rate >= LORA_MIN_LEARNING_RATE:
        return None
    default = " (the default, sized for a full fine-tune)" if "learning_rate" not in hp.model_fields_set else ""
    return (
        f"hyperparameters.learning_rate: {hp.learning_rate:g}{default} with LoRA (lora_rank {hp.lora_rank}): LoRA "
        "adapters usually need 1e-5 to 2e-4 (~2e-5 is a good start), else they barely move from zero; set "
        "learning_rate"
    )


def resolved_dict(spec: JobSpec) -> dict:
    """The spec with every default filled, JSON-compatible (what the job folder's `spec.yaml` holds).

    Args:
        spec (`JobSpec`): a validated spec.

    Returns:
        `dict`: the resolved spec; `max_prompt_length` appears only with `use_unsloth`, and the vLLM settings of
        `generation` only with engine vllm, since writing them otherwise would make the saved spec break its own
        rules when loaded again.
    """
    data = spec.model_dump(mode="json")
    if not spec.hyperparameters.use_unsloth:
        del data["hyperparameters"]["max_prompt_length"]
    if spec.generation.engine != "vllm":
        data["generation"] = {"engine": spec.generation.engine}
    return data


def to_yaml(spec: JobSpec) -> str:
    """The resolved spec (`resolved_dict`) as YAML, keys in the models' order."""
    return yaml.dump(resolved_dict(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True)
