"""Tests for trainers/rewards/ (built-ins, building, the reward guard, the dry run) and the example reward module:
rule tables per reward, building, dry run, doctests."""

import doctest
import importlib
import importlib.util
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from trl.trainer.utils import get_callable_name, is_async_callable

from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.builtin import (
    REWARDS,
    exact_answer_reward,
    get_answer_format_reward,
    get_length_penalty_reward,
    get_numeric_match_reward,
)
from grpoflow.trainers.rewards.dry_run import dry_run_rewards
from grpoflow.trainers.rewards.text import completion_text

ROOT = Path(__file__).resolve().parents[2]
# The built-ins that score without kwargs or a network; llm_judge needs an endpoint (tests/trainers/test_judge.py).
OFFLINE_BUILTINS = sorted(name for name in REWARDS if name != "llm_judge")


def chat(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture
def in_repo(monkeypatch):
    # Custom rewards are imported relative to the working directory, as `grpoflow run` does from the repo root.
    monkeypatch.chdir(ROOT)


# --- rule tables: one per reward -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("<answer>4</answer>", "4", 1.0),  # tagged and equal
        ("4", "4", 1.0),  # no tags: the whole completion is the answer
        ("  <answer> 4 </answer>\n", " 4", 1.0),  # both sides stripped
        ("<answer>4</answer>", 4, 1.0),  # an int column compares as its string
        ("<answer>5</answer>", "4", 0.0),  # wrong
        ("<answer>3</answer> no wait <answer>4</answer>", "4", 1.0),  # the last tagged answer counts
        ("The answer is 4", "4", 0.0),  # exact means exact: prose around the answer fails
        ("<answer>4.0</answer>", "4", 0.0),  # string compare, not numeric (numeric_match does that)
        ("", "4", 0.0),  # empty completion
        ("<answer>4</answer>", None, None),  # no answer in the row: the reward does not apply
    ],
)
def test_exact_answer_reward(completion, answer, expected):
    assert exact_answer_reward([completion], answer=[answer]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>4</answer>", 1.0),  # the canonical format
        ("\n<answer>4</answer>  \n", 1.0),  # surrounding whitespace is stripped first
        ("<answer>line one\nline two</answer>", 1.0),  # DOTALL: newlines inside the tags are fine
        ("<answer></answer>", 1.0),  # the default pattern does not judge content
        ("The answer is <answer>4</answer>", 0.0),  # text before the tags
        ("<answer>4</answer> because", 0.0),  # text after the tags: full match required
        ("<answer>4", 0.0),  # unclosed tag
        ("4", 0.0),  # no tags
    ],
)
def test_answer_format_reward(completion, expected):
    assert get_answer_format_reward()([completion]) == [expected]


@pytest.mark.parametrize(
    "pattern, completion, expected",
    [
        (r"<think>.*</think>\s*<answer>.*</answer>", "<think>2+2</think>\n<answer>4</answer>", 1.0),  # think format
        (r"<think>.*</think>\s*<answer>.*</answer>", "<answer>4</answer>", 0.0),  # missing the think block
        (r"\d+", "42", 1.0),  # a bare number
        (r"\d+", "42 apples", 0.0),  # fullmatch, not search
    ],
)
def test_answer_format_reward_pattern(pattern, completion, expected):
    assert get_answer_format_reward(pattern)([completion]) == [expected]


def test_answer_format_bad_pattern_names_it():
    with pytest.raises(ValueError, match=r"pattern '<answer>\(' is not a valid regular expression"):
        get_answer_format_reward("<answer>(")


