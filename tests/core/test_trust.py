"""Who may run what (`grpoflow.core.trust`, `trainers/rewards/build.py`): a reward function must have TRL's
reward signature, and every flow that takes a spec from a deployment checks it against the operator's policy
(tests/core/test_policy.py) before anything of it runs. The bad-input corpus holds the command-line side."""

import pytest

from grpoflow.core.policy import POLICY_ENV
from grpoflow.core.spec import load_spec
from grpoflow.core.trust import (
    SPEC_ORIGIN_ENV,
    command_line,
    deployment_problems,
    spec_from_command_line,
    unsandboxed_allowed,
)
from grpoflow.flows.pipeline import grpo_pipeline
from grpoflow.flows.sweep import grpo_sweep
from grpoflow.flows.triggered import grpo_pipeline_from_file
from grpoflow.flows.watch import watch_new_data
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward

CALLED = []


def not_a_reward(command: str) -> int:  # a callable with the shape of os.system: never called as a reward
    CALLED.append(command)
    return 0


def get_not_a_reward(command: str):  # a factory returning something that is no reward
    return not_a_reward


@pytest.mark.parametrize(
    "function, kwargs, message",
    [
        ("os:system", {}, "'os:system' is not a reward function: TRL calls a reward with keyword arguments"),
        ("os:system", {"command": "touch x"}, "kwargs are for a factory (named get_*, returning the reward)"),
        (f"{__name__}:not_a_reward", {}, "must take `completions`"),
        (f"{__name__}:get_not_a_reward", {"command": "x"}, "is not a reward function"),
    ],
)
def test_only_reward_shaped_callables_are_called(function, kwargs, message):
    with pytest.raises(RewardError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        build_reward("r", function, kwargs)
    assert CALLED == []  # refused before any call


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project with no policy of its own (the built-in defaults), its data under data/."""
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    monkeypatch.chdir(root)
    monkeypatch.delenv(POLICY_ENV)
    return root


def test_the_command_line_is_the_users_own(make_spec, project):
    spec, _ = load_spec(make_spec("walk", rewards=[{"name": "r", "function": "os:system"}]))
    assert deployment_problems(spec) != []  # from a deployment: refused (module, paths)
    with command_line():  # the user's own command line: their machine
        assert deployment_problems(spec) == []


def test_a_deployments_environment_says_nothing_of_the_origin(make_spec, project, monkeypatch, tmp_path):
    """A run's environment claiming the command line (or the old unsandboxed switch) changes nothing: the flow drops
    the origin variable, and spec code from a deployment never runs outside the sandbox."""
    monkeypatch.setenv(SPEC_ORIGIN_ENV, "command_line")
    monkeypatch.setenv("GRPOFLOW_ALLOW_SPEC_CODE", "unsandboxed")
    spec, _ = load_spec(make_spec("walk"))
    deployment_problems(spec)
    assert not spec_from_command_line() and not unsandboxed_allowed()


@pytest.mark.usefixtures("prefect_server")
def test_the_flows_reject_it_before_anything_runs(make_spec, project, tmp_path):
    spec, _ = load_spec(make_spec("walk", rewards=[{"name": "r", "function": "os:system"}]))
    for state in (
        grpo_pipeline(spec, return_state=True),
        grpo_sweep(spec, {"hyperparameters.seed": [1, 2]}, return_state=True),
    ):
        assert state.name == "Rejected" and "module 'os' is neither the project's own" in state.message
        assert "dataset.uri: " in state.message and "output_uri: " in state.message  # found in the same pass
    state = grpo_pipeline_from_file(str(make_spec("elsewhere")), return_state=True)  # the event's spec file itself
    assert state.name == "Rejected" and state.message.startswith(f"spec: {tmp_path / 'elsewhere.yaml'} is outside")
    with pytest.raises(ValueError, match=r"^uri: /var/log is outside the folders"):
        watch_new_data("/var/log", watch_minutes=0)
    assert not (tmp_path / "runs").exists()  # nothing written, nothing imported or called
