"""Faults inside training, met by the training child itself (`python -m grpoflow.trainers.grpo`, through `run_child` as
the train task runs it): a reward that returns NaN, inf, too few values or a string from step 3, raises at step 3, or
hangs at step 3 stops the child with exit code 3 (`RewardFailed`) naming the reward and the step; a reward calling
`os._exit(0)` is a `ChildEndedEarly`, not a missing file. The rewards are in tests/bad_inputs/rewards/from_step3.py.
Beside them a reward writes to a buffered file it never flushes (tests/trainers/buffered_reward.py): a child that
stops with exit code 3 still ends the ordinary way, and every line it wrote is in the file.
Each bad value a reward returns goes through the child's entry (`grpo.cli`) in this process, which imports TRL once:
the value's message and exit code 3 are the guard's; what the child process adds (`run_child`'s `RewardFailed`, one
start in train.log, the buffered writes surviving the exit) is the same for every fault, shown by the raising one."""

import json

import pytest

from grpoflow.core.errors import EXIT_RECORD, REWARD_FAILED_EXIT, ChildEndedEarly, RewardFailed
from grpoflow.jobs.launch import run_child
from grpoflow.trainers import grpo

FAULTY = "tests.bad_inputs.rewards.from_step3"
LOGGED = {"name": "logged", "function": "tests.trainers.buffered_reward:logged_reward"}
FAST = {"max_steps": 4, "rollouts_per_prompt": 2, "max_response_length": 4}


def faulty_job(make_job, name: str, reward: str, **changes):
    rewards = [{"name": "exact_answer"}, LOGGED, {"name": "mine", "function": f"{FAULTY}:{reward}"}]
    return make_job(name, rewards=rewards, hyperparameters=FAST, evaluation={"holdout": 0}, **changes)


@pytest.mark.parametrize(
    "reward, expect",
    [
        (
            "nan_reward",
            "reward 'mine' returned NaN at position 0 (return None for 'does not apply') at training step 3",
        ),
        ("inf_reward", "reward 'mine' returned inf at position 0, expected a finite number at training step 3"),
        ("short_reward", "reward 'mine' returned 1 values for 2 completions at training step 3"),
        (
            "text_reward",
            "reward 'mine' returned str 'good' at position 0, expected a float or None at training step 3",
        ),
    ],
)
def test_a_bad_value_stops_training_at_its_step(make_job, reward, expect, capsys):
    job, _ = faulty_job(make_job, reward.removesuffix("_reward"), reward)
    assert grpo.cli([str(job.root)]) == REWARD_FAILED_EXIT  # what run_child turns into RewardFailed
    record = json.loads((job.root / EXIT_RECORD).read_text())
    assert record["code"] == REWARD_FAILED_EXIT and record["message"].startswith(expect)
    assert f"grpoflow: {expect}" in capsys.readouterr().err
    assert not job.training_result.exists()


def test_a_raising_reward_stops_the_child_at_its_step(make_job, tmp_path, monkeypatch):
    reward_log = tmp_path / "reward.log"
    monkeypatch.setenv("GRPOFLOW_TEST_REWARD_LOG", str(reward_log))  # read by the child's import of the module
    job, _ = faulty_job(make_job, "raises", "raises_reward")
    with pytest.raises(RewardFailed) as failed:
        run_child("grpoflow.trainers.grpo", job, 1, "train.log", result=job.training_result)
    expect = "reward 'mine' raised KeyError: 'solution' at training step 3"
    assert str(failed.value).startswith(expect) and "traceback in" in str(failed.value)
    log = (job.logs / "train.log").read_text()
    assert log.count("grpoflow: grpoflow.trainers.grpo started") == 1
    assert "Traceback" in log and 'raise KeyError("solution")' in log  # the user's traceback, down to their line
    assert not job.training_result.exists()
    # The buffered writes of the steps before the failure survived the child's end (0 bytes through os._exit).
    steps = {line.split(":")[0] for line in reward_log.read_text().splitlines()}
    assert {"step 1", "step 2", "step 3"} <= steps


def test_a_hung_reward_times_out(make_job):
    job, _ = faulty_job(make_job, "hang", "hang_reward", health={"reward_timeout_s": 2})
    with pytest.raises(RewardFailed, match=r"reward 'mine' did not return within 2 s at training step 3"):
        run_child("grpoflow.trainers.grpo", job, 1, "train.log", result=job.training_result)


def test_a_reward_ending_the_process_is_named(make_job):
    job, _ = faulty_job(make_job, "exit", "exit_reward")
    with pytest.raises(ChildEndedEarly, match=r"child exited 0 without writing training.json"):
        run_child("grpoflow.trainers.grpo", job, 1, "train.log", result=job.training_result)
