"""Building a spec's rewards (`build_reward`: a built-in, a function, a reward model) and guarding each call."""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import inspect
import math
import numbers
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from grpoflow.trainers.rewards import TRL_ARGUMENTS, RewardError
from grpoflow.trainers.rewards.builtin import REWARDS
from grpoflow.trainers.rewards.models import get_reward_model_reward, reward_model_problem

# --- building a spec's rewards ---------------------------------------------------------------------------------------


def build_reward(
    name: str,
    function: str | None = None,
    kwargs: dict | None = None,
    model: str | None = None,
    grader: dict | None = None,
    prompt_column: str = "prompt",
) -> Callable:
    """Build the reward a spec entry describes, named `name` so TRL logs it as `rewards/<name>/mean`.

    Without `function`, `name` picks a built-in from `REWARDS`; factories (`get_*_reward`) are called with `kwargs`.
    With `function` ("package.module:callable", importable from the working directory too), the callable is the
    reward itself, or, when `kwargs` is non-empty, a factory called as `callable(**kwargs)` that returns the reward.
    With `model`, the reward is that sequence-classification model's score (see `get_reward_model_reward`); training
    hands the model id to TRL instead, which loads it as this does and places it on the GPU. With `grader`, the reward
    scores with that OpenAI grader object (see `grpoflow.trainers.graders.reward.get_grader_reward`).

    Args:
        name (`str`): the spec entry's name.
        function (`str` or `None`, *optional*, defaults to `None`): where a custom reward lives.
        kwargs (`dict` or `None`, *optional*, defaults to `None`): arguments for a factory.
        model (`str` or `None`, *optional*, defaults to `None`): a reward model's folder or Hub id.
        grader (`dict` or `None`, *optional*, defaults to `None`): an OpenAI grader object.
        prompt_column (`str`, *optional*, defaults to `"prompt"`): the dataset's prompt column (a grader's `item`
            holds the prompt under that name).

    Raises:
        RewardError: unknown built-in, import failure, bad kwargs, or something that is not callable.

    A built-in is picked by its name, so to use one twice (say, two length penalties) under other names, point
    `function` at its factory: `function: grpoflow.trainers.rewards.builtin:get_length_penalty_reward` with `kwargs`.

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
    if grader is not None:
        reward = _build_grader(name, grader, kwargs or {}, prompt_column)
    elif model is not None:
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
    """A `function:` reward. Only two shapes are ever called: a reward (TRL's signature: a `completions` parameter),
    called by training, and a `get_*` factory, called here with `kwargs` (none: its defaults), which must return
    one. Anything else (`os:system`, a class, a factory not named get_*) is refused before any call."""
    target = _import_callable(name, function)
    factory = function.rpartition(":")[2].startswith("get_")
    # A spec entry always carries `kwargs` ({} by default).
    if not factory:
        if kwargs:
            raise RewardError(
                f"reward {name!r}: kwargs are for a factory (named get_*, returning the reward); {function!r} is not "
                "one (drop kwargs, or point function at the get_* factory)"
            )
        return _reward_shaped(name, target, function)
    reward = _call_factory(name, target, kwargs or {}, function)
    if not callable(reward):
        raise RewardError(
            f"reward {name!r}: {function!r} is called as a factory and must return the reward function, but it "
            f"returned {type(reward).__name__}"
        )
    return _reward_shaped(name, reward, f"what {function} returned")


def _reward_shaped(name: str, reward: Callable, what: str) -> Callable:
    """`reward` when it takes TRL's `completions` argument by name; else a `RewardError` (a bare **kwargs would let
    any such library function pass for a reward)."""
    try:
        parameters = inspect.signature(reward).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a C function)
        parameters = []
    if any(p.name == "completions" and p.kind is not inspect.Parameter.POSITIONAL_ONLY for p in parameters):
        return reward
    raise RewardError(
        f"reward {name!r}: {what!r} is not a reward function: TRL calls a reward with keyword arguments "
        "(completions=..., prompts=..., and the dataset's columns), so it must take `completions` (def "
        "reward(completions, **kwargs)); a get_* factory returning one may be named instead"
    )


def _build_grader(name: str, grader: dict, kwargs: dict, prompt_column: str) -> Callable:
    from grpoflow.trainers.graders.reward import get_grader_reward

    try:
        return get_grader_reward(grader, prompt_column, **kwargs)
    except ValueError as exc:
        raise RewardError(f"reward {name!r}: {exc}") from exc


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
        raise RewardError(f"reward {name!r}: cannot import {function!r}: {exc}{_moved(module_name, attr)}") from exc
    target = getattr(module, attr, None)
    if target is None:
        raise RewardError(
            f"reward {name!r}: cannot import {function!r}: module {module_name!r} has no {attr!r}"
            + _moved(module_name, attr)
        )
    if not callable(target):
        raise RewardError(f"reward {name!r}: {function!r} is a {type(target).__name__}, not a function")
    return target


# Where grpoflow's public rewards were before they moved: a spec naming a former path is refused with the new one.
# trainers/rewards.py became the package trainers/rewards/ and the judge moved into it (2026-12-02 and -04); before
# the one import root (2026-12-02) the layers were top-level names (`trainers.rewards:exact_answer_reward`).
FORMER_MODULES = {
    "trainers.rewards": (
        "grpoflow.trainers.rewards.builtin",
        "grpoflow.trainers.rewards.models",
        "grpoflow.trainers.rewards.judge",
    ),
    "trainers.judge": ("grpoflow.trainers.rewards.judge",),
}
_LAYERS = ("trainers", "examples")


def _moved(module_name: str, attr: str) -> str:
    """The end of the message for a former path of one of grpoflow's rewards, naming the new path; else ""."""
    former = module_name.removeprefix("grpoflow.")
    if former.split(".")[0] not in _LAYERS:
        return ""
    for candidate in FORMER_MODULES.get(former, (f"grpoflow.{former}",)):
        try:
            found = hasattr(importlib.import_module(candidate), attr)
        except Exception:  # not a module of grpoflow's
            continue
        if found:
            return f"; grpoflow's reward moved: name {candidate}:{attr}"
    return ""


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


