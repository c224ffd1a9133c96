"""`get_grader_reward`: the TRL reward a `grader:` entry becomes, each type scored as OpenAI's grader guide defines it.

- `string_check`: 1.0 or 0.0; `eq` input == reference, `ne` input != reference, `like` input contains reference,
  `ilike` the same ignoring case.
- `text_similarity`: the metric's similarity in 0..1 (`grpoflow.trainers.graders.similarity`); `cosine` that of the
  two texts' embeddings from the endpoint in `kwargs`.
- `python`: what `grade(sample, item)` returns, run in its own process (`grpoflow.trainers.graders.python`).
- `score_model`: the number the model answers, kept within `range` (default [0, 1]).
- `label_model`: 1.0 when the label the model answers is one of `passing_labels`, else 0.0.
- `multi`: `calculate_output` over the sub-graders' scores, by name.

Model graders ask an OpenAI-compatible chat endpoint (`kwargs.base_url`) as `llm_judge` does: up to `concurrency`
requests at a time, each within `timeout` seconds in all and its reply capped (`grpoflow.core.outbound`), retries
with backoff, the key only from the variable `api_key_env` names; the endpoint's host name is looked up when the reward
is built, and refused when it resolves to a link-local or metadata address. The grader's messages
(templates filled in) are sent as they are, followed by one user message asking for a bare answer (a number in the
range, or one label); no structured-output support of the endpoint is assumed. `kwargs.model` names the model the
endpoint serves when it is not the grader's `model`.

A completion that cannot be scored (the grader raised or timed out, the model answered no number or label, the formula
divided by zero) scores None, "does not apply" to TRL, and the reason is logged once per call: the trainer goes on.
A caller that reports unscored completions itself (the dry run, which refuses a grader that scored none) holds that
line with `held_warnings`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from inspect import Parameter, Signature
from typing import Any

from grpoflow.core.formula import evaluate, parse_formula
from grpoflow.core.graders import EMBEDDING_METRICS, grader_problems, graders_of, sub_graders, template_fields
from grpoflow.core.templates import item_columns
from grpoflow.trainers.graders.python import Graded, run_python_grader
from grpoflow.trainers.graders.similarity import similarity
from grpoflow.trainers.graders.templates import render, sample_of

logger = logging.getLogger(__name__)
Scorer = Callable[[list[dict], list[dict]], Awaitable[list[Graded]]]
_held: ContextVar[list[str] | None] = ContextVar("grpoflow_held_grader_warnings", default=None)


@contextmanager
def held_warnings() -> Iterator[list[str]]:
    """Within it (this thread, and the tasks it starts), a grader's per-call warning ("k of n completions not
    scored") goes to the list it yields instead of the log, for the caller to drop or log (`log_warnings`)."""
    token = _held.set(held := [])
    try:
        yield held
    finally:
        _held.reset(token)


def log_warnings(held: list[str]) -> None:
    """Logs warnings `held_warnings` kept, as the grader would have."""
    for line in held:
        logger.warning("%s", line)


def _warn(line: str) -> None:
    held = _held.get()
    if held is None:
        logger.warning("%s", line)
    else:
        held.append(line)


def get_grader_reward(grader: dict, prompt_column: str = "prompt", **kwargs) -> Callable:
    """Return `grader_reward`, an async TRL reward scoring each completion with the OpenAI grader object `grader`.

    Args:
        grader (`dict`): the grader object, as OpenAI's fine-tuning API takes it.
        prompt_column (`str`, *optional*, defaults to `"prompt"`): the dataset's prompt column, which `item` holds
            under its own name (TRL hands it to rewards as `prompts`).
        kwargs: the entry's `kwargs`: the endpoint of model graders and `cosine` (`base_url`, `api_key_env`, `model`
            or `embedding_model`, `concurrency`, `timeout`, `retries`, `backoff`), a python grader's `timeout` and
            `memory_mb`.

    Raises:
        ValueError: the grader or its kwargs are malformed (see `grader_problems`), or `api_key_env` is unset.

    Example:
    ```python
    >>> reward = get_grader_reward({"type": "string_check", "name": "exact", "operation": "eq",
    ...                             "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"})
    >>> import asyncio
    >>> asyncio.run(reward(["4", "5"], answer=["4", "4"]))
    [1.0, 0.0]

    ```
    """
    if problems := grader_problems(grader, kwargs) or _resolved_endpoint_problems(kwargs):
        raise ValueError("; ".join(f"{path}: {message}" for path, message in problems))
    score = scorer(grader, kwargs)
    name = grader["name"]

    async def grader_reward(completions: list, prompts: list | None = None, **columns) -> list[float | None]:
        items = _items(columns, prompts, prompt_column, len(completions))
        graded = await score([sample_of(c) for c in completions], items)
        grader_reward.errors = [g.error for g in graded]
        if failed := [g.error for g in graded if g.error is not None]:
            _warn(f"grader {name!r}: {len(failed)} of {len(graded)} completions not scored (None): {failed[0]}")
        return [g.score for g in graded]

    grader_reward.errors = []
    columns = [c for g in graders_of(grader) for _, text in template_fields(g) for c in item_columns(text)]
    columns = [c for c in dict.fromkeys(columns) if c not in (prompt_column, "prompt")]
    grader_reward.__signature__ = Signature(  # the columns it reads, so the ingest's column check requires them
        [
            Parameter("completions", Parameter.POSITIONAL_OR_KEYWORD),
            Parameter("prompts", Parameter.POSITIONAL_OR_KEYWORD, default=None),
            *(Parameter(c, Parameter.KEYWORD_ONLY) for c in columns),
            Parameter("kwargs", Parameter.VAR_KEYWORD),
        ]
    )
    if base_url := kwargs.get("base_url"):
        grader_reward.base_url = base_url  # for the dry run's message when the endpoint does not answer in time
    return grader_reward


