"""Who may run what (`grpoflow.trainers.trust`, `trainers/rewards/build.py`): a reward function must have TRL's
reward signature, and a spec that does not come from the user's own command line may name only the modules the work
pool allows. The bad-input corpus holds the command-line side; here, the flows a deployment runs."""

import os
from pathlib import Path

import pytest

from grpoflow.flows.pipeline import grpo_pipeline
from grpoflow.flows.sweep import grpo_sweep
from grpoflow.flows.triggered import grpo_pipeline_from_file
from grpoflow.flows.watch import watch_new_data
from grpoflow.trainers.graders.sandbox import sandbox_problem
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.spec import load_spec
from grpoflow.trainers.trust import (
    PATHS_ENV,
    REWARD_MODULES_ENV,
    SPEC_CODE_ENV,
    command_line,
    deployment_problems,
    local_paths,
    spec_code,
    untrusted_code,
    untrusted_paths,
)

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


def spec_naming(make_spec, function: str):
    spec, _ = load_spec(make_spec("trust", rewards=[{"name": "mine", "function": function}]))
    return spec


def test_a_spec_from_a_deployment_names_only_allowed_modules(make_spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the project folder of the flow run
    (tmp_path / "project_rewards.py").write_text(
        "def score(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    assert untrusted_code(spec_naming(make_spec, "project_rewards:score")) == []  # the project's own
    assert untrusted_code(spec_naming(make_spec, "grpoflow.examples.rewards.arithmetic:close_answer_reward")) == []
    [problem] = untrusted_code(spec_naming(make_spec, "os:system"))
    assert problem.startswith("rewards[0].function: module 'os' is not allowed for a run launched from a deployment")
    assert f"set {REWARD_MODULES_ENV}=os in its environment" in problem
    monkeypatch.setenv(REWARD_MODULES_ENV, "json, os")
    assert untrusted_code(spec_naming(make_spec, "os.path:join")) == []  # a listed package allows its submodules
    monkeypatch.delenv(REWARD_MODULES_ENV)
    with command_line():  # the user's own command line: any module
        assert untrusted_code(spec_naming(make_spec, "os:system")) == []
    assert untrusted_code(spec_naming(make_spec, "os:system")) != []


def test_tools_and_the_metric_are_checked_too(make_spec):
    spec, _ = load_spec(
        make_spec(
            "trust",
            evaluation={"holdout": 4, "metric": {"name": "m", "function": "subprocess:run"}},
            tools=["shutil:rmtree"],
        )
    )
    problems = untrusted_code(spec)
    assert [p.split(":")[0] for p in problems] == ["evaluation.metric.function", "tools[0]"]


PYTHON_GRADER = {"type": "python", "name": "py", "source": "def grade(sample, item):\n    return 1.0\n"}


def test_a_python_grader_is_spec_code_sandboxed_or_refused(make_spec, monkeypatch, tmp_path):
    check = {"type": "string_check", "name": "c", "input": "x", "reference": "x", "operation": "eq"}
    multi = {"type": "multi", "name": "m", "calculate_output": "py + c", "graders": {"py": PYTHON_GRADER, "c": check}}
    spec, _ = load_spec(make_spec("code", rewards=[{"grader": PYTHON_GRADER}, {"grader": multi}, {"grader": check}]))
    assert spec_code(spec) == ["rewards[0].grader", "rewards[1].grader.graders.py"]
    assert untrusted_code(spec) == []  # the sandbox starts here: a deployment's spec may carry it
    monkeypatch.setenv(SPEC_CODE_ENV, "0")  # the operator refuses it on this pool, sandbox or not
    problems = untrusted_code(spec)
    assert [p.split(":")[0] for p in problems] == ["rewards[0].grader", "rewards[1].grader.graders.py"]
    assert all(f"{SPEC_CODE_ENV}=0" in p for p in problems)
    monkeypatch.delenv(SPEC_CODE_ENV)
    monkeypatch.setenv("PATH", str(tmp_path))  # a worker without bwrap
    sandbox_problem.cache_clear()
    try:
        [problem, _] = untrusted_code(spec)
        assert "bwrap is not installed" in problem and f"{SPEC_CODE_ENV}=unsandboxed" in problem
        monkeypatch.setenv(SPEC_CODE_ENV, "unsandboxed")  # the operator's choice: runs without one
        assert untrusted_code(spec) == []
    finally:
        sandbox_problem.cache_clear()
    with command_line():  # the user's own command line: their machine
        assert untrusted_code(spec) == []


# The way around the module rule that grpoflow's own factories were: a grader (code) in a factory's kwargs.
FACTORY = {
    "name": "sneaky",
    "function": "grpoflow.trainers.graders.reward:get_grader_reward",
    "kwargs": {"grader": PYTHON_GRADER, "memory_mb": 100000},
}


def test_grpoflow_factories_are_no_way_around_the_module_rule(make_spec, monkeypatch, tmp_path):
    monkeypatch.chdir(Path(__file__).parents[2])  # grpoflow's own checkout as the project folder: still refused
    spec, _ = load_spec(make_spec("walk", rewards=[FACTORY, {"name": "exact_answer"}]))
    assert spec_code(spec) == ["rewards[0].kwargs.grader"]  # code, wherever in the entry it sits
    [problem] = untrusted_code(spec)
    assert problem.startswith("rewards[0].function: module 'grpoflow.trainers.graders.reward' is not allowed")
    assert "no other grpoflow module" in problem and "built-in reward by its name" in problem
    for shipped in ("grpoflow.trainers.rewards.builtin:exact_answer_reward", "grpoflow.examples.agents:calculator"):
        assert untrusted_code(spec_naming(make_spec, shipped)) == []


@pytest.mark.usefixtures("prefect_server")
def test_the_flows_reject_it_before_anything_runs(make_spec, tmp_path):
    spec = spec_naming(make_spec, "os:system")
    state = grpo_pipeline(spec, return_state=True)
    assert state.name == "Rejected" and "module 'os' is not allowed" in state.message
    state = grpo_sweep(spec, {"hyperparameters.seed": [1, 2]}, return_state=True)
    assert state.name == "Rejected" and "module 'os' is not allowed" in state.message
    spec, _ = load_spec(make_spec("walk", rewards=[FACTORY]))
    state = grpo_pipeline(spec, return_state=True)
    assert state.name == "Rejected" and "'grpoflow.trainers.graders.reward' is not allowed" in state.message
    assert not (tmp_path / "runs").exists()  # no job folder, nothing imported or called


def test_a_deployment_spec_names_local_paths_only_inside_the_pools_folders(make_spec, tmp_path, monkeypatch):
    project, data, outside = tmp_path / "project", tmp_path / "data", tmp_path / "other-tenant"
    for folder in (project / "runs", data, outside / "model"):
        folder.mkdir(parents=True)
    (project / "escape").symlink_to(outside)  # a link in an allowed folder leads out of it
    (outside / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(project)
    spec = load_spec(make_spec("paths"))[0]

    def refused(**changes) -> list[str]:
        return [p.split(":")[0] for p in untrusted_paths(spec.model_copy(update=changes))]

    assert local_paths(spec) == [
        ("dataset.uri", str(tmp_path / "arith.jsonl")),
        ("output_uri", str(tmp_path / "runs")),
    ]
    assert refused() == []  # the pool sets no folders: the worker's file system is the boundary
    monkeypatch.setenv(PATHS_ENV, f"{data}{os.pathsep}../data")  # a data folder (twice), besides the project
    assert refused() == ["dataset.uri", "output_uri"]
    [problem] = untrusted_paths(spec.model_copy(update={"output_uri": "runs"}))
    assert problem.startswith(f"dataset.uri: {tmp_path / 'arith.jsonl'} is outside the folders this work pool lets")
    assert f"(the project and {PATHS_ENV}: {project}{os.pathsep}{data})" in problem
    inside = spec.model_copy(
        update={"output_uri": "runs", "dataset": spec.dataset.model_copy(update={"uri": f"file://{data}/x.jsonl"})}
    )
    assert untrusted_paths(inside) == []
    for uri in (
        "../other-tenant/x.jsonl",
        "escape/x.jsonl",
        f"file://{outside}/x.jsonl",
        f"local://{outside}/x.jsonl",
        f"{data}/../other-tenant/x.jsonl",
    ):
        escaping = inside.model_copy(update={"dataset": inside.dataset.model_copy(update={"uri": uri})})
        assert [p.split(":")[0] for p in untrusted_paths(escaping)] == ["dataset.uri"], uri
    for model, where in (
        (str(outside / "model"), ["base_model"]),
        ("escape/model", ["base_model"]),
        ("Qwen/Qwen2.5-0.5B", []),
        ("/elsewhere/m.gguf", ["base_model"]),
        ("hf://o/n/m.gguf", []),
    ):
        assert [p.split(":")[0] for p in untrusted_paths(inside.model_copy(update={"base_model": model}))] == where, (
            model
        )
    reward = inside.rewards[0].model_copy(update={"name": "rm", "model": str(outside / "model")})
    assert [p.split(":")[0] for p in untrusted_paths(inside.model_copy(update={"rewards": [reward]}))] == [
        "rewards[0].model"
    ]
    assert untrusted_paths(inside.model_copy(update={"output_uri": "s3://bucket/runs"})) == []  # a store, not a path
    with command_line():  # the user's own command line: any path
        assert untrusted_paths(spec) == []
    assert deployment_problems(spec) == untrusted_paths(spec) != []


@pytest.mark.usefixtures("prefect_server")
def test_the_flows_reject_a_path_outside_the_pools_folders(make_spec, tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv(PATHS_ENV, str(tmp_path / "shared"))  # besides the project folder
    spec = load_spec(make_spec("paths"))[0]  # its dataset and output_uri under tmp_path, outside the project
    for state in (
        grpo_pipeline(spec, return_state=True),
        grpo_sweep(spec, {"hyperparameters.seed": [1, 2]}, return_state=True),
    ):
        assert (
            state.name == "Rejected" and state.message.startswith("dataset.uri: ") and "output_uri: " in state.message
        )
    state = grpo_pipeline_from_file(str(make_spec("elsewhere")), return_state=True)  # the event's spec file itself
    assert state.name == "Rejected" and state.message.startswith(f"spec: {tmp_path / 'elsewhere.yaml'} is outside")
    with pytest.raises(ValueError, match=r"^uri: /var/log is outside the folders"):
        watch_new_data("/var/log", watch_minutes=0)
    assert not (tmp_path / "runs").exists()  # nothing written
