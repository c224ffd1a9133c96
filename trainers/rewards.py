"""Reward functions for GRPO: the built-ins, loading a spec's rewards, and a pre-training dry run.

Every reward has TRL's signature `(completions, **kwargs) -> list[float | None]`: `completions` holds strings, or
message lists for conversational prompts; dataset columns arrive as keyword lists, one value per completion; TRL also
passes `prompts`, `completion_ids`, `trainer_state`, `log_extra` and `log_metric`. `None` means "does not apply".

A job spec names its rewards; `build_reward` turns one entry into a callable whose `__name__` is the entry's `name`,
so TRL logs it as `rewards/<name>/mean`:

    rewards:
      - name: exact_answer                      # a built-in, see REWARDS
      - name: short
        kwargs: {max_chars: 120}                # built-in factories take their arguments from kwargs
      - name: close
        function: grpoflow.examples.rewards.arithmetic:close_answer_reward

`dry_run_rewards` calls each reward on a few dataset rows before training, so a broken reward fails the job in
seconds with a message that names it, instead of after the model has loaded.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import math
import numbers
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpoflow.trainers.judge import get_llm_judge_reward

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# The thousands-separated form goes first so "1,234" is one number; the lookbehind keeps the "-" of "5-3" an operator.
NUMBER = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?:(?<![\w.])-)?\.\d+")
DRY_RUN_ROWS = 4
# A reward model above this much weight is not loaded on CPU by the dry run (its config is still checked): a 7B one
# would take minutes and tens of GB there, while a classifier of up to ~0.5B parameters in fp32 loads in seconds.
DRY_RUN_MAX_MODEL_BYTES = 2 * 1024**3


class RewardError(ValueError):
    """A reward cannot be built or misbehaves on the dataset; the message names the reward.

    Attributes:
        problems (`list[str]`): one line per problem found, for callers that report them separately.
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


# --- helpers shared by the rewards -----------------------------------------------------------------------------------


def completion_text(completion: str | list[dict]) -> str:
    """Return the text of one completion, plain (`"..."`) or conversational (`[{"role": "assistant", ...}]`).

    For a conversation the last message counts: with tool calls the final answer comes after the tool turns.

    >>> completion_text("<answer>4</answer>")
    '<answer>4</answer>'
    >>> completion_text([{"role": "assistant", "content": "<answer>4</answer>"}])
    '<answer>4</answer>'
    """
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    content = completion[-1].get("content") or ""
    if isinstance(content, list):  # multimodal form: [{"type": "text", "text": ...}, ...]
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def extract_answer(text: str) -> str:
    """Return the content of the last `<answer>...</answer>`, or the whole text, stripped.

    >>> extract_answer("I think... <answer> 42 </answer>")
    '42'
    >>> extract_answer(" 42\\n")
    '42'
    """
    tagged = ANSWER_TAG.findall(text)
    return (tagged[-1] if tagged else text).strip()


def parse_number(text: str) -> float | None:
    """Return the last number in `text` ("-3", "2.5", "1,234", "1e3"), or `None` when there is none.

    >>> parse_number("so 1,234 + 6 = 1,240")
    1240.0
    >>> parse_number("no idea") is None
    True
    """
    numbers_found = NUMBER.findall(text)
    return float(numbers_found[-1].replace(",", "")) if numbers_found else None


# --- built-in rewards ------------------------------------------------------------------------------------------------


def exact_answer_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """Reward 1.0 when the completion's answer equals the `answer` column, else 0.0.

    The completion's answer is the content of its last `<answer>...</answer>`, or the whole completion; both sides
    are compared as strings after stripping. A row whose answer is `None` gets `None` (the reward does not apply).

    Args:
        completions (`list[str]` or `list[list[dict]]`): the completions to score.
        answer (`list`): the dataset's `answer` column, one value per completion.

    Example:
    ```python
    >>> exact_answer_reward(["<answer>4</answer>", "4", "<answer>5</answer>"], answer=["4", "4", 4])
    [1.0, 1.0, 0.0]

    ```
    """
    return [
        None if truth is None else float(extract_answer(completion_text(c)) == str(truth).strip())
        for c, truth in zip(completions, answer, strict=True)
    ]


