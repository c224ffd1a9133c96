"""The dry run: each reward called on a few dataset rows before any model loads, so a broken one fails in seconds."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import os
import threading
from collections.abc import Callable
from typing import Any

from grpoflow.trainers.graders.reward import held_warnings, log_warnings
from grpoflow.trainers.model.load import prepare_prompts
from grpoflow.trainers.rewards import DRY_RUN_MAX_MODEL_BYTES, DRY_RUN_ROWS, RewardError
from grpoflow.trainers.rewards.build import build_reward, check_output, own_copies, reward_columns
from grpoflow.trainers.rewards.models import load_reward_model, reward_model_bytes

# --- dry run ---------------------------------------------------------------------------------------------------------


def dry_run_rewards(
    rewards: list[tuple[str, Callable]],
    rows: list[dict],
    prompt_column: str,
    timeout_s: float = 10.0,
    row_numbers: list[int] | None = None,
) -> None:
    """Call each reward as TRL will, on up to 4 dataset rows with dummy completions, and report every broken one.

    For each row the completions are `""`, `"<answer>0</answer>"` and, when the row has an `answer`, that answer in
    tags and bare. They are conversational (`[{"role": "assistant", ...}]`) when the row's prompt is a message list,
    as in TRL, so pass rows as the trainer will see them. Like TRL, every column except the prompt, `completion` and
    `completion_ids` is passed as a keyword list.
    A grader's own warning about completions it could not score is logged once (each distinct line) when the reward
    passes, and left out when it is refused: the refusal says why, once.

    Args:
        rewards (`list[tuple[str, Callable]]`): (spec name, reward) pairs.
        rows (`list[dict]`): dataset rows, column -> value; only the first 4 are used.
        prompt_column (`str`): the column that holds the prompt.
        timeout_s (`float`, *optional*, defaults to `10.0`): how long one call may take.
        row_numbers (`list[int]` or `None`, *optional*): the rows' indices in the dataset, for messages; defaults to
            their positions in `rows`.

    Raises:
        RewardError: listing, in `.problems`, the first problem of each reward that raised, hung, or returned
            something other than one finite number (or `None`) per completion.
    """
    sample = rows[:DRY_RUN_ROWS]
    indices = row_numbers[:DRY_RUN_ROWS] if row_numbers is not None else list(range(len(sample)))
    problems = []
    for name, reward in rewards:
        with held_warnings() as held:
            problem = _first_problem(reward, list(zip(sample, indices, strict=True)), prompt_column, timeout_s)
        if problem is None:
            log_warnings(list(dict.fromkeys(held)))
        else:
            problems.append(f"reward {name!r} {problem}")
    if len(problems) == 1:
        raise RewardError(problems[0], problems)
    if problems:
        raise RewardError(f"{len(problems)} reward problems:\n" + "\n".join(f"- {p}" for p in problems), problems)


def _first_problem(reward: Callable, rows: list[tuple[dict, int]], prompt_column: str, timeout_s: float) -> str | None:
    """The first problem of `reward` on the (row, row number) pairs, with the row and what to change; None if none."""
    for row, row_number in rows:
        if (problem := _check_reward_on_row(reward, row, prompt_column, timeout_s)) is not None:
            # One problem per reward is enough to act on; a hung reward would also cost timeout_s per row.
            return f"{problem} on dataset row {row_number}{_explain(reward, row, prompt_column, timeout_s, problem)}"
    return None


def call_reward(
    reward: Callable, prompts: list, completions: list, completion_ids: list, columns: dict, environments=None
) -> Any:
    """Calls `reward` with what TRL's GRPOTrainer passes it, outside a trainer, and awaits an `async def` reward.

    Args:
        reward (`Callable`): a reward with TRL's signature.
        prompts (`list`), completions (`list`), completion_ids (`list[list[int]]`): one entry per completion.
        columns (`dict[str, list]`): the other dataset columns, one value per completion (TRL leaves out the prompt,
            `completion` and `completion_ids`; see `trl_columns`).
        environments (`list`, *optional*): the rollouts' environment instances, passed as TRL passes them (not
            copied: a reward reads their state).

    Returns:
        What the reward returned: a list with one float (or None) per completion, unless it is broken.
    """
    arguments = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns}
    shared = {"environments": environments} if environments is not None else {}
    result = reward(
        **own_copies(arguments),  # its own copies, as in training: what it changes no other reward sees
        **shared,
        trainer_state=None,  # no trainer outside training
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
    )
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def trl_columns(columns: dict[str, list], prompt_column: str = "prompt") -> dict[str, list]:
    """The dataset columns TRL passes a reward as keyword lists: all but the prompt, `completion`, `completion_ids`."""
    skipped = (prompt_column, "prompt", "completion", "completion_ids")
    return {k: v for k, v in columns.items() if k not in skipped}


def _dummy_call(row: dict, prompt_column: str) -> tuple[list, Callable[[Callable], Any]]:
    """The dry run's completions for `row`, and a function calling a reward on them as TRL will."""
    texts = ["", "<answer>0</answer>"]
    if row.get("answer") is not None:
        texts += [f"<answer>{row['answer']}</answer>", str(row["answer"])]
    prompt = row[prompt_column]
    conversational = isinstance(prompt, list)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    columns = trl_columns({k: [v] * len(texts) for k, v in row.items()}, prompt_column)
    ids = [[0] * len(t) for t in texts]
    return completions, lambda reward: call_reward(reward, [prompt] * len(texts), completions, ids, columns)