@pytest.mark.parametrize(
    "length, max_chars, penalty, expected",
    [
        (0, 10, 1.0, 0.0),  # empty costs nothing
        (10, 10, 1.0, 0.0),  # exactly at the limit costs nothing
        (15, 10, 1.0, -0.5),  # halfway to twice the limit
        (20, 10, 1.0, -1.0),  # twice the limit: the full penalty
        (500, 10, 1.0, -1.0),  # beyond twice the limit: capped
        (15, 10, 0.2, -0.1),  # the penalty scales the slope
        (150, 100, 2.0, -1.0),  # defaults-like scale
    ],
)
def test_length_penalty_reward(length, max_chars, penalty, expected):
    (score,) = get_length_penalty_reward(max_chars=max_chars, penalty=penalty)(["x" * length])
    assert score == pytest.approx(expected)


def test_length_penalty_defaults():
    reward = get_length_penalty_reward()
    assert reward(["x" * 200, "x" * 300, "x" * 400]) == [0.0, -0.5, -1.0]  # max_chars=200, penalty=1.0


@pytest.mark.parametrize("kwargs", [{"max_chars": 0}, {"penalty": -1.0}])
def test_length_penalty_rejects_bad_params(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        get_length_penalty_reward(**kwargs)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("<answer>42</answer>", "42", 1.0),  # integers
        ("<answer>-3</answer>", "-3", 1.0),  # negative
        ("<answer>2.50</answer>", 2.5, 1.0),  # decimal against a float column
        ("<answer>1,234</answer>", "1234", 1.0),  # thousands separator in the completion
        ("<answer>1234</answer>", "1,234", 1.0),  # ... and in the answer column
        ("<answer>1,234,567</answer>", 1234567, 1.0),  # several separators
        ("<answer>1 + 2 = 3</answer>", "3", 1.0),  # the last number in the answer counts
        ("5-3 is 2", "2", 1.0),  # no tags: the last number of the whole completion; "-" between digits is minus
        ("<answer>x = -7</answer>", "-7", 1.0),  # a sign after a space is a sign
        ("<answer>1e3</answer>", "1000", 1.0),  # scientific notation
        ("<answer>0.1</answer>", 0.1000000001, 1.0),  # within rel_tol
        ("<answer>41</answer>", "42", 0.0),  # wrong
        ("<answer>3</answer>", "-3", 0.0),  # sign matters
        ("<answer>no idea</answer>", "42", 0.0),  # no number in the completion
        ("<answer>42</answer>", "forty-two", 0.0),  # no number in the answer column
        ("<answer>42</answer>", None, None),  # no answer in the row: the reward does not apply
    ],
)
def test_numeric_match_reward(completion, answer, expected):
    assert get_numeric_match_reward()([completion], answer=[answer]) == [expected]


def test_numeric_match_tolerance():
    # 10.4 vs 10 is 4% off: a 5% relative tolerance accepts it, the default does not.
    assert get_numeric_match_reward(rel_tol=0.05)(["10.4"], answer=["10"]) == [1.0]
    assert get_numeric_match_reward()(["10.4"], answer=["10"]) == [0.0]
    assert get_numeric_match_reward(abs_tol=0.5)(["10.4"], answer=["10"]) == [1.0]


def test_numeric_match_rejects_negative_tolerance():
    with pytest.raises(ValueError, match="rel_tol"):
        get_numeric_match_reward(rel_tol=-1)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("<answer>12</answer>", 12, 1.0),  # exact integer
        ("<answer>12</answer>", "12", 1.0),  # string column
        ("<answer>9</answer>", 12, 0.7),  # off by 3: partial credit
        ("<answer>13</answer>", 12, 0.9),  # off by 1 above
        ("<answer>22</answer>", 12, 0.0),  # off by 10: nothing
        ("<answer>-100</answer>", 12, 0.0),  # far off: floored at 0, never negative
        ("<answer>12.5</answer>", 12, 0.95),  # not an integer: near miss, not exact
        ("<answer>?</answer>", 12, 0.0),  # unparseable
    ],
)
def test_close_answer_reward(in_repo, completion, answer, expected):
    close_answer_reward = build_reward("close", function="grpoflow.examples.rewards.arithmetic:close_answer_reward")
    assert close_answer_reward([completion], answer=[answer]) == [pytest.approx(expected)]