def get_answer_format_reward(pattern: str = r"^<answer>.*?</answer>$") -> Callable[..., list[float | None]]:
    """Return `answer_format_reward`, which scores 1.0 when the stripped completion fully matches `pattern`, else 0.0.

    `.` matches newlines too (`re.DOTALL`), so multi-line reasoning inside the tags still counts.

    Args:
        pattern (`str`, *optional*, defaults to `r"^<answer>.*?</answer>$"`): the regular expression.

    Raises:
        ValueError: `pattern` is not a valid regular expression.

    Example:
    ```python
    >>> reward = get_answer_format_reward()
    >>> reward(["<answer>4</answer>\\n", "The answer is 4", "<answer>4</answer> done"])
    [1.0, 0.0, 0.0]
    >>> get_answer_format_reward(r"<think>.*</think><answer>.*</answer>")(["<think>2+2</think><answer>4</answer>"])
    [1.0]

    ```
    """
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None

    def answer_format_reward(completions: list, **kwargs) -> list[float | None]:
        return [float(regex.fullmatch(completion_text(c).strip()) is not None) for c in completions]

    return answer_format_reward


def get_length_penalty_reward(max_chars: int = 200, penalty: float = 1.0) -> Callable[..., list[float | None]]:
    """Return `length_penalty_reward`: 0.0 up to `max_chars` characters, falling linearly to `-penalty` at twice that.

    Add it next to a correctness reward when completions grow without the reward improving (length explosion).

    Args:
        max_chars (`int`, *optional*, defaults to `200`): the longest completion that costs nothing; >= 1.
        penalty (`float`, *optional*, defaults to `1.0`): the penalty at `2 * max_chars` characters and beyond; >= 0.

    Example:
    ```python
    >>> reward = get_length_penalty_reward(max_chars=10, penalty=1.0)
    >>> reward(["short", "x" * 15, "x" * 20, "x" * 500])
    [0.0, -0.5, -1.0, -1.0]

    ```
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")

    def length_penalty_reward(completions: list, **kwargs) -> list[float | None]:
        overshoot = [max(0, len(completion_text(c)) - max_chars) / max_chars for c in completions]
        return [-penalty * min(1.0, over) if over > 0 else 0.0 for over in overshoot]

    return length_penalty_reward


def get_numeric_match_reward(rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> Callable[..., list[float | None]]:
    """Return `numeric_match_reward`: 1.0 when the last number of the completion's answer equals the `answer` column.

    Numbers may be negative, decimal or thousands-separated ("1,234"); they are equal within `math.isclose(rel_tol,
    abs_tol)`. A completion or answer without a number scores 0.0; a row whose answer is `None` gets `None`.

    Args:
        rel_tol (`float`, *optional*, defaults to `1e-6`): relative tolerance; >= 0.
        abs_tol (`float`, *optional*, defaults to `1e-9`): absolute tolerance; >= 0.

    Example:
    ```python
    >>> reward = get_numeric_match_reward()
    >>> reward(["<answer>1,234</answer>", "so x = -2.50", "<answer>none</answer>"], answer=["1234", -2.5, "3"])
    [1.0, 1.0, 0.0]

    ```
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"rel_tol and abs_tol must be >= 0, got rel_tol={rel_tol}, abs_tol={abs_tol}")

    def numeric_match_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
        scores = []
        for c, truth in zip(completions, answer, strict=True):
            got, want = parse_number(extract_answer(completion_text(c))), parse_number(str(truth))
            matched = (
                got is not None and want is not None and math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)
            )
            scores.append(None if truth is None else float(matched))
        return scores

    return numeric_match_reward


# The one registry: spec name -> reward function, or `get_*` factory that takes the spec's kwargs.
REWARDS: dict[str, Callable] = {
    "answer_format": get_answer_format_reward,
    "exact_answer": exact_answer_reward,
    "length_penalty": get_length_penalty_reward,
    "llm_judge": get_llm_judge_reward,
    "numeric_match": get_numeric_match_reward,
}


# --- reward models ---------------------------------------------------------------------------------------------------


def reward_model_folder(model: str) -> Path | None:
    """The folder holding a reward model's config.json: the local folder, or its snapshot in the local Hugging Face
    cache; None when neither holds it. Nothing is downloaded."""
    from grpoflow.trainers.modeling import cached_hub_file, is_local_model

    if is_local_model(model):
        folder = Path(model).expanduser()
        return folder if (folder / "config.json").is_file() else None
    config = cached_hub_file(model, "config.json")
    return config.parent if config is not None else None


