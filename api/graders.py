"""OpenAI's grader endpoints as the `openai` client calls them (`client.fine_tuning.alpha.graders.run/validate`).

    POST /v1/fine_tuning/alpha/graders/validate     {grader} -> {"grader": ...}, or one 400 naming every problem
    POST /v1/fine_tuning/alpha/graders/run          {grader, model_sample, item} -> {reward, metadata, sub_rewards,
                                                    model_grader_token_usage_per_model}

Both check the grader as a job's `grader:` reward is checked (`grpoflow.core.graders.grader_problems`), and run scores
it as training does (`grpoflow.trainers.graders.reward.scorer`): a python grader in the sandbox only, never in the
API's process (the policy's `from_deployments.python_graders: off` refuses it, as it refuses a job's). Model graders
and `cosine` need an endpoint (a job's `kwargs.base_url`), which OpenAI's request has no field for: they are sent to
the operator's, the policy's `from_deployments.model_graders` (`endpoint_kwargs`), for a run here as for a job's
rewards; with none set, a run (or a job) with one is refused, naming that setting.
"""

from __future__ import annotations

import os
import time
from typing import Annotated

from fastapi import APIRouter, Body, Request

from grpoflow.api.errors import ApiError, bad_spec
from grpoflow.core.graders import grader_problems, graders_of, needs_endpoint
from grpoflow.core.policy import PolicyError, load_policy
from grpoflow.trainers.graders import sandbox
from grpoflow.trainers.graders.reward import graded_with_parts
from grpoflow.trainers.graders.templates import sample_of

router = APIRouter(prefix="/v1/fine_tuning/alpha/graders")
# OpenAI's run response's error flags: grpoflow sets a python grader's runtime error, a model grader's endpoint's
# failure, and a multi grader's formula's.
ERROR_FLAGS = ("formula_parse_error", "invalid_variable_error", "model_grader_parse_error",
               "model_grader_refusal_error", "model_grader_server_error", "other_error", "python_grader_runtime_error",
               "python_grader_server_error", "sample_parse_error", "truncated_observation_error",
               "unresponsive_reward_error")  # fmt: skip


def checked_grader(grader, settings, run: bool) -> tuple[list[str], dict]:
    """Every problem of `grader` from a team's request, as "param: message" (the grader object's own, the policy's
    refusal of python graders or a sandbox that cannot start, and for `run` a model grader with no endpoint set), and
    the kwargs it is scored with (a model grader's: the operator's endpoint)."""
    kwargs, said = {}, []
    if run and needs_endpoint(grader):
        kwargs, why = endpoint_kwargs(settings)
        said += [f"grader: {why}"] if why else []
    problems = [(p, m) for p, m in grader_problems(grader, kwargs) if p.startswith("grader") or run]
    said += [f"{p}: {m}" for p, m in problems if not (p.startswith("kwargs.") and not kwargs)]
    if isinstance(grader, dict) and any(g.get("type") == "python" for g in graders_of(grader) if isinstance(g, dict)):
        said += _python_refusals(settings)
    return said, kwargs


MODEL_GRADERS_LINE = "from_deployments.model_graders: {base_url: ..., api_key_env: ...}"


def endpoint_kwargs(settings) -> tuple[dict, str | None]:
    """The kwargs that send a model grader's calls to the operator's endpoint (the policy's
    `from_deployments.model_graders`), or none and why."""
    try:
        loaded = load_policy(settings.project)
    except PolicyError as e:
        return {}, f"the operator's policy: {e}"
    own = loaded.policy.from_deployments.model_graders
    if own is None:
        why = (f"a model grader (score_model, label_model) or cosine needs an endpoint, and the operator's policy "
               f"({loaded.source}) sets none: the operator sets it with `{MODEL_GRADERS_LINE}`")  # fmt: skip
        return {}, why
    return {"base_url": own.base_url} | ({"api_key_env": own.api_key_env} if own.api_key_env else {}), None


def _python_refusals(settings) -> list[str]:
    try:
        if load_policy(settings.project).policy.from_deployments.python_graders == "off":
            return ["grader: a python grader is code, which the operator's policy turns off "
                    "(from_deployments.python_graders: off)"]  # fmt: skip
    except PolicyError as e:
        return [f"grader: the operator's policy: {e}"]
    if problem := sandbox.sandbox_problem():
        return [f"grader: a python grader runs only in the sandbox, which cannot start on this server ({problem})"]
    return []


@router.post("/validate")
async def validate(request: Request, grader: Annotated[dict, Body(embed=True)]) -> dict:
    """Checks an OpenAI grader object as a job's `grader:` reward is checked; returns it."""
    if problems := checked_grader(grader, request.app.state.settings, run=False)[0]:
        raise bad_spec(problems)
    return {"grader": grader}


@router.post("/run")
async def run(
    request: Request,
    grader: Annotated[dict, Body()],
    model_sample: Annotated[str, Body()],
    item: Annotated[dict | None, Body()] = None,
) -> dict:
    """Scores one model sample (and dataset item) with an OpenAI grader, as training does."""
    problems, kwargs = checked_grader(grader, request.app.state.settings, run=True)
    if problems:
        raise bad_spec(problems)
    if (variable := kwargs.get("api_key_env")) and not os.environ.get(variable):
        said = (f"the model graders' endpoint's key variable {variable} is not set where the API runs (the "
                "operator's from_deployments.model_graders.api_key_env)")  # fmt: skip
        raise ApiError(500, said, code="model_grader_key")
    started = time.monotonic()
    graded, parts = await graded_with_parts(grader, kwargs, sample_of(model_sample), item or {})
    errors = dict.fromkeys(ERROR_FLAGS, False)
    if graded.error is not None and grader["type"] == "python":
        errors.update(python_grader_runtime_error=True, python_grader_runtime_error_details=graded.error)
    elif graded.error is not None and kwargs:
        errors["model_grader_server_error"] = True
    elif graded.error is not None:
        errors["formula_parse_error" if "calculate_output" in graded.error else "other_error"] = True
    reward = graded.score if graded.score is not None else 0.0
    sub_rewards = {name: part.score for name, part in parts.items()}
    metadata = {"errors": errors, "execution_time": time.monotonic() - started, "name": grader["name"],
                "sampled_model_name": None, "scores": {grader["name"]: graded.score} | sub_rewards,
                "token_usage": None, "type": grader["type"]}  # fmt: skip
    return {
        "reward": reward,
        "metadata": metadata,
        "sub_rewards": sub_rewards,
        "model_grader_token_usage_per_model": {},
    }