def own_copies(kwargs: dict) -> dict:
    """A reward's keyword arguments with every list (completions, prompts, completion_ids, the dataset's columns) its
    own deep copy: TRL hands every reward the same lists, and a reward that changed them in place (stripping each
    completion, say) would change what every reward after it scores."""
    return {key: _own_copy(value) if isinstance(value, list) else value for key, value in kwargs.items()}


_IMMUTABLE = (str, int, float, bool, type(None))


def _own_copy(values: list) -> list:
    """A deep copy of `values`, made without `copy.deepcopy` for the common shapes: a list of strings or numbers
    (completions, text prompts, a column) and a list of such lists (completion_ids), which deepcopy walked one item at
    a time (0.15 ms a call for 16 short completions; most of a reward's call)."""
    if all(isinstance(v, _IMMUTABLE) for v in values):
        return values.copy()
    if all(type(v) is list and all(isinstance(x, _IMMUTABLE) for x in v) for v in values):
        return [v.copy() for v in values]
    return copy.deepcopy(values)


class _Raised(NamedTuple):
    error: BaseException


class _RewardWorker:
    """One daemon thread that runs a reward's calls one at a time, so that each call can time out without a thread
    started per call (a tenth of a millisecond of CPU each step, more in waiting). A daemon, as in the dry run: a hung
    reward cannot be killed, and must not keep the child alive. The thread ends once the worker is dropped."""

    def __init__(self, name: str):
        self.pid = os.getpid()  # a forked child has the worker but not its thread: it starts its own
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # one call at a time, so that no call's timeout counts another's
        threading.Thread(target=self._serve, args=(self._calls,), name=f"reward-{name}", daemon=True).start()
        weakref.finalize(self, self._calls.put, None)

    @staticmethod
    def _serve(calls: queue.SimpleQueue) -> None:
        # Each call is answered in a frame of its own, so that nothing of it stays referenced while the thread waits
        # for the next: a daemon thread's references outlive the interpreter's shutdown, and a reward's module kept
        # alive that way never flushes a file it writes to (a user's `LOG = open(...)`, written per call).
        while _RewardWorker._answer(calls.get()):
            pass

    @staticmethod
    def _answer(item: tuple[Callable[[], Any], queue.SimpleQueue] | None) -> bool:
        """Runs one call and puts its value, or `_Raised`, on its answer queue; False for the end (`None`)."""
        if item is None:
            return False
        call, answer = item
        try:
            answer.put(call())
        except BaseException as exc:  # sys.exit() in a reward too: reported, not a silent end
            answer.put(_Raised(exc))
        return True

    def run(self, call: Callable[[], Any], timeout_s: float) -> Any:
        """`call()`'s value, or `_Raised` with what it raised; `TimeoutError` when it takes over `timeout_s`."""
        with self._lock:
            answer: queue.SimpleQueue = queue.SimpleQueue()
            self._calls.put((call, answer))
            try:
                return answer.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError from None


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
        if (problem := check_output(values, len(kwargs.get("completions") or ()))) is not None:
            raise fail(problem, kwargs)
        return values

    if _is_async(reward):

        async def guarded(*args, **kwargs):
            try:
                values = await asyncio.wait_for(reward(*args, **own_copies(kwargs)), timeout_s)
            except TimeoutError as exc:
                raise fail(f"did not return within {timeout_s:g} s", kwargs) from exc
            except Exception as exc:
                raise fail(f"raised {type(exc).__name__}: {exc}", kwargs, exc) from exc
            return check(values, kwargs)

    else:
        worker: list[_RewardWorker] = []

        def guarded(*args, **kwargs):
            if not worker or worker[0].pid != os.getpid():
                worker[:] = [_RewardWorker(name)]
            try:
                outcome = worker[0].run(lambda: reward(*args, **own_copies(kwargs)), timeout_s)
            except TimeoutError as exc:
                worker.clear()  # its thread is stuck in the hung call: a later call gets a fresh one
                raise fail(f"did not return within {timeout_s:g} s", kwargs) from exc
            if isinstance(outcome, _Raised):
                exc = outcome.error
                raise fail(f"raised {type(exc).__name__}: {exc}", kwargs, exc)
            return check(outcome, kwargs)

    guarded.__name__ = guarded.__qualname__ = name
    guarded.__wrapped__ = reward
    return guarded


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
        if p.kind in kinds and p.default is inspect.Parameter.empty and p.name not in TRL_ARGUMENTS
    ]