def _explain(reward: Callable, row: dict, prompt_column: str, timeout_s: float, problem: str) -> str:
    """What a failing reward was given and, when it works on the other shape of completions, what to change.

    TRL gives a reward chat completions (`[{"role": "assistant", "content": ...}]`) exactly when the prompts are
    chats, and strings otherwise; a reward written for the other shape (TRL's own `think_format_reward` reads
    `completion[0]["content"]`) fails with an IndexError or TypeError that says nothing of that. So it is called
    once more on the same row with the other shape: if it works there, the message says so.
    """
    if problem.startswith("scored none"):
        return ""  # a grader reads either shape of completion (its sample.output_text): calling again says nothing
    if problem.startswith("did not return"):
        # A hung reward is not called again; one waiting on an endpoint (llm_judge) says which.
        endpoint = getattr(inspect.unwrap(reward), "base_url", None)
        return f" (waiting on {endpoint}: is it up and reachable from here?)" if endpoint else ""
    chat = isinstance(row[prompt_column], list)
    columns = ", ".join(trl_columns(row, prompt_column)) or "none"
    given = f" (given {'chat completions (lists of messages)' if chat else 'string completions'}; columns: {columns})"
    if "math_verify" in problem or "math-verify" in problem:
        return f"{given}; TRL's math rewards need math-verify: pip install 'grpoflow[math]'"
    prompt = row[prompt_column]
    other = "\n".join(str(m.get("content", "")) for m in prompt) if chat else [{"role": "user", "content": prompt}]
    if _check_reward_on_row(reward, {**row, prompt_column: other}, prompt_column, timeout_s) is not None:
        return given
    if chat:
        return f"{given}; this reward expects string completions: give string prompts, without a system_prompt"
    return (
        f"{given}; this reward expects chat completions (lists of messages): give chat prompts (a list of "
        "{role, content}) or set hyperparameters.system_prompt"
    )