def reward_model_problem(model: str) -> str | None:
    """Why `model` cannot be a reward model here, found offline from its files (no weights loaded, no download): a
    missing folder or uncached Hub id, no weights or tokenizer, or a config.json whose `architectures` is not a
    `...ForSequenceClassification` (TRL would bolt an untrained score head onto it). None when it is fine."""
    from grpoflow.trainers.modeling import WEIGHT_FILES, is_local_model

    folder = reward_model_folder(model)
    if folder is None:
        if not is_local_model(model):
            return (
                f"{model!r} is not in the local Hugging Face cache (validate does not download): fetch it first "
                f"(hf download {model}) or give a local folder"
            )
        if not Path(model).expanduser().exists():
            return f"{model} does not exist (a local reward model folder; a Hub model id is owner/name)"
        return f"{model} has no config.json: give a folder saved with save_pretrained"
    try:
        config = json.loads((folder / "config.json").read_text())
        architectures = config.get("architectures") or []
    except (OSError, ValueError, AttributeError) as exc:
        return f"cannot read {folder / 'config.json'}: {exc}"
    if not any(isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
        found = ", ".join(map(str, architectures)) or "none"
        return (
            f"{model} is not a sequence classifier (config.json architectures: {found}); give a reward model saved "
            "from AutoModelForSequenceClassification with num_labels=1"
        )
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"{model} has a config.json but no weights ({', '.join(WEIGHT_FILES[:2])}, ...)"
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return f"{model} has no tokenizer (TRL scores with the reward model's own tokenizer): save it alongside"
    return None


def reward_model_bytes(model: str) -> int:
    """Bytes of weights a reward model's folder (or cache snapshot) holds; 0 when it is not here."""
    folder = reward_model_folder(model)
    if folder is None:
        return 0
    return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".safetensors", ".bin") and f.is_file())