def _resolved_endpoint_problems(kwargs: dict) -> list[tuple[str, str]]:
    """The endpoint's host name looked up, each address checked: what the requests would reach (validate's check of
    the spec reads the URL only)."""
    from grpoflow.trainers.rewards.judge import endpoint_problems

    if not isinstance(kwargs.get("base_url"), str):
        return []
    return [(f"kwargs.{key}", message) for key, message in endpoint_problems(kwargs["base_url"], resolve=True)]


def _items(columns: dict, prompts: list | None, prompt_column: str, count: int) -> list[dict]:
    """Each completion's dataset row (`item`): the columns TRL passes as lists, and the prompt under its own name."""
    lists = {k: v for k, v in columns.items() if isinstance(v, list) and len(v) == count and k != "completion_ids"}
    items = [{key: values[i] for key, values in lists.items()} for i in range(count)]
    for i, item in enumerate(items):
        if prompts is not None:
            item.setdefault(prompt_column, prompts[i])
    return items


def scorer(grader: dict, kwargs: dict) -> Scorer:
    """The function scoring every (sample, item) of a call with `grader` (checked already)."""
    kind = grader["type"]
    if kind == "string_check":
        return _each(lambda sample, item: _string_check(grader, sample, item))
    if kind == "text_similarity" and grader["evaluation_metric"] in EMBEDDING_METRICS:
        from grpoflow.trainers.graders.endpoint import cosine_scorer

        return cosine_scorer(grader, kwargs)
    if kind == "text_similarity":
        metric = grader["evaluation_metric"]
        return _each(lambda s, i: similarity(metric, render(grader["input"], s, i), render(grader["reference"], s, i)))
    if kind == "python":
        return _python_scorer(grader, kwargs)
    if kind == "multi":
        return _multi_scorer(grader, kwargs)
    from grpoflow.trainers.graders.endpoint import model_scorer

    return model_scorer(grader, kwargs)


async def graded_with_parts(grader: dict, kwargs: dict, sample: dict, item: dict) -> tuple[Graded, dict[str, Graded]]:
    """One completion's grade with `grader` (checked already) and, for a multi grader, each sub-grader's by name (the
    API's grader run shows them); each sub-grader scores once."""
    subs = sub_graders(grader) if grader["type"] == "multi" else None
    if not subs:
        return (await scorer(grader, kwargs)([sample], [item]))[0], {}
    parts = {name: (await scorer(one, kwargs)([sample], [item]))[0] for name, one in subs.items()}
    return _combine(parse_formula(grader["calculate_output"], list(subs)), parts), parts


def _each(score_one: Callable[[dict, dict], float]) -> Scorer:
    async def score(samples: list[dict], items: list[dict]) -> list[Graded]:
        graded = []
        for sample, item in zip(samples, items, strict=True):
            try:
                graded.append(Graded(float(score_one(sample, item))))
            except Exception as exc:  # a library's failure on one odd text must not stop the others
                graded.append(Graded(None, f"{type(exc).__name__}: {exc}"))
        return graded

    return score


def _string_check(grader: dict, sample: dict, item: dict) -> float:
    output, reference = render(grader["input"], sample, item), render(grader["reference"], sample, item)
    operation = grader["operation"]
    if operation == "eq":
        return float(output == reference)
    if operation == "ne":
        return float(output != reference)
    if operation == "like":
        return float(reference in output)
    return float(reference.lower() in output.lower())  # ilike


def _python_scorer(grader: dict, kwargs: dict) -> Scorer:
    limits = {"timeout_s": kwargs.get("timeout", 10.0), "memory_mb": kwargs.get("memory_mb")}

    async def score(samples: list[dict], items: list[dict]) -> list[Graded]:
        rows = list(zip(samples, items, strict=True))
        return await asyncio.to_thread(run_python_grader, grader["source"], rows, **limits)

    return score


def _multi_scorer(grader: dict, kwargs: dict) -> Scorer:
    subs = sub_graders(grader)
    scorers = {name: scorer(sub, kwargs) for name, sub in subs.items()}
    formula = parse_formula(grader["calculate_output"], list(subs))

    async def score(samples: list[dict], items: list[dict]) -> list[Graded]:
        results = await asyncio.gather(*(s(samples, items) for s in scorers.values()))
        by_name = dict(zip(scorers, results, strict=True))
        return [_combine(formula, {name: graded[i] for name, graded in by_name.items()}) for i in range(len(samples))]

    return score


def _combine(formula: Any, graded: dict[str, Graded]) -> Graded:
    for name, one in graded.items():
        if one.score is None:
            return Graded(None, f"sub-grader {name!r}: {one.error}")
    try:
        value = evaluate(formula, {name: one.score for name, one in graded.items()})
    except (ArithmeticError, ValueError) as exc:
        return Graded(None, f"calculate_output: {type(exc).__name__}: {exc}")
    return Graded(value) if math.isfinite(value) else Graded(None, f"calculate_output gave {value}")
