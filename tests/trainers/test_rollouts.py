"""The rollouts a job keeps (`grpoflow.trainers.rollouts`): the rows of a step as TRL scored them, the degenerate
output rule, the files' exactly-once rule on resume, and the reads behind the CLI, the artifacts and the report.

A real run's files are checked by `check_rollouts`, called from the real-training tests of tests/trainers/test_grpo.py
(and `same_rollouts` from its SIGKILL-and-resume test), which train builtin:tiny anyway."""

import asyncio
import doctest
import json
import math

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.trainers import rollouts
from grpoflow.trainers.rollouts import (
    DEGENERATE_KEY,
    CompletionProbe,
    degenerate,
    degenerate_example,
    highlights,
    kept_steps,
    read_rows,
    rollout_columns,
    side_by_side,
    step_file,
    truncate_rollouts,
    write_held_out,
    write_rows,
)


def _mean(values) -> float:
    return sum(values) / len(values)


def check_rollouts(job: JobDir, spec, records: list[dict]) -> None:
    """What a user reading a real run's rollouts/ and evaluation/ must find: one row per completion of each kept
    step, each row's total the weighted sum of its rewards, each group's advantages summing to zero, each step's
    means equal to what metrics.jsonl logged; and each held-out evaluation's completions with the scores
    evaluation.json averaged."""
    hp, k = spec.hyperparameters, spec.hyperparameters.rollouts_per_prompt
    names, weights = [r.name for r in spec.rewards], [r.weight for r in spec.rewards]
    values = {r["step"]: r["values"] for r in records}
    steps = [s for s, v in values.items() if "reward" in v and s % spec.rollouts.every == 0]
    assert steps and kept_steps(job.rollouts) == steps
    for step in steps:
        rows, logged = read_rows(step_file(job.rollouts, step)), values[step]
        assert list(rows[0]) == [
            *("step", "group", "prompt", "completion", "reward"),
            *(f"rewards.{n}" for n in names),
            *("advantage", "completion_tokens", "truncated"),
        ]
        assert len(rows) == k * hp.prompts_per_step
        assert [(r["step"], r["group"]) for r in rows] == [(step, i // k) for i in range(len(rows))]
        for row in rows:
            scores = [(row[f"rewards.{n}"], w) for n, w in zip(names, weights, strict=True)]
            assert row["reward"] == pytest.approx(sum(s * w for s, w in scores if s is not None))
        for g in range(hp.prompts_per_step):
            group = rows[g * k : (g + 1) * k]
            assert len({r["prompt"] for r in group}) == 1  # a group: one prompt's completions
            assert sum(r["advantage"] for r in group) == pytest.approx(0, abs=1e-3)
        assert _mean([r["reward"] for r in rows]) == pytest.approx(logged["reward"], rel=1e-5)
        for name in names:
            assert _mean([r[f"rewards.{name}"] for r in rows]) == pytest.approx(logged[f"rewards/{name}/mean"])
        assert _mean([r["completion_tokens"] for r in rows]) == pytest.approx(logged["completions/mean_length"])
        assert _mean([r["truncated"] for r in rows]) == pytest.approx(logged["completions/clipped_ratio"])
        assert logged[DEGENERATE_KEY] == pytest.approx(_mean([degenerate(r["completion"]) is not None for r in rows]))
    evaluation = json.loads(job.evaluation.read_text())
    trained = evaluation.get("trained") or {"step": evaluation["selected_step"], "score": evaluation["after"]}
    for step, score in ((0, evaluation["before"]), (trained["step"], trained["score"])):
        rows = read_rows(step_file(job.evaluation_rollouts, step))
        assert [r["row"] for r in rows] == list(range(evaluation["n"]))
        assert _mean([r["score"] for r in rows if r["score"] is not None]) == pytest.approx(score)


def same_rollouts(a: JobDir, b: JobDir) -> None:
    """Both jobs kept the same steps, each file row for row the same (an uninterrupted run and a killed one)."""
    for folder in ("rollouts", "evaluation"):
        steps = kept_steps(a.root / folder)
        assert steps == kept_steps(b.root / folder)
        for step in steps:
            assert read_rows(step_file(a.root / folder, step)) == read_rows(step_file(b.root / folder, step))
    assert not list(b.root.glob("*/.step-*"))  # no temporary file left by the killed write


def test_doctests():
    assert doctest.testmod(rollouts).attempted and doctest.testmod(rollouts).failed == 0


# --- rows as TRL logged them -----------------------------------------------------------------------------------------

CHAT = [{"role": "user", "content": "What is 2+2?"}]
LOGGED = {
    "prompt": ["2+2?", "2+2?", CHAT, CHAT],
    "completion": ["4", "five", [{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": ""}]],
    "advantages": [0.7, -0.7, 0.0, 0.0],
    "rewards": {"exact": [1.0, 0.0, 1.0, math.nan], "short": [0.5, math.nan, 0.5, math.nan]},
    "extra": {"completion_tokens": [2, 3, 2, 1], "truncated": [False, True, False, False]},
}


def test_rollout_columns_are_tr_ls_rows_with_the_weighted_total():
    columns = rollout_columns(7, LOGGED, [1.0, 2.0], group_size=2, groups=None)
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    assert [r["group"] for r in rows] == [0, 0, 1, 1] and {r["step"] for r in rows} == {7}
    assert [r["reward"] for r in rows] == [2.0, 0.0, 2.0, None]  # 1 + 2 * 0.5; null where no reward scored
    assert [r["rewards.short"] for r in rows] == [0.5, None, 0.5, None]  # TRL's NaN: not scored, null
    assert rows[2]["prompt"] == json.dumps(CHAT) and rows[2]["completion"] == "4"  # a chat as JSON; one message: text
    assert [r["truncated"] for r in rows] == [False, True, False, False]


def test_groups_per_step_keeps_the_first_groups():
    columns = rollout_columns(1, LOGGED, [1.0, 1.0], group_size=2, groups=1)
    assert columns["group"] == [0, 0] and columns["completion"] == ["4", "five"]


def test_rows_without_the_probe_have_null_lengths():
    # A job whose only rewards are reward models has no reward function to carry the probe.
    columns = rollout_columns(1, LOGGED | {"extra": {}}, [1.0, 1.0], group_size=2, groups=None)
    assert columns["completion_tokens"] == [None] * 4 and columns["truncated"] == [None] * 4


@pytest.mark.parametrize("is_async", [False, True])
def test_completion_probe_hands_tokens_and_truncation_to_log_extra(is_async):
    probe = CompletionProbe()
    probe.stop_ids = {2, 0}  # eos and pad

    def exact_reward(completions, **kwargs):
        return [1.0] * len(completions)

    async def async_reward(completions, **kwargs):
        return [1.0] * len(completions)

    wrapped = probe.wrap(async_reward if is_async else exact_reward)
    extra = {}
    result = wrapped(
        completions=["a", "b", "c"],
        completion_ids=[[5, 2], [5, 6, 7], []],
        log_extra=lambda column, values: extra.setdefault(column, values),
    )
    assert (asyncio.run(result) if is_async else result) == [1.0] * 3
    assert extra == {"completion_tokens": [2, 3, 0], "truncated": [False, True, True]}
    assert wrapped.__name__ == ("async_reward" if is_async else "exact_reward")  # TRL names the metric after it


# --- degenerate completions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, why",
    [
        ("iiiiiiiiii", "repeated"),  # the collapse that motivated the alert: one token over and over
        ("", "empty"),
        ("  \n ", "empty"),  # whitespace only
        ("the cat the cat the cat the cat the cat ", "repeated"),  # an n-gram over and over
        ("The answer is: " + "4" * 60, "repeated"),  # a short lead-in, then one token
        ([{"role": "assistant", "content": "ok ok ok ok ok ok ok ok ok"}], "repeated"),  # a chat completion
        ("42", None),  # a short answer is an answer
        ("1111", None),  # ...even a repetitive one
        ("abababab", None),  # four repeats of a 2-character unit in 8 characters: too short to tell
        ("The answer is 42 because 6 times 7 is 42.", None),  # ordinary text
        ("\n".join(f"print({i})" for i in range(10)), None),  # repetitive structure with content changing
        ("x" * 5000 + "".join(chr(65 + i % 26) for i in range(100)), "repeated"),  # judged on its last 2048 chars
    ],
)
def test_degenerate(completion, why):
    assert degenerate(completion) == why


# --- files: exactly once ---------------------------------------------------------------------------------------------


def test_truncate_drops_the_steps_a_resume_trains_again(tmp_path):
    job = JobDir(tmp_path)
    for step in (1, 2, 3, 4):
        write_rows(step_file(job.rollouts, step), {"step": [step]})
    for step in (0, 2, 4):
        write_held_out(job, step, ["p"], ["c"], [1.0])
    (job.rollouts / ".step-000005.parquet.abc").write_bytes(b"torn")  # a write the kill cut short
    truncate_rollouts(job, 2)
    assert kept_steps(job.rollouts) == [1, 2] and kept_steps(job.evaluation_rollouts) == [0, 2]
    assert not list(job.rollouts.glob(".step-*"))
    truncate_rollouts(job, 0)  # no checkpoint: everything goes but the start model's held-out completions
    assert kept_steps(job.rollouts) == [] and kept_steps(job.evaluation_rollouts) == [0]


# --- reading back ----------------------------------------------------------------------------------------------------


def test_highlights_best_between_worst():
    rows = [{"reward": r, "i": i} for i, r in enumerate([0.5, None, 1.0, 0.0, 0.25])]
    assert [(label, row["reward"]) for label, row in highlights(rows)] == [
        ("best", 1.0),
        ("between", 0.25),
        ("worst", 0.0),
    ]
    assert [label for label, _ in highlights(rows[:1])] == ["best"]  # one row is all three
    assert highlights([{"reward": None}]) == []


def test_the_rollouts_artifacts_rows_show_a_chats_question(tmp_path):
    # As TRL logs a chat prompt (its messages), the rollouts file keeps it as JSON; the artifact's rows show the
    # question, the system prompt apart.
    system = {"role": "system", "content": "Reply with just the number. " * 20}
    logged = {
        "prompt": [[system, {"role": "user", "content": f"What is {i}+{i}?"}] for i in range(2)],
        "completion": [[{"role": "assistant", "content": c}] for c in ("0", "3")],
        "advantages": [1.0, -1.0],
        "rewards": {"exact_answer": [1.0, 0.0]},
    }
    job = JobDir(tmp_path)
    write_rows(step_file(job.rollouts, 3), rollout_columns(3, logged, [1.0], group_size=1, groups=None))
    assert json.loads(read_rows(step_file(job.rollouts, 3))[0]["prompt"])[0] == system  # the file keeps it all
    step, rows = rollouts.highlight_rows(job, 3)
    assert step == 3 and [(r["prompt"], r["completion"]) for r in rows] == [
        ("What is 0+0?", "0"),
        ("What is 1+1?", "3"),
    ]


@pytest.mark.parametrize(
    "prompt, question, system",
    [
        ("What is 2+2?", "What is 2+2?", None),  # text as it is
        ('[{"role": "user", "content": "2+2?"}]', "2+2?", None),  # a chat without a system prompt
        # Several turns: the last user message; multimodal parts: their text.
        (
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "And this?"}]},
            ],
            "And this?",
            "Be brief.",
        ),
        ("[{not json", "[{not json", None),  # text that only looks like a chat
        ('[{"a": 1}]', '[{"a": 1}]', None),  # JSON that is no chat
    ],
)
def test_prompt_text(prompt, question, system):
    assert rollouts.prompt_text(prompt) == question and rollouts.system_text(prompt) == system