# --- conversational completions --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("plain", "plain"),  # a string is its own text
        (chat("from chat"), "from chat"),  # one assistant message
        (
            [{"role": "assistant", "content": "call"}, {"role": "tool", "content": "r"}, *chat("final")],
            "final",
        ),  # tools
        ([], ""),  # nothing generated
        (chat(None), ""),  # a tool-call message without content
        ([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "ab"),
    ],
)
def test_completion_text(completion, expected):
    assert completion_text(completion) == expected


@pytest.mark.parametrize("name", OFFLINE_BUILTINS)
def test_builtins_score_chat_completions_like_strings(name):
    texts = ["<answer>4</answer>", "4", "<answer>5</answer>", "x" * 450]
    reward = build_reward(name)
    assert reward([chat(t) for t in texts], answer=["4"] * 4) == reward(texts, answer=["4"] * 4)


# --- build_reward ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OFFLINE_BUILTINS)
def test_build_builtin_metric_is_named_after_the_spec(name):
    reward = build_reward(name)
    # TRL logs `rewards/<get_callable_name(func)>/mean`.
    assert f"rewards/{get_callable_name(reward)}/mean" == f"rewards/{name}/mean"
    assert isinstance(reward(["<answer>1</answer>"], answer=["1"])[0], float)


def test_build_builtin_factory_takes_kwargs():
    reward = build_reward("length_penalty", kwargs={"max_chars": 5, "penalty": 2.0})
    assert reward(["x" * 10]) == [-2.0]


def test_builtin_factories_keep_stable_names():
    assert get_answer_format_reward().__name__ == "answer_format_reward"
    assert get_length_penalty_reward().__name__ == "length_penalty_reward"
    assert get_numeric_match_reward().__name__ == "numeric_match_reward"


def test_build_custom_reward(in_repo):
    reward = build_reward("close", function="grpoflow.examples.rewards.arithmetic:close_answer_reward")
    assert get_callable_name(reward) == "close"
    assert reward(["<answer>11</answer>"], answer=[12]) == [pytest.approx(0.9)]


def test_build_custom_with_kwargs_calls_it_as_a_factory():
    # The way to use a built-in twice under different names.
    reward = build_reward(
        "long", function="grpoflow.trainers.rewards.builtin:get_length_penalty_reward", kwargs={"max_chars": 1}
    )
    assert get_callable_name(reward) == "long"
    assert reward(["ab"]) == [-1.0]


def test_build_custom_from_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_cwd_rewards.py").write_text(
        "def one_reward(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    reward = build_reward("one", function="my_cwd_rewards:one_reward")
    assert reward(["a", "b"]) == [1.0, 1.0]