def _check_reward_on_row(reward: Callable, row: dict, prompt_column: str, timeout_s: float) -> str | None:
    completions, call_on_row = _dummy_call(row, prompt_column)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = call_on_row(reward)
        except BaseException as exc:  # reported, not raised: the thread must not die silently
            outcome["error"] = exc

    # A daemon thread, because a hung reward cannot be killed and must not keep the process alive at exit; in this
    # context, so a grader's warnings are held with the caller's (`held_warnings`).
    thread = threading.Thread(target=contextvars.copy_context().run, args=(call,), name="reward-dry-run", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return f"did not return within {timeout_s:g} s"
    if "error" in outcome:
        exc = outcome["error"]
        return f"raised {type(exc).__name__}: {exc}"
    return check_output(outcome["value"], len(completions)) or _scored_none(reward, outcome["value"])


def _scored_none(reward: Callable, values: list) -> str | None:
    """A grader that scored none of the row's completions, each with an error (its code raised, or returned no
    number): broken as a reward that raises is, though one unscorable completion is only "does not apply" (None)."""
    while reward is not None and not hasattr(reward, "errors"):
        reward = getattr(reward, "__wrapped__", None)
    errors = getattr(reward, "errors", None) or []
    if len(errors) == len(values) and all(v is None for v in values) and all(errors):
        return f"scored none of the {len(values)} completions ({errors[0]})"
    return None


# --- a job's rewards on its dataset ------------------------------------------------------------------------------


def required_columns(spec, rewards: list[Callable]) -> dict[str, str]:
    """Columns the job reads besides the prompt, each with the reason (shown when it is missing).

    Args:
        spec (`JobSpec`): the job spec (its rewards, in the order of `rewards`, and its SFT warm-up).
        rewards (`list[Callable]`): the spec's rewards, built.
    """
    needed = {}
    for reward_spec, reward in zip(spec.rewards, rewards, strict=True):
        for column in reward_columns(reward):
            needed.setdefault(column, f"reward {reward_spec.name!r}")
    if spec.sft.enabled:
        needed.setdefault(spec.sft.completion_column, "the SFT warm-up (sft.completion_column)")
    return needed


def metric_columns(spec) -> dict[str, str]:
    """Columns the held-out metric (`evaluation.metric`) reads besides the prompt, each with the reason: what a
    validation set (`evaluation.dataset`) must have. Raises `RewardError` when the metric does not build."""
    if (entry := spec.evaluation_reward) is None:  # the environment's get_reward(): no column of its own
        return {}
    metric = build_reward(
        entry.name, entry.function, entry.kwargs, entry.model, entry.grader, spec.dataset.prompt_column
    )
    return dict.fromkeys(reward_columns(metric), f"evaluation.metric {spec.evaluation.metric_name!r}")


def dry_run_job_rewards(spec, rewards: list[Callable], dataset) -> list[str]:
    """Dry-runs the rewards of `spec` on a few rows of `dataset`, shaped as TRL will pass them (system prompt applied).

    A reward model is loaded on CPU first (outside the per-call timeout) and scores the dry run's completions like
    any reward; one with more than `DRY_RUN_MAX_MODEL_BYTES` of weights is skipped, with a note: on CPU it would cost
    minutes and its memory, and its files were checked when it was built.

    Returns:
        `list[str]`: notes on what was skipped, one line each (empty when every reward ran).

    Raises:
        RewardError: see `dry_run_rewards`; also for a malformed `GRPOFLOW_REWARD_DRY_RUN_TIMEOUT`, or a reward
            model that fails to load.
    """
    timeout = dry_run_timeout()
    rows = dataset.select(range(min(DRY_RUN_ROWS, len(dataset))))
    sample = prepare_prompts(rows, spec.dataset.prompt_column, spec.hyperparameters.system_prompt)
    named, notes = [], []
    for reward_spec, fn in zip(spec.rewards, rewards, strict=True):
        model = getattr(reward_spec, "model", None)
        if model is not None and (size := reward_model_bytes(model)) > DRY_RUN_MAX_MODEL_BYTES:
            notes.append(
                f"reward {reward_spec.name!r}: dry run skipped, the reward model {model} has {size / 1024**3:.1f} GiB "
                f"of weights (over {DRY_RUN_MAX_MODEL_BYTES / 1024**3:.0f} GiB on CPU); its files were checked"
            )
            continue
        if model is not None:
            try:
                load_reward_model(model)
            except Exception as exc:  # a corrupt or mismatched checkpoint: the user's files
                raise RewardError(
                    f"reward {reward_spec.name!r}: the reward model {model} does not load: {type(exc).__name__}: {exc}"
                ) from exc
        named.append((reward_spec.name, fn))
    dry_run_rewards(named, sample.to_list(), "prompt", timeout_s=timeout)
    return notes


def dry_run_timeout() -> float:
    """Seconds one reward call may take in the dry run: `GRPOFLOW_REWARD_DRY_RUN_TIMEOUT`, default 10."""
    raw = os.environ.get("GRPOFLOW_REWARD_DRY_RUN_TIMEOUT", "10")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise RewardError(f"GRPOFLOW_REWARD_DRY_RUN_TIMEOUT={raw!r}: expected a number of seconds > 0")
    return seconds