@functools.cache
def load_reward_model(model: str) -> tuple[Any, Any]:
    """The reward model and its tokenizer on CPU, loaded as TRL's GRPOTrainer loads a model-id reward:
    `AutoModelForSequenceClassification(num_labels=1)`, the model's own tokenizer, its eos as pad token when it has
    none, and that pad id in the config (the score is read at the last non-pad token)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    classifier = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1).eval()
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    classifier.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    return classifier, tokenizer


def get_reward_model_reward(model: str) -> Callable[..., list[float | None]]:
    """Return `reward_model_reward`: the sequence classifier `model`'s score (`logits[:, 0]`) of each prompt +
    completion, computed as TRL's `GRPOTrainer._calculate_rewards` does for a model-id reward (a chat through the
    reward model's chat template, text concatenated). The model loads on first call, on CPU; the dry run and the
    held-out evaluation use this, training hands `model` to TRL itself.

    Args:
        model (`str`): a local folder or a Hub id in the local cache.
    """

    def reward_model_reward(completions: list, prompts: list, **kwargs) -> list[float | None]:
        import torch
        from trl.data_utils import apply_chat_template, is_conversational

        classifier, tokenizer = load_reward_model(model)
        if is_conversational({"prompt": prompts[0]}):
            messages = [{"messages": p + c} for p, c in zip(prompts, completions, strict=True)]
            texts = [apply_chat_template(m, tokenizer)["text"] for m in messages]
        else:
            texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        inputs = tokenizer(
            text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
        )
        with torch.inference_mode():
            return classifier(**inputs).logits[:, 0].float().tolist()

    return reward_model_reward


# --- building a spec's rewards ---------------------------------------------------------------------------------------


def build_reward(
    name: str, function: str | None = None, kwargs: dict | None = None, model: str | None = None
) -> Callable:
    """Build the reward a spec entry describes, named `name` so TRL logs it as `rewards/<name>/mean`.

    Without `function`, `name` picks a built-in from `REWARDS`; factories (`get_*_reward`) are called with `kwargs`.
    With `function` ("package.module:callable", importable from the working directory too), the callable is the
    reward itself, or, when `kwargs` is non-empty, a factory called as `callable(**kwargs)` that returns the reward.
    With `model`, the reward is that sequence-classification model's score (see `get_reward_model_reward`); training
    hands the model id to TRL instead, which loads it as this does and places it on the GPU.

    Args:
        name (`str`): the spec entry's name.
        function (`str` or `None`, *optional*, defaults to `None`): where a custom reward lives.
        kwargs (`dict` or `None`, *optional*, defaults to `None`): arguments for a factory.
        model (`str` or `None`, *optional*, defaults to `None`): a reward model's folder or Hub id.

    Raises:
        RewardError: unknown built-in, import failure, bad kwargs, or something that is not callable.

    A built-in is picked by its name, so to use one twice (say, two length penalties) under other names, point
    `function` at its factory: `function: grpoflow.trainers.rewards:get_length_penalty_reward` with `kwargs`.

    Example:
    ```python
    >>> reward = build_reward("length_penalty", kwargs={"max_chars": 2})
    >>> reward.__name__, reward(["ok", "too long"])
    ('length_penalty', [0.0, -1.0])
    >>> try:
    ...     build_reward("lenght_penalty")
    ... except RewardError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    reward 'lenght_penalty': unknown built-in; choose one of: answer_format, exact_answer, length_penalty, ...

    ```
    """
    if model is not None:
        reward = _build_reward_model(name, model, function, kwargs)
    elif function is None:
        reward = _build_builtin(name, kwargs or {})
    else:
        reward = _build_custom(name, function, kwargs)
    return _named(reward, name)


def _build_builtin(name: str, kwargs: dict) -> Callable:
    if name not in REWARDS:
        raise RewardError(
            f"reward {name!r}: unknown built-in; choose one of: {', '.join(sorted(REWARDS))} "
            "(or give `function: package.module:callable`)"
        )
    entry = REWARDS[name]
    if entry.__name__.startswith("get_"):
        return _call_factory(name, entry, kwargs, entry.__name__)
    if kwargs:
        raise RewardError(f"reward {name!r}: the built-in takes no kwargs, got: {', '.join(sorted(kwargs))}")
    return entry


def _build_custom(name: str, function: str, kwargs: dict | None) -> Callable:
    target = _import_callable(name, function)
    # A spec entry always carries `kwargs` ({} by default): only non-empty kwargs make the callable a factory.
    if not kwargs:
        return target
    reward = _call_factory(name, target, kwargs, function)
    if not callable(reward):
        raise RewardError(
            f"reward {name!r}: with kwargs, {function!r} is called as a factory and must return the reward function, "
            f"but it returned {type(reward).__name__}"
        )
    return reward


def _build_reward_model(name: str, model: str, function: str | None, kwargs: dict | None) -> Callable:
    if function is not None:
        raise RewardError(f"reward {name!r}: give function or model, not both")
    if kwargs:
        raise RewardError(f"reward {name!r}: a reward model takes no kwargs, got: {', '.join(sorted(kwargs))}")
    if (problem := reward_model_problem(model)) is not None:
        raise RewardError(f"reward {name!r}: {problem}")
    return get_reward_model_reward(model)


def _import_callable(name: str, function: str) -> Callable:
    module_name, sep, attr = function.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {name!r}: function {function!r} must look like 'package.module:callable'")
    # Console scripts do not put the working directory on sys.path; appending it lets a spec name a reward module
    # that sits next to it (grpoflow.examples.rewards.arithmetic) without shadowing installed packages.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a syntax error or failing import in the user's module is their mistake, not ours
        raise RewardError(f"reward {name!r}: cannot import {function!r}: {exc}") from exc
    target = getattr(module, attr, None)
    if target is None:
        raise RewardError(f"reward {name!r}: cannot import {function!r}: module {module_name!r} has no {attr!r}")
    if not callable(target):
        raise RewardError(f"reward {name!r}: {function!r} is a {type(target).__name__}, not a function")
    return target


def _call_factory(name: str, factory: Callable, kwargs: dict, label: str) -> Callable:
    try:
        return factory(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RewardError(f"reward {name!r}: bad kwargs for {label}: {exc}") from exc


def _is_async(fn: Callable) -> bool:
    # The same test as trl.trainer.utils.is_async_callable, without importing TRL (and torch) to validate a spec.
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(fn.__call__)


def _named(reward: Callable, name: str) -> Callable:
    # TRL names each reward's metric after `__name__` (trl.trainer.utils.get_callable_name), so the wrapper carries
    # the spec's name; an async reward keeps an async wrapper so TRL still awaits it on its event loop.
    if _is_async(reward):

        async def named(*args, **kwargs):
            return await reward(*args, **kwargs)

    else:

        def named(*args, **kwargs):
            return reward(*args, **kwargs)

    named.__name__ = named.__qualname__ = name
    named.__doc__ = getattr(reward, "__doc__", None)
    named.__wrapped__ = reward
    return named


def guarded_reward(reward: Callable, name: str, timeout_s: float) -> Callable:
    """Training's wrapper of a built reward: each call runs with a timeout and its output is checked as in the dry
    run, so a reward that raises, hangs, or returns NaN, inf, a wrong count or a non-number stops training with a
    `RewardError` naming the reward and the step (TRL would train on NaN, or hang).

    Args:
        reward (`Callable`): a reward from `build_reward`.
        name (`str`): its spec name, for messages and TRL's metric.
        timeout_s (`float`): how long one call may take (the spec's `health.reward_timeout_s`).
    """

    def fail(problem: str, kwargs: dict, cause: BaseException | None = None) -> RewardError:
        state = kwargs.get("trainer_state")
        step = f" at training step {state.global_step + 1}" if state is not None else ""
        error = RewardError(f"reward {name!r} {problem}{step}")
        error.__cause__ = cause
        return error

    def check(values: Any, kwargs: dict) -> Any:
        if (problem := _check_output(values, len(kwargs.get("completions") or ()))) is not None:
            raise fail(problem, kwargs)
        return values

    if _is_async(reward):

        async def guarded(*args, **kwargs):
            try:
                values = await asyncio.wait_for(reward(*args, **kwargs), timeout_s)
            except TimeoutError as exc:
                raise fail(f"did not return within {timeout_s:g} s", kwargs) from exc
            except Exception as exc:
                raise fail(f"raised {type(exc).__name__}: {exc}", kwargs, exc) from exc
            return check(values, kwargs)

    else:

        def guarded(*args, **kwargs):
            outcome: dict[str, Any] = {}

            def call() -> None:
                try:
                    outcome["value"] = reward(*args, **kwargs)
                except BaseException as exc:  # sys.exit() in a reward too: reported, not a silent end
                    outcome["error"] = exc

            # A daemon thread, as in the dry run: a hung reward cannot be killed, and must not keep the child alive.
            thread = threading.Thread(target=call, name=f"reward-{name}", daemon=True)
            thread.start()
            thread.join(timeout_s)
            if thread.is_alive():
                raise fail(f"did not return within {timeout_s:g} s", kwargs)
            if "error" in outcome:
                exc = outcome["error"]
                raise fail(f"raised {type(exc).__name__}: {exc}", kwargs, exc)
            return check(outcome["value"], kwargs)

    guarded.__name__ = guarded.__qualname__ = name
    guarded.__wrapped__ = reward
    return guarded


# TRL passes these to every reward; any other parameter without a default is a dataset column.
_TRL_ARGUMENTS = {
    "completions",
    "prompts",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
}


def reward_columns(reward: Callable) -> list[str]:
    """The dataset columns a reward needs: its parameters without defaults that TRL does not supply itself.

    >>> reward_columns(exact_answer_reward)
    ['answer']
    """
    try:
        parameters = inspect.signature(reward).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name
        for p in parameters
        if p.kind in kinds and p.default is inspect.Parameter.empty and p.name not in _TRL_ARGUMENTS
    ]


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
        for row, row_number in zip(sample, indices, strict=True):
            problem = _check_reward_on_row(reward, row, prompt_column, timeout_s)
            if problem is not None:
                explained = _explain(reward, row, prompt_column, timeout_s, problem)
                problems.append(f"reward {name!r} {problem} on dataset row {row_number}{explained}")
                break  # one problem per reward is enough to act on; a hung reward would also cost timeout_s per row
    if len(problems) == 1:
        raise RewardError(problems[0], problems)
    if problems:
        raise RewardError(f"{len(problems)} reward problems:\n" + "\n".join(f"- {p}" for p in problems), problems)


def call_reward(reward: Callable, prompts: list, completions: list, completion_ids: list, columns: dict) -> Any:
    """Calls `reward` with what TRL's GRPOTrainer passes it, outside a trainer, and awaits an `async def` reward.

    Args:
        reward (`Callable`): a reward with TRL's signature.
        prompts (`list`), completions (`list`), completion_ids (`list[list[int]]`): one entry per completion.
        columns (`dict[str, list]`): the other dataset columns, one value per completion (TRL leaves out the prompt,
            `completion` and `completion_ids`; see `trl_columns`).

    Returns:
        What the reward returned: a list with one float (or None) per completion, unless it is broken.
    """
    result = reward(
        prompts=prompts,
        completions=completions,
        completion_ids=completion_ids,
        trainer_state=None,  # no trainer outside training
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
        **columns,
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

    # A daemon thread, because a hung reward cannot be killed and must not keep the process alive at exit.
    thread = threading.Thread(target=call, name="reward-dry-run", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return f"did not return within {timeout_s:g} s"
    if "error" in outcome:
        exc = outcome["error"]
        return f"raised {type(exc).__name__}: {exc}"
    return _check_output(outcome["value"], len(completions))


def _check_output(values: Any, expected: int) -> str | None:
    if not isinstance(values, list | tuple):
        return f"returned {type(values).__name__}, expected a list with one float (or None) per completion"
    if len(values) != expected:
        return f"returned {len(values)} values for {expected} completions"
    for i, value in enumerate(values):
        if value is None:
            continue
        if not isinstance(value, numbers.Real):
            return f"returned {type(value).__name__} {value!r} at position {i}, expected a float or None"
        if math.isnan(value):
            return f"returned NaN at position {i} (return None for 'does not apply')"
        if math.isinf(value):
            return f"returned {value} at position {i}, expected a finite number"
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
    from grpoflow.trainers.modeling import prepare_prompts

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