def test_build_custom_async_stays_async(tmp_path, monkeypatch):
    source = "async def judge_reward(completions, **kwargs):\n    return [0.5] * len(completions)\n"
    (tmp_path / "my_async_rewards.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    reward = build_reward("judge", function="my_async_rewards:judge_reward")
    # TRL runs async rewards on its event loop only if it recognises them as async.
    assert is_async_callable(reward)
    dry_run_rewards([("judge", reward)], [{"prompt": "p"}], "prompt")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        # a module that does not exist
        (
            {"function": "pkg.mod:fn"},
            "reward 'my_reward': cannot import 'pkg.mod:fn': No module named 'pkg'",
        ),
        # the module exists, the attribute does not
        (
            {"function": "grpoflow.trainers.rewards:no_such_reward"},
            "reward 'my_reward': cannot import 'grpoflow.trainers.rewards:no_such_reward': "
            "module 'grpoflow.trainers.rewards' has no "
            "'no_such_reward'",
        ),
        # a dotted path instead of module:callable
        (
            {"function": "grpoflow.trainers.rewards.exact_answer_reward"},
            "reward 'my_reward': function 'grpoflow.trainers.rewards.exact_answer_reward' must look like "
            "'package.module:callable'",
        ),
        # not callable
        (
            {"function": "grpoflow.trainers.rewards:DRY_RUN_ROWS"},
            "reward 'my_reward': 'grpoflow.trainers.rewards:DRY_RUN_ROWS' is a int, not a function",
        ),
        # kwargs are for a get_* factory, and a reward function is not one
        (
            {"function": "grpoflow.trainers.rewards.builtin:exact_answer_reward", "kwargs": {"x": 1}},
            "reward 'my_reward': kwargs are for a factory (named get_*, returning the reward); "
            "'grpoflow.trainers.rewards.builtin:exact_answer_reward' is not one",
        ),
        # a factory's kwargs it does not take
        (
            {"function": "grpoflow.trainers.rewards.builtin:get_length_penalty_reward", "kwargs": {"x": 1}},
            "reward 'my_reward': bad kwargs for grpoflow.trainers.rewards.builtin:get_length_penalty_reward: ",
        ),
        # an unknown built-in: the message lists every built-in
        (
            {},
            "reward 'my_reward': unknown built-in; choose one of: answer_format, exact_answer, length_penalty, "
            "llm_judge, numeric_match",
        ),
    ],
)
def test_build_reward_errors(kwargs, message):
    with pytest.raises(RewardError) as caught:
        build_reward("my_reward", **kwargs)
    assert str(caught.value).startswith(message)


CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "function, new",
    [
        # trainers/rewards.py, before it became the package trainers/rewards/
        ("grpoflow.trainers.rewards:exact_answer_reward", "grpoflow.trainers.rewards.builtin:exact_answer_reward"),
        (
            "grpoflow.trainers.rewards:get_reward_model_reward",
            "grpoflow.trainers.rewards.models:get_reward_model_reward",
        ),
        # the judge, before it moved among the rewards
        ("grpoflow.trainers.judge:get_llm_judge_reward", "grpoflow.trainers.rewards.judge:get_llm_judge_reward"),
        # the layers as top-level names, before the one import root
        ("trainers.rewards:get_numeric_match_reward", "grpoflow.trainers.rewards.builtin:get_numeric_match_reward"),
        (
            "examples.rewards.arithmetic:close_answer_reward",
            "grpoflow.examples.rewards.arithmetic:close_answer_reward",
        ),
    ],
)
def test_a_former_path_of_a_reward_is_refused_naming_the_new_one(function, new, tmp_path, monkeypatch):
    # From a user's folder, where the checkout's folders are no top-level names (as for an installed grpoflow).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if Path(p or ".").resolve() != CHECKOUT])
    with pytest.raises(RewardError, match="cannot import") as caught:
        build_reward("mine", function=function)
    assert str(caught.value).endswith(f"; grpoflow's reward moved: name {new}")
    module, _, attr = new.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))  # the path named is the reward


def test_unknown_builtin_lists_the_registry(monkeypatch):
    # The list is built from REWARDS, so a new built-in appears in it without editing the message.
    monkeypatch.setitem(REWARDS, "zeta", exact_answer_reward)
    with pytest.raises(RewardError, match="numeric_match, zeta"):
        build_reward("nope")


@pytest.mark.parametrize(
    "name, kwargs, fragment",
    [
        ("length_penalty", {"max_char": 5}, "unexpected keyword argument 'max_char'"),  # misspelt argument
        ("answer_format", {"pattern": "("}, "pattern '(' is not a valid regular expression"),  # bad value
        ("length_penalty", {"max_chars": 0}, "max_chars must be >= 1"),  # out of range
        ("exact_answer", {"strict": True}, "takes no kwargs, got: strict"),  # a plain built-in takes none
    ],
)
def test_build_builtin_bad_kwargs(name, kwargs, fragment):
    with pytest.raises(RewardError, match=f"^reward '{name}': ") as caught:
        build_reward(name, kwargs=kwargs)
    assert fragment in str(caught.value)


