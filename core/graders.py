"""A grader entry checked before anything is scored: its object against the `openai` package's own grader types, then
what grpoflow needs on top (templates it can fill in, a formula it can evaluate, an endpoint for model graders).

`grader_problems` returns every problem as (path, message), the path under the rewards entry (`grader.operation`,
`grader.graders.fuzzy.input`, `kwargs.base_url`), so `grpoflow validate` reports each with its field, exit 2.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from grpoflow.core.catalog import CODE_GRADERS, GRADER_TYPES, GRADERS, MODEL_GRADERS
from grpoflow.core.formula import FormulaError, parse_formula
from grpoflow.core.judge import KWARG_CHECKS, endpoint_problems
from grpoflow.core.templates import path_problem, template_paths

# Graders of OpenAI's Evals API carry a pass_threshold (a score at or above it passes); a reward has no use for it,
# so a grader copied from an eval keeps it, unread.
EVAL_THRESHOLD = tuple(kind for kind, grader in GRADERS.items() if grader.pass_threshold)
MAX_SOURCE_BYTES = 256 * 1024  # OpenAI's limit on a python grader's source
_ENDPOINT_KWARGS = ("base_url", "api_key_env", "concurrency", "timeout", "retries", "backoff")
# grader type -> the kwargs it takes (model graders and cosine: the endpoint; python: its process's limits)
KWARGS = {
    **dict.fromkeys(MODEL_GRADERS, (*_ENDPOINT_KWARGS, "model")),
    "cosine": (*_ENDPOINT_KWARGS, "embedding_model"),
    **dict.fromkeys(CODE_GRADERS, ("timeout", "memory_mb")),
}
_EXTRA_CHECKS = {
    "embedding_model": ((str,), lambda v: bool(v.strip()), "the embedding model the endpoint serves"),
    "memory_mb": (
        (int,),
        lambda v: 64 <= v <= _memory_cap(),
        "an integer of MiB from 64 to the operator's GRPOFLOW_SANDBOX_MEMORY_MB",
    ),
}


def _memory_cap() -> int:
    """The operator's cap on a sandbox's memory (`GRPOFLOW_SANDBOX_MEMORY_MB`): a spec may only lower it."""
    try:
        return operator_limits().memory_mb
    except SandboxSettingError:
        return 0  # the setting itself is named where the grader runs


def openai_types() -> dict[str, type[BaseModel]]:
    """The `openai` package's model of each grader type."""
    from openai.types import graders

    return {kind: getattr(graders, grader.openai) for kind, grader in GRADERS.items()}


def grader_problems(grader: Any, kwargs: Any = None) -> list[tuple[str, str]]:
    """Every problem of a rewards entry's `grader` and `kwargs`, as (path, message); empty when it can be scored.

    >>> grader_problems({"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
    ...                  "reference": "{{ item.answer }}", "operation": "equals"})
    [('grader.operation', "Input should be 'eq', 'ne', 'like' or 'ilike'")]
    """
    problems = _object_problems(grader, "grader", nested=False)
    if not isinstance(grader, dict) or not isinstance(kwargs, dict | None):
        return problems
    return problems + _kwargs_problems(grader, kwargs or {})


def _object_problems(grader: Any, where: str, nested: bool) -> list[tuple[str, str]]:
    if not isinstance(grader, dict):
        return [
            (where, f"must be an OpenAI grader object (a mapping with type and name), got {type(grader).__name__}")
        ]
    kind = grader.get("type")
    if kind not in GRADER_TYPES or (nested and kind == "multi"):
        kinds = [k for k in GRADER_TYPES if not (nested and k == "multi")]
        return [(f"{where}.type", f"{_show(kind)} is not a grader type; choose one of: {', '.join(kinds)}")]
    if kind == "multi":
        return _multi_problems(grader, where)
    templates = [(f"{where}.{field}", message) for field, message in _template_problems(grader)]
    threshold = grader.get("pass_threshold")
    if "pass_threshold" in grader and kind in EVAL_THRESHOLD and not isinstance(threshold, int | float):
        templates.append((f"{where}.pass_threshold", f"must be a number, got {_show(threshold)}"))
    try:
        model = openai_types()[kind].model_validate(grader)
    except ValidationError as exc:
        return _validation_problems(exc, grader, where) + templates
    return _unknown_fields(model, where) or templates + _meaning_problems(grader, where)