def test_side_by_side_pairs_the_start_with_the_kept_model(tmp_path):
    job = JobDir(tmp_path)
    prompts = [f"p{i}" for i in range(8)]
    write_held_out(job, 0, prompts, [f"b{i}" for i in range(8)], [0.0] * 8)
    write_held_out(job, 6, prompts, [f"a{i}" for i in range(8)], [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, None])
    pairs = side_by_side(job, 6, count=4)
    # The prompts whose score changed first (rows 0, 2, 6), then held-out order; shown in held-out order.
    assert [p["row"] for p in pairs] == [0, 1, 2, 6]
    assert pairs[0] == {
        "row": 0,
        "prompt": "p0",
        "before": "b0",
        "before_score": 0.0,
        "after": "a0",
        "after_score": 1.0,
    }
    assert side_by_side(job, 9) == [] and side_by_side(job, 0) == []  # no such file; the start beside itself


def test_degenerate_example_is_the_newest_in_the_window(tmp_path):
    job = JobDir(tmp_path)
    for step, completion in ((2, "iiiiiiiiiiii"), (4, "fine answer"), (6, "zzzzzzzzzzzz"), (9, "qqqqqqqqqqqq")):
        write_rows(step_file(job.rollouts, step), {"completion": [completion, "other text"]})
    assert degenerate_example(job, 1, 8) == (6, "zzzzzzzzzzzz")
    assert degenerate_example(job, 3, 5) is None