def test_reward_error_is_a_value_error():
    # Callers that map ValueError to "rejected spec" (exit code 2) catch it without knowing this module.
    assert issubclass(RewardError, ValueError)


# --- dry_run_rewards -------------------------------------------------------------------------------------------------

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "level": i} for i in range(6)]


def raising_reward(completions, answer, **kwargs):
    if answer[0] == "6":
        raise ValueError("bad answer format")
    return [0.0] * len(completions)


def short_reward(completions, **kwargs):
    return [0.0, 1.0]


def string_reward(completions, **kwargs):
    return ["1.0"] * len(completions)


def nan_reward(completions, **kwargs):
    return [math.nan] * len(completions)


def inf_reward(completions, **kwargs):
    return [math.inf] * len(completions)


def huge_int_reward(completions, **kwargs):
    return [1.0, 10**400] + [0.0] * (len(completions) - 2)


def past_float32_reward(completions, **kwargs):
    return [-1e39] * len(completions)


def scalar_reward(completions, **kwargs):
    return 1.0


def test_dry_run_passes_builtins_and_example(in_repo):
    built = [(name, build_reward(name)) for name in OFFLINE_BUILTINS]
    built.append(("close", build_reward("close", function="grpoflow.examples.rewards.arithmetic:close_answer_reward")))
    assert dry_run_rewards(built, ROWS, "prompt") is None


def test_dry_run_accepts_none_ints_and_bools():
    mixed = lambda completions, **kwargs: [None, 1, True, 0.5] + [0.0] * (len(completions) - 4)
    assert dry_run_rewards([("mixed", mixed)], ROWS, "prompt") is None


@pytest.mark.parametrize(
    "reward, message",
    [
        (raising_reward, "reward 'r' raised ValueError: bad answer format on dataset row 13"),  # third row: answer "6"
        (short_reward, "reward 'r' returned 2 values for 4 completions on dataset row 10"),  # one value per completion
        (string_reward, "reward 'r' returned str '1.0' at position 0, expected a float or None on dataset row 10"),
        (nan_reward, "reward 'r' returned NaN at position 0 (return None for 'does not apply') on dataset row 10"),
        (inf_reward, "reward 'r' returned inf at position 0, expected a finite number on dataset row 10"),
        # an int no float holds made the check itself raise OverflowError
        (huge_int_reward, "reward 'r' returned int of magnitude about 10**400 at position 1, beyond the float32"),
        # a double, but inf in the float32 tensor TRL keeps rewards in
        (past_float32_reward, "reward 'r' returned -1e+39 at position 0, beyond the float32 range TRL holds rewards"),
        (scalar_reward, "reward 'r' returned float, expected a list with one float (or None) per completion"),
    ],
)
def test_dry_run_catches(reward, message):
    with pytest.raises(RewardError) as caught:
        dry_run_rewards([("r", reward)], ROWS, "prompt", row_numbers=[10, 11, 12, 13, 14, 15])
    assert str(caught.value).startswith(message)
    assert caught.value.problems == [str(caught.value)]


def test_dry_run_row_defaults_to_position():
    with pytest.raises(RewardError, match="on dataset row 3 "):
        dry_run_rewards([("r", raising_reward)], ROWS, "prompt")


def test_dry_run_catches_a_hang():
    calls, release = [], threading.Event()

    def hanging_reward(completions, **kwargs):
        calls.append(len(completions))
        release.wait()  # hangs until the test ends
        return [0.0] * len(completions)

    try:
        with pytest.raises(RewardError, match=r"^reward 'slow' did not return within 0.5 s on dataset row 0$"):
            dry_run_rewards([("slow", hanging_reward)], ROWS, "prompt", timeout_s=0.5)
    finally:
        release.set()
    # It gives up after the first row rather than waiting out every row: one call, not one per row.
    assert len(calls) == 1