def _validation_problems(exc: ValidationError, data: Any, where: str) -> list[tuple[str, str]]:
    """pydantic's errors, one per field: an error inside a union's branches is cut back to the field the user wrote
    (the branch names, `ResponseInputText` and such, are not in their data)."""
    found: dict[str, str] = {}
    for error in exc.errors():
        loc = _written_part(error["loc"], data, error["type"] == "missing")
        path = "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in loc)
        if path in found:
            found[path] = "is none of the forms OpenAI's grader type accepts here"
        else:
            found[path] = "required" if error["type"] == "missing" else error["msg"]
    return [(where + path, message) for path, message in found.items()]


def _written_part(loc: tuple, data: Any, missing: bool) -> tuple:
    """The longest start of `loc` that names keys present in `data` (plus a missing key's own name)."""
    kept, node = [], data
    for key in loc:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            if missing and isinstance(node, dict) and isinstance(key, str) and key == loc[-1]:
                kept.append(key)
            break
        kept.append(key)
    return tuple(kept)


def _unknown_fields(model: Any, where: str) -> list[tuple[str, str]]:
    """Fields the openai types do not define (they keep extras, as a client must); a spec refuses them, a typo'd
    field would otherwise be ignored."""
    problems = []
    if isinstance(model, BaseModel):
        known = ", ".join(type(model).model_fields)
        extra = [
            k
            for k in model.model_extra or {}
            if not (k == "pass_threshold" and getattr(model, "type", "") in EVAL_THRESHOLD)
        ]
        problems += [(f"{where}.{key}", f"unknown field; the fields are: {known}") for key in extra]
        for name in type(model).model_fields:
            problems += _unknown_fields(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list):
        for i, value in enumerate(model):
            problems += _unknown_fields(value, f"{where}[{i}]")
    return problems


# --- what grpoflow needs on top of OpenAI's types -------------------------------------------------------------------


def _meaning_problems(grader: dict, where: str) -> list[tuple[str, str]]:
    kind, problems = grader["type"], []
    if kind == "text_similarity" and (problem := metric_problem(grader["evaluation_metric"])):
        problems.append((f"{where}.evaluation_metric", problem))
    if kind in MODEL_GRADERS:
        problems += _model_grader_problems(grader, where)
    if kind == "python":
        problems += [(f"{where}.source", message) for message in source_problems(grader["source"])]
    return problems


def template_fields(grader: dict) -> list[tuple[str, str]]:
    """(field path, text) of every string of a grader that may hold a template."""
    fields = [(key, grader[key]) for key in ("input", "reference") if isinstance(grader.get(key), str)]
    if grader.get("type") in MODEL_GRADERS:
        for i, message in enumerate(grader.get("input") or []):
            content = message.get("content") if isinstance(message, dict) else None
            parts = content if isinstance(content, list) else [content]
            for j, part in enumerate(parts):
                at = f"input[{i}].content" + (f"[{j}]" if isinstance(content, list) else "")
                if isinstance(part, str):
                    fields.append((at, part))
                elif isinstance(part, dict) and isinstance(part.get("text"), str):
                    fields.append((f"{at}.text", part["text"]))
    return fields


def _template_problems(grader: dict) -> list[tuple[str, str]]:
    """Template variables a grader cannot fill in (checked on the raw object, so reported beside type errors)."""
    return [
        (field, problem)
        for field, text in template_fields(grader)
        for path in template_paths(text)
        if (problem := path_problem(path)) is not None
    ]


def _model_grader_problems(grader: dict, where: str) -> list[tuple[str, str]]:
    problems = []
    for i, message in enumerate(grader["input"]):
        content = message["content"]
        for j, part in enumerate(content if isinstance(content, list) else [content]):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in (None, "input_text", "output_text"):
                at = f"{where}.input[{i}].content" + (f"[{j}]" if isinstance(content, list) else "")
                problems.append((at, f"{kind} is not supported: a model grader here sends text only"))
    if grader["type"] == "score_model" and grader.get("range") is not None:
        low_high = grader["range"]
        if len(low_high) != 2 or not low_high[0] < low_high[1]:
            problems.append((f"{where}.range", f"must be [low, high] with low < high, got {low_high}"))
    if grader["type"] == "label_model":
        if not grader["labels"]:
            problems.append((f"{where}.labels", "must hold at least one label"))
        if stray := [label for label in grader["passing_labels"] if label not in grader["labels"]]:
            problems.append((f"{where}.passing_labels", f"{', '.join(map(repr, stray))} not among labels"))
    return problems