# TRL holds each step's rewards in a float32 tensor: a larger magnitude becomes inf there, and the advantages NaN.
FLOAT32_MAX = 3.4028234663852886e38


def check_output(values: Any, expected: int) -> str | None:
    """What is wrong with a reward's output for `expected` completions (one finite number or None each), or None."""
    if not isinstance(values, list | tuple):
        return f"returned {type(values).__name__}, expected a list with one float (or None) per completion"
    if len(values) != expected:
        return f"returned {len(values)} values for {expected} completions"
    for i, value in enumerate(values):
        if value is None:
            continue
        if not isinstance(value, numbers.Real):
            return f"returned {type(value).__name__} {value!r} at position {i}, expected a float or None"
        try:
            number = float(value)
        except OverflowError:  # an int past even a double's range (10**400); not str(): huge ints refuse it
            size = f"{type(value).__name__} of magnitude about 10**{int(abs(int(value)).bit_length() * math.log10(2))}"
            return f"returned {size} at position {i}, beyond the float32 range TRL holds rewards in (about 3.4e38)"
        if math.isnan(number):
            return f"returned NaN at position {i} (return None for 'does not apply')"
        if math.isinf(number):
            return f"returned {value} at position {i}, expected a finite number"
        if abs(number) > FLOAT32_MAX:
            return f"returned {number:g} at position {i}, beyond the float32 range TRL holds rewards in (about 3.4e38)"
    return None