def test_dry_run_reports_every_broken_reward():
    good = build_reward("exact_answer")
    with pytest.raises(RewardError) as caught:
        dry_run_rewards([("a", short_reward), ("exact_answer", good), ("b", nan_reward)], ROWS, "prompt")
    problems = caught.value.problems
    assert [p.split("'")[1] for p in problems] == ["a", "b"]
    assert str(caught.value).startswith("2 reward problems:\n- reward 'a' returned 2 values")


def test_dry_run_calls_like_trl():
    seen = {}

    def spy_reward(completions, **kwargs):
        seen.update(kwargs, completions=completions)
        return [0.0] * len(completions)

    rows = [{"question": "2+2?", "answer": "4", "level": 1, "completion": "<answer>4</answer>"}]
    dry_run_rewards([("spy", spy_reward)], rows, "question")
    # Every column but the prompt and TRL's reserved ones, repeated per completion, plus TRL's extras.
    assert sorted(seen) == sorted(
        ["prompts", "completions", "completion_ids", "answer", "level", "trainer_state", "log_extra", "log_metric"]
    )
    n = len(seen["completions"])
    assert seen["prompts"] == ["2+2?"] * n and seen["answer"] == ["4"] * n and seen["level"] == [1] * n
    assert "<answer>4</answer>" in seen["completions"] and "4" in seen["completions"]
    assert len(seen["completion_ids"]) == n and all(isinstance(ids, list) for ids in seen["completion_ids"])