def source_problems(source: str) -> list[str]:
    """A python grader's source that cannot be run: too long, not Python, or no top-level `grade(sample, item)`.
    It is parsed, never run."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        return [f"is {len(source.encode())} bytes; at most {MAX_SOURCE_BYTES}"]
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"is not valid Python: {exc.msg} (line {exc.lineno})"]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "grade":
            if isinstance(node, ast.AsyncFunctionDef) or len(node.args.args) < 2:
                return ["grade must be a plain function of (sample, item)"]
            return []
    return ["defines no top-level grade(sample, item) function"]


def _multi_problems(grader: dict, where: str) -> list[tuple[str, str]]:
    """A multi grader: its own fields through the openai type's annotations, each sub-grader as a grader of its own.
    `graders` is OpenAI's documented form, a mapping of name -> grader; a single grader (the openai package's typing)
    is taken too, under its own name."""
    from openai.types.graders import MultiGrader

    problems = []
    for field, info in MultiGrader.model_fields.items():
        if field == "graders":
            continue
        if field not in grader:
            problems.append((f"{where}.{field}", "required"))
            continue
        try:
            TypeAdapter(info.annotation).validate_python(grader[field])
        except ValidationError as exc:
            problems.append((f"{where}.{field}", exc.errors()[0]["msg"]))
    known = (*MultiGrader.model_fields,)
    problems += [
        (f"{where}.{key}", f"unknown field; the fields are: {', '.join(known)}") for key in grader if key not in known
    ]
    subs = sub_graders(grader)
    if subs is None:
        return [*problems, (f"{where}.graders", "required: a mapping of name -> grader (or one grader)")]
    single = "type" in grader["graders"]
    for name, sub in subs.items():
        problems += _object_problems(sub, f"{where}.graders" + ("" if single else f".{name}"), nested=True)
    if isinstance(grader.get("calculate_output"), str) and not problems:
        try:
            parse_formula(grader["calculate_output"], list(subs))
        except FormulaError as exc:
            problems.append((f"{where}.calculate_output", str(exc)))
    return problems


def sub_graders(grader: dict) -> dict[str, Any] | None:
    """A multi grader's sub-graders by the names `calculate_output` uses; None when `graders` is neither form."""
    graders = grader.get("graders")
    if not isinstance(graders, dict) or not graders:
        return None
    if "type" in graders:  # one grader, named by its own name
        return {str(graders.get("name")): graders}
    return graders


def graders_of(grader: dict) -> list[dict]:
    """The grader itself and, for a multi grader, every sub-grader: the ones that score."""
    subs = sub_graders(grader) if grader.get("type") == "multi" else None
    return [grader, *(subs or {}).values()]


def needs_endpoint(grader: Any) -> bool:
    """Whether `grader` (a multi grader's sub-graders included) sends requests to an endpoint, `kwargs.base_url`: a
    model grader (score_model, label_model) or a cosine text_similarity."""
    if not isinstance(grader, dict):
        return False
    kinds = {_kwargs_kind(g) for g in graders_of(grader) if isinstance(g, dict)}
    return bool(kinds & {*MODEL_GRADERS, "cosine"})