def test_dry_run_conversational_prompts_get_chat_completions():
    seen = []

    def spy_reward(completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    dry_run_rewards([("spy", spy_reward)], rows, "prompt")
    assert seen and all(c[0]["role"] == "assistant" for c in seen)
    assert chat("<answer>4</answer>") in seen


def test_dry_run_catches_a_reward_that_ignores_chat_format():
    upper_reward = lambda completions, **kwargs: [float(c.isupper()) for c in completions]  # assumes strings
    rows = [{"prompt": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(RewardError, match="^reward 'upper' raised AttributeError: 'list' object has no attribute"):
        dry_run_rewards([("upper", upper_reward)], rows, "prompt")


def test_dry_run_catches_a_missing_column():
    # exact_answer needs an `answer` column; a dataset without one fails before training, naming the reward.
    with pytest.raises(RewardError, match="^reward 'exact_answer' raised TypeError: .*'answer'"):
        dry_run_rewards([("exact_answer", build_reward("exact_answer"))], [{"prompt": "hi"}], "prompt")


# --- what a failing reward was given, and what to change (a rule table: reward, prompts -> the message's end)


def chat_rows(rows):
    return [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]


@pytest.mark.parametrize(
    "reward, rows, expected",
    [
        # TRL's think_format_reward reads completion[0]["content"]: on strings, a bare IndexError.
        (
            "trl.rewards:think_format_reward",
            ROWS,
            "reward 'r' raised IndexError: string index out of range on dataset row 0 (given string completions; "
            "columns: answer, level); this reward expects chat completions (lists of messages): give chat prompts "
            "(a list of {role, content}) or set hyperparameters.system_prompt",
        ),
        # A reward written for strings, given chats.
        (
            "tests.bad_inputs.rewards.strings_only:upper_reward",
            chat_rows(ROWS),
            "(given chat completions (lists of messages); columns: answer, level); this reward expects string "
            "completions: give string prompts, without a system_prompt",
        ),
        # Broken on either shape: what it was given, and no advice that would not help.
        (
            "tests.trainers.test_rewards:raising_reward",
            ROWS[3:],
            "reward 'r' raised ValueError: bad answer format on dataset row 0 (given string completions; columns: "
            "answer, level)",
        ),
    ],
)
def test_dry_run_says_what_the_reward_was_given(in_repo, reward, rows, expected):
    with pytest.raises(RewardError) as caught:
        dry_run_rewards([("r", build_reward("r", function=reward))], rows, "prompt")
    assert str(caught.value).endswith(expected), str(caught.value)


def test_think_format_reward_passes_on_chat_prompts(in_repo):
    assert (
        dry_run_rewards(
            [("think", build_reward("think", function="trl.rewards:think_format_reward"))], chat_rows(ROWS), "prompt"
        )
        is None
    )


needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason="math-verify not installed: pip install 'grpoflow[math]'"
)


@needs_math_verify
def test_trl_accuracy_reward_with_the_math_extra(in_repo):
    # TRL's accuracy_reward reads a `solution` column and chat completions; the `math` extra installs math-verify.
    reward = build_reward("accuracy", function="trl.rewards:accuracy_reward")
    rows = [{"prompt": [{"role": "user", "content": "What is 1/3 + 1/3?"}], "solution": r"$\frac{2}{3}$"}] * 4
    assert dry_run_rewards([("accuracy", reward)], rows, "prompt") is None
    completions = [
        [{"role": "assistant", "content": r"So the sum is $\boxed{\frac{2}{3}}$"}],
        [{"role": "assistant", "content": r"So the sum is $\boxed{\frac{1}{2}}$"}],
    ]
    assert reward(completions, solution=[r"$\frac{2}{3}$"] * 2) == [1.0, 0.0]


# --- doctests --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module_name",
    ["grpoflow.trainers.rewards.builtin", "grpoflow.trainers.rewards.text", "grpoflow.examples.rewards.arithmetic"],
)
def test_doctests(module_name):
    results = doctest.testmod(importlib.import_module(module_name))
    assert results.attempted > 0 and results.failed == 0


def _overwrites(completions, answer, **kwargs):
    """A reward that rewrites the completions it is given, in place (and still scores)."""
    completions[:] = [str(a) for a in answer]
    return [0.0] * len(completions)


def test_each_reward_sees_its_own_copy_of_the_completions():
    from grpoflow.trainers.rewards.build import guarded_reward
    from grpoflow.trainers.rewards.dry_run import call_reward

    # TRL hands every reward the same lists; the in-place rewrite must not reach exact_answer after it.
    kwargs = {"prompts": ["1+1?", "2+2?"], "completions": ["3", "5"], "answer": ["2", "4"], "trainer_state": None}
    first = guarded_reward(_overwrites, "overwrites", timeout_s=10)
    second = guarded_reward(build_reward("exact_answer"), "exact_answer", timeout_s=10)
    assert first(**kwargs) == [0.0, 0.0] and second(**kwargs) == [0.0, 0.0]  # not 1.0: the completions are wrong
    assert kwargs["completions"] == ["3", "5"]
    columns = {"answer": ["2", "4"]}
    call_reward(_overwrites, ["1+1?", "2+2?"], kwargs["completions"], [[1], [2]], columns)  # the dry run's call
    assert kwargs["completions"] == ["3", "5"]


def test_own_copies_copy_every_level_a_reward_could_change():
    from grpoflow.trainers.rewards.build import own_copies

    chat = [[{"role": "assistant", "content": "4"}]]
    kwargs = {"completions": ["4"], "completion_ids": [[7, 8]], "chat": chat, "trainer_state": None}
    copied = own_copies(kwargs)
    copied["completions"][0] = "x"
    copied["completion_ids"][0].append(9)  # a list of token lists: each inner list is the reward's own
    copied["chat"][0][0]["content"] = "x"  # anything else: deep-copied
    assert kwargs == {"completions": ["4"], "completion_ids": [[7, 8]], "chat": chat, "trainer_state": None}
    assert chat == [[{"role": "assistant", "content": "4"}]]


def test_a_guarded_reward_runs_on_one_daemon_thread_that_a_hang_replaces_and_dropping_it_ends():
    import gc
    import time

    from grpoflow.trainers.rewards.build import guarded_reward

    release = threading.Event()
    seen: list[threading.Thread] = []

    def slow_once(completions, **kwargs):
        seen.append(threading.current_thread())
        if len(seen) == 2:
            release.wait(10)  # the second call hangs past the timeout
        return [1.0] * len(completions)

    guarded = guarded_reward(slow_once, "slow_once", timeout_s=0.5)
    kwargs = {"completions": ["a"], "trainer_state": None}
    assert guarded(**kwargs) == [1.0]
    with pytest.raises(RewardError, match="did not return within 0.5 s"):
        guarded(**kwargs)
    release.set()
    assert guarded(**kwargs) == [1.0]  # a fresh thread: the hung one is not waited on
    assert seen[0] is seen[1] and seen[2] is not seen[0]  # one thread for the calls, not one per call
    assert all(t.daemon and t.name == "reward-slow_once" for t in seen)
    del guarded
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in seen)