def _kwargs_problems(grader: dict, kwargs: dict) -> list[tuple[str, str]]:

    needs = {_kwargs_kind(g) for g in graders_of(grader) if isinstance(g, dict)} - {None}
    allowed = list(dict.fromkeys(key for kind in needs for key in KWARGS[kind]))
    if kwargs and not allowed:
        return [("kwargs", f"a {grader['type']} grader takes no kwargs; remove {', '.join(sorted(kwargs))}")]
    problems = [
        (f"kwargs.{key}", f"not a kwarg of this grader; it takes: {', '.join(allowed)}")
        for key in kwargs
        if key not in allowed
    ]
    if needs & {*MODEL_GRADERS, "cosine"} and "base_url" not in kwargs:
        problems.append(("kwargs.base_url", "required: the OpenAI-compatible endpoint (its /v1 root) that answers"))
    for key, value in kwargs.items():
        types, check, what = {**KWARG_CHECKS, **_EXTRA_CHECKS}.get(key, ((object,), lambda v: True, ""))
        if key in allowed and (isinstance(value, bool) or not isinstance(value, types) or not check(value)):
            problems.append((f"kwargs.{key}", f"must be {what}, got {_show(value)}"))
    if isinstance(kwargs.get("base_url"), str) and not problems:
        problems += [(f"kwargs.{key}", message) for key, message in endpoint_problems(kwargs["base_url"])]
    return problems


def _kwargs_kind(grader: dict) -> str | None:
    if grader.get("type") == "text_similarity":
        return "cosine" if grader.get("evaluation_metric") in EMBEDDING_METRICS else None
    return grader.get("type") if grader.get("type") in KWARGS else None


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- text_similarity's metrics: which library computes each (`grpoflow.trainers.graders.similarity` scores them) ---

# metric -> (the module it needs, the package that brings it)
LIBRARIES = {
    "fuzzy_match": ("rapidfuzz", "rapidfuzz"),
    "bleu": ("sacrebleu", "sacrebleu"),
    "gleu": ("nltk", "nltk"),
    "meteor": ("nltk", "nltk"),
    **{f"rouge_{n}": ("rouge_score", "rouge-score") for n in ("1", "2", "3", "4", "5", "l")},
}
EMBEDDING_METRICS = ("cosine",)


def metric_problem(metric: str) -> str | None:
    """Why `metric` cannot be computed here (its library, or METEOR's WordNet data, is missing); None when it can.

    >>> metric_problem("rouge_l") is None
    True
    """
    if metric in EMBEDDING_METRICS or metric not in LIBRARIES:
        return None
    module, package = LIBRARIES[metric]
    if importlib.util.find_spec(module) is None:
        return f"{metric} is computed by {package}, which is not installed: pip install 'grpoflow[graders]'"
    if metric == "meteor" and not _has_wordnet():
        return (
            "meteor matches synonyms through NLTK's WordNet data, which is not installed: python -m nltk.downloader "
            "wordnet (or set NLTK_DATA to a folder holding corpora/wordnet)"
        )
    return None


def _has_wordnet() -> bool:
    import nltk

    for resource in ("corpora/wordnet", "corpora/wordnet.zip"):
        try:
            nltk.data.find(resource)
            return True
        except LookupError:
            continue
    return False


# --- the sandbox's limits, as the operator set them (`grpoflow.trainers.graders.sandbox` enforces them) ---------

LIMIT_SETTINGS = {  # field -> (variable, default)
    "memory_mb": ("GRPOFLOW_SANDBOX_MEMORY_MB", 2048),
    "max_processes": ("GRPOFLOW_SANDBOX_MAX_PROCESSES", 16),
    "disk_mb": ("GRPOFLOW_SANDBOX_DISK_MB", 256),
    "cpu_seconds": ("GRPOFLOW_SANDBOX_CPU_SECONDS", 600),
}


@dataclass(frozen=True)
class Limits:
    """What one sandboxed process may take: MiB of memory, processes, MiB of disk, CPU seconds."""

    memory_mb: int
    max_processes: int
    disk_mb: int
    cpu_seconds: int


class SandboxSettingError(ValueError):
    """A `GRPOFLOW_SANDBOX_*` setting is not a positive integer."""


def operator_limits() -> Limits:
    """The limits the operator set (`GRPOFLOW_SANDBOX_*`), or their defaults.

    Raises:
        SandboxSettingError: a setting that is not a positive integer, named.
    """
    values = {}
    for field, (variable, default) in LIMIT_SETTINGS.items():
        text = os.environ.get(variable, "").strip() or str(default)
        if not text.isdigit() or int(text) < 1:
            raise SandboxSettingError(f"{variable}={text!r}: must be a positive integer (default {default})")
        values[field] = int(text)
    return Limits(**values)