def test_the_worker_thread_keeps_nothing_of_a_call_it_answered():
    # What a daemon thread references outlives the interpreter's shutdown: a reward whose call stayed referenced
    # there kept its module alive, and a file that module wrote to was never flushed (`LOG = open(...)` in a user's
    # tasks.py lost every line written in training). The call's arguments must be freed once it is answered.
    import gc
    import time
    import weakref

    from grpoflow.trainers.rewards.build import guarded_reward

    class State:
        global_step = 0

    guarded = guarded_reward(lambda completions, **kwargs: [1.0] * len(completions), "kept", timeout_s=5)
    state = State()
    freed = weakref.ref(state)
    assert guarded(completions=["a"], trainer_state=state) == [1.0]
    del state
    deadline = time.monotonic() + 5
    while freed() is not None and time.monotonic() < deadline:  # the thread may still be leaving the call's frame
        gc.collect()
        time.sleep(0.01)
    assert freed() is None, gc.get_referrers(freed())
    assert guarded(completions=["b"], trainer_state=None) == [1.0]  # the same worker answers the next call


def test_a_rewards_unflushed_writes_survive_the_process_end(tmp_path):
    # A user's reward module writing each call to a file it never flushes: Python flushes it at the interpreter's
    # end, as long as nothing a daemon thread holds keeps the module alive (every line was lost before).
    (tmp_path / "user_reward.py").write_text(
        f"LOG = open({str(tmp_path / 'calls.log')!r}, 'a')\n\n\n"
        "def my_reward(completions, trainer_state=None, **kwargs):\n"
        "    LOG.write('training\\n')\n"
        "    return [0.0] * len(completions)\n"
    )
    script = (
        "import user_reward\n"
        "from grpoflow.trainers.rewards.build import guarded_reward\n"
        "guarded = guarded_reward(user_reward.my_reward, 'my_reward', 5)\n"
        "for _ in range(3):\n"
        "    guarded(completions=['a'], trainer_state=object())\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, timeout=120)
    assert (tmp_path / "calls.log").read_text() == "training\n" * 3


def test_a_guarded_reward_called_in_a_forked_child_starts_its_own_thread():
    import multiprocessing

    from grpoflow.trainers.rewards.build import guarded_reward

    guarded = guarded_reward(lambda completions, **kwargs: [2.0] * len(completions), "twice", timeout_s=5)
    assert guarded(completions=["a"], trainer_state=None) == [2.0]  # the parent's worker thread is running
    context = multiprocessing.get_context("fork")
    answers = context.SimpleQueue()
    # The forked child has the worker, not its thread: without one of its own the call would time out.
    child = context.Process(target=lambda: answers.put(guarded(completions=["a", "b"], trainer_state=None)))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and answers.get() == [2.0, 2.0]


def test_the_spec_knows_the_built_in_rewards_by_their_names():
    from grpoflow.core.catalog import BUILTIN_REWARDS
    from grpoflow.trainers.rewards.builtin import REWARDS

    assert sorted(REWARDS) == sorted(BUILTIN_REWARDS)
