"""The operator's policy (`grpoflow.core.policy`): a spec from a deployment names no code, file, URL, host,
credential or model source the policy does not allow. Each attack below is one a person who may only start deployment
runs tried; with no setting changed, the default refuses it, naming the field and the line that would allow it."""

import json
from pathlib import Path

import pytest
import yaml

from grpoflow.core.policy import (
    POLICY_ENV,
    VETTED_TRL_KEYS,
    PolicyError,
    deployment_check,
    is_loopback,
    load_policy,
)
from grpoflow.core.spec import load_spec
from grpoflow.core.spec.hyperparameters import Hyperparameters
from grpoflow.core.spec.rules import TRL_UPLOADS, trl_spec_keys
from grpoflow.core.spec.trl_fields import trl_fields
from grpoflow.flows.cli import main
from grpoflow.flows.project import init_project

REPO = Path(__file__).parents[2]
PYTHON_GRADER = {"type": "python", "name": "py", "source": "def grade(sample, item):\n    return 1.0\n"}
JUDGE = {"base_url": "https://judge.example.com/v1", "model": "m", "rubric": "Score {completion}"}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with no policy file of its own and no GRPOFLOW_POLICY: the built-in defaults apply. Its
    data/ holds the dataset (the default `paths`)."""
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n' * 12)
    monkeypatch.chdir(root)
    monkeypatch.delenv(POLICY_ENV)
    return root


def write_policy(project: Path, policy: dict) -> None:
    (project / ".grpoflow").mkdir(exist_ok=True)
    (project / ".grpoflow" / "policy.yaml").write_text(yaml.safe_dump(policy))


def spec_of(project: Path, **changes):
    spec = {
        "name": "t",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "data/d.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "hyperparameters": {"max_steps": 3, "rollouts_per_prompt": 4, "max_response_length": 6},
        "output_uri": "runs",
    }
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) and isinstance(spec.get(key), dict) else value
    path = project / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_spec(path)[0]


def test_a_plain_spec_of_the_project_is_allowed(project):
    assert deployment_check(spec_of(project)) == []
    (project / "rewards.py").write_text("def score_reward(completions, **kw):\n    return [1.0] * len(completions)\n")
    assert deployment_check(spec_of(project, rewards=[{"name": "s", "function": "rewards:score_reward"}])) == []


# Each attack (the table), the fields refused under the defaults, and the policy line that allows it (None:
# nothing allows it). Applied to a plain spec of the project.
ATTACKS = [
    # remote code with the worker's secrets: a model's (and the reward model's) own code from the Hub, through trl:
    # (model_init_kwargs is grpoflow's at validate, from anywhere)
    ({"trl": {"trust_remote_code": True}}, ["trl.trust_remote_code"], "trust_remote_code: true"),
    # a worker variable sent to the spec's own host: the judge's host and the key's destination both refused
    (
        {"rewards": [{"name": "llm_judge", "kwargs": {**JUDGE, "api_key_env": "AWS_SECRET_ACCESS_KEY"}}]},
        ["rewards[0].kwargs.base_url", "rewards[0].kwargs.api_key_env"],
        "api_key_env: {AWS_SECRET_ACCESS_KEY: [judge.example.com]}",
    ),
    # a key variable with no URL beside it (a factory's kwargs): still a credential's name the policy must list
    (
        {
            "rewards": [
                {
                    "name": "r",
                    "function": "trl.rewards:get_soft_overlong_punishment",
                    "kwargs": {"api_key_env": "AWS_SECRET_ACCESS_KEY"},
                }
            ]
        },
        ["rewards[0].kwargs.api_key_env"],
        "api_key_env: {AWS_SECRET_ACCESS_KEY: [HOST]}",
    ),  # fmt: skip
    # the worker's own services on loopback, in any spelling: nothing allows it
    (
        {"rewards": [{"name": "llm_judge", "kwargs": {**JUDGE, "base_url": "http://2130706433:8080/v1"}}]},
        ["rewards[0].kwargs.base_url"],
        None,
    ),  # fmt: skip
    (
        {"generation": {"engine": "vllm", "vllm_mode": "server", "vllm_server_url": "http://localhost:8000"}},
        ["generation.vllm_server_url"],
        None,
    ),  # fmt: skip
    # a huge job: every limit it passes
    (
        {"hyperparameters": {"rollouts_per_prompt": 4096, "prompts_per_step": 64, "max_response_length": 100000000}},
        [
            "hyperparameters.rollouts_per_prompt",
            "hyperparameters.prompts_per_step",
            "hyperparameters.max_response_length",
            "hyperparameters.max_response_length",
        ],
        "limits.",
    ),  # fmt: skip
    # another team's job folder, a credentials file, a folder outside the project
    ({"dataset": {"uri": "runs/other-job/rollouts/step-1.jsonl"}}, [], None),  # the jobs' own folder: readable
    ({"dataset": {"uri": "/root/.aws/credentials.csv"}}, ["dataset.uri"], "paths: [/root/.aws]"),
    ({"dataset": {"uri": "s3://someone/x.jsonl"}}, ["dataset.uri"], "paths: [s3://someone]"),
    ({"output_uri": "s3://attacker/exfil"}, ["output_uri"], "paths: [s3://attacker]"),
    # a validation set is read like the dataset: the same folders and store prefixes
    ({"evaluation": {"dataset": {"uri": "runs/other-job/rollouts/step-1.jsonl"}}}, [], None),
    (
        {"evaluation": {"dataset": {"uri": "/root/.aws/credentials.csv"}}},
        ["evaluation.dataset.uri"],
        "paths: [/root/.aws]",
    ),
    (
        {"evaluation": {"dataset": {"uri": "s3://someone/x.jsonl"}}},
        ["evaluation.dataset.uri"],
        "paths: [s3://someone]",
    ),
    # an evaluation suite is code: the project's own file only (its folder's, read where the spec is)
    ({"evaluation": {"suites": [{"inspect": "evals/sums.py@sums"}]}}, [], None),
    ({"evaluation": {"suites": [{"inspect": "/tmp/evil.py@sums"}]}}, ["evaluation.suites[0].inspect"], None),
    # nor a file in a folder data, uploads or jobs are written to, though inside the project (a team's upload, a
    # dropped file)
    ({"evaluation": {"suites": [{"inspect": "data/evil.py@sums"}]}}, ["evaluation.suites[0].inspect"], None),
    ({"evaluation": {"suites": [{"inspect": "runs/files/a/evil.py@t"}]}}, ["evaluation.suites[0].inspect"], None),
    # a model source, and code by name
    ({"base_model": "attacker/evil-model"}, ["base_model"], "models: [attacker/evil-model]"),
    ({"rewards": [{"name": "r", "function": "os:system"}]}, ["rewards[0].function"], "modules: [os]"),
    (
        {
            "rewards": [
                {
                    "name": "r",
                    "function": "grpoflow.trainers.graders.reward:get_grader_reward",
                    "kwargs": {"grader": PYTHON_GRADER},
                }
            ]
        },
        ["rewards[0].function"],
        None,
    ),  # fmt: skip
    # a trl: key off the vetted table (a free-form dict handed to transformers' generate)
    ({"trl": {"generation_kwargs": {"custom_generate": "attacker/gen"}}}, ["trl.generation_kwargs"], "trl_keys"),
    # webhooks: a host and a signing variable
    (
        {"webhooks": [{"url": "https://hooks.example.com/x", "secret_env": "AWS_SECRET_ACCESS_KEY"}]},
        ["webhooks[0].url", "webhooks[0].secret_env"],
        "secret_env: [AWS_SECRET_ACCESS_KEY]",
    ),  # fmt: skip
]


@pytest.mark.parametrize("changes, refused, line", ATTACKS)
def test_the_default_refuses_each_attack(project, changes, refused, line):
    problems = deployment_check(spec_of(project, **changes))
    assert [p.split(":")[0] for p in problems] == refused, problems
    if line:
        assert any(line in p for p in problems), problems
    if refused and line is None:
        assert all("policy (the built-in defaults) allows it" not in p for p in problems)


def test_what_the_lines_allow_runs(project):
    """The lines the refusals name, written into the project's policy, allow those specs (loopback stays refused)."""
    write_policy(project, {
        "from_deployments": {
            "trl_keys": [*VETTED_TRL_KEYS, "trust_remote_code"], "trust_remote_code": True,
            "endpoints": ["judge.example.com"], "api_key_env": {"JUDGE_KEY": ["judge.example.com"]},
            "paths": ["data", "s3://shared/data"], "models": ["HuggingFaceTB/*"], "modules": ["json"],
            "webhooks": ["hooks.example.com"], "secret_env": ["HOOK_SECRET"],
        },
        "limits": {"rollouts_per_prompt": 128},
    })  # fmt: skip
    spec = spec_of(
        project,
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        dataset={"uri": "s3://shared/data/d.jsonl"},
        rewards=[{"name": "llm_judge", "kwargs": {**JUDGE, "api_key_env": "JUDGE_KEY"}}],
        trl={"trust_remote_code": True, "top_p": 0.9},
        hyperparameters={"rollouts_per_prompt": 128},
        webhooks=[{"url": "https://hooks.example.com/x", "secret_env": "HOOK_SECRET"}],
    )
    assert deployment_check(spec) == []
    other_key = spec.rewards[0].model_copy(update={"kwargs": {**JUDGE, "api_key_env": "AWS_SECRET_ACCESS_KEY"}})
    [problem] = deployment_check(spec.model_copy(update={"rewards": [other_key]}))
    assert problem.startswith("rewards[0].kwargs.api_key_env: the value of AWS_SECRET_ACCESS_KEY may not be sent")
    loopback = spec.rewards[0].model_copy(update={"kwargs": {**JUDGE, "base_url": "http://127.0.0.1:1/v1"}})
    assert [p.split(":")[0] for p in deployment_check(spec.model_copy(update={"rewards": [loopback]}))] == [
        "rewards[0].kwargs.base_url"
    ]


def test_everything_is_found_in_one_pass(project):
    spec = spec_of(project, base_model="x/y", trl={"trust_remote_code": True}, dataset={"uri": "/etc/x.jsonl"})
    problems = deployment_check(spec)
    assert {p.split(":")[0] for p in problems} == {"base_model", "trl.trust_remote_code", "dataset.uri"}


def test_a_python_grader_runs_sandboxed_or_is_refused(project):
    spec = spec_of(project, rewards=[{"grader": PYTHON_GRADER}])
    assert deployment_check(spec) == []  # the sandbox starts here (bwrap): allowed by default
    write_policy(project, {"from_deployments": {"python_graders": "off"}})
    [problem] = deployment_check(spec)
    assert problem.startswith("rewards[0].grader: a python grader") and "python_graders: sandboxed" in problem


def test_an_old_setting_still_set_is_named(project, monkeypatch):
    """Nothing an operator allowed before is lost silently: the refusal says the old setting no longer applies and
    which policy line does its work."""
    monkeypatch.setenv("GRPOFLOW_REWARD_MODULES", "os")
    [problem] = deployment_check(spec_of(project, rewards=[{"name": "r", "function": "os:system"}]))
    assert "`from_deployments.modules: [os]`" in problem
    assert "GRPOFLOW_REWARD_MODULES in the worker's environment no longer applies to deployments" in problem


@pytest.mark.parametrize(
    "policy, message",
    [
        ({"from_deployments": {"endpoint": []}}, "from_deployments.endpoint: Extra inputs are not permitted"),
        ({"from_deployments": {"endpoints": ["127.0.0.2"]}}, "loopback is never an endpoint"),
        ({"from_deployments": {"trl_keys": ["no_such_field"]}}, "not fields of trl.GRPOConfig: no_such_field"),
        ({"teams": {"a": {"limits": {"max_step": 3}}}}, "max_step"),
        ({"from_deployments": {"python_graders": "unsandboxed"}}, "python_graders"),
    ],
)
def test_a_policy_with_a_mistake_names_it(project, policy, message):
    write_policy(project, policy)
    with pytest.raises(PolicyError, match="policy .*policy.yaml: ") as raised:
        load_policy()
    assert message in str(raised.value)
    assert deployment_check(spec_of(project)) == [str(raised.value)]  # a run is refused, never let through


def test_teams_have_their_own_folders_names_and_limits(project):
    (project / "team-a-data").mkdir()
    write_policy(project, {
        "teams": {"a": {"paths": ["team-a-data"], "deploy_names": ["a-"], "limits": {"rollouts_per_prompt": 4}}},
    })  # fmt: skip
    spec = spec_of(project, dataset={"uri": "team-a-data/d.jsonl"}, deploy={"name": "a-serving"})
    assert deployment_check(spec, team="a") == []
    assert [p.split(":")[0] for p in deployment_check(spec)] == ["dataset.uri"]  # not a's run: not a's folder
    [problem] = deployment_check(spec, team="b")
    assert problem.startswith("team 'b': not a team of the policy")
    other = spec_of(project, deploy={"name": "b-serving"}, hyperparameters={"rollouts_per_prompt": 8})
    problems = deployment_check(other, team="a")
    assert [p.split(":")[0] for p in problems] == ["hyperparameters.rollouts_per_prompt", "deploy.name"]
    assert "teams.a.limits.rollouts_per_prompt" in problems[0]
    # a's jobs (runs/a/...) are a's to read, as a warm start does; another team's are not
    assert deployment_check(spec_of(project, dataset={"uri": "runs/a/job/x.jsonl"}), team="a") == []
    assert deployment_check(spec_of(project, dataset={"uri": "runs/b/job/x.jsonl"}), team="a") != []


def test_the_operators_own_endpoint_and_a_teams_own_webhooks_are_allowed(project):
    """The policy's model_graders endpoint (loopback here) in any deployment's spec, with its key variable only; a
    team's webhooks (teams.NAME.webhooks) in that team's runs only."""
    own, hook = "http://127.0.0.1:8000/v1", {"url": "http://127.0.0.1:9000/hook", "secret_env": "HOOK_SECRET"}
    write_policy(project, {"from_deployments": {"model_graders": {"base_url": own + "/", "api_key_env": "GRADER_KEY"}},
                           "teams": {"a": {"webhooks": [hook]}, "b": {}}})  # fmt: skip
    judged = {"grader": {"type": "score_model", "name": "j", "model": "gpt-4o-mini", "input": [
        {"role": "user", "content": "Rate {{ sample.output_text }}"}]}}  # fmt: skip
    allowed = spec_of(project, rewards=[{**judged, "kwargs": {"base_url": own, "api_key_env": "GRADER_KEY"}}])
    assert deployment_check(allowed, team="b") == []
    for kwargs, refused in (({"base_url": "http://127.0.0.1:8001/v1"}, "on loopback"),
                            ({"base_url": own, "api_key_env": "OTHER_KEY"}, "OTHER_KEY")):  # fmt: skip
        problems = deployment_check(spec_of(project, rewards=[{**judged, "kwargs": kwargs}]), team="b")
        assert any(refused in p for p in problems), problems
    hooked = spec_of(project, webhooks=[{**hook, "openai_events": "only"}])
    assert deployment_check(hooked, team="a") == []
    assert [p.split(":")[0] for p in deployment_check(hooked, team="b")] == [
        "webhooks[0].url",
        "webhooks[0].secret_env",
    ]
    with pytest.raises(PolicyError, match="no http"):
        write_policy(project, {"from_deployments": {"model_graders": {"base_url": "http://u:p@judge/v1"}}})
        load_policy()


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("localhost", True), ("LOCALHOST.", True), ("api.localhost", True), ("127.0.0.1", True), ("127.1.2.3", True),
        ("[::1]", True), ("0.0.0.0", True), ("2130706433", True),  # 127.0.0.1 as one number
        ("::ffff:127.0.0.1", True),  # IPv4-mapped
        ("10.0.0.1", False), ("api.openai.com", False), ("localhost.example.com", False),
    ],
)  # fmt: skip
def test_loopback_in_its_spellings(host, loopback):
    assert is_loopback(host) is loopback


def test_the_vetted_trl_keys_name_nothing():
    """Each vetted key is a field of trl.GRPOConfig that takes a number, a switch or one of TRL's own choices: no
    dict or free string (a path, URL, module or model), no upload, no remote code, none the spec sets itself."""
    fields = trl_fields()["fields"]
    choices_by_name = {"loss_type", "scale_rewards", "importance_sampling_level", "multi_objective_aggregation",
                       "vllm_importance_sampling_mode"}  # fmt: skip
    for key in VETTED_TRL_KEYS:
        assert key in fields, key
        types = set(fields[key]["types"]) - {"None"}
        assert types <= {"bool", "int", "float"} or fields[key]["choices"] or key in choices_by_name, (key, types)
        assert key not in TRL_UPLOADS and key not in trl_spec_keys(Hyperparameters) and "remote" not in key, key
    assert len(set(VETTED_TRL_KEYS)) == len(VETTED_TRL_KEYS)


def test_grpoflow_init_writes_a_policy_its_own_specs_pass(tmp_path, monkeypatch):
    monkeypatch.delenv(POLICY_ENV)
    root = tmp_path / "proj"
    init_project(root)
    monkeypatch.chdir(root)
    assert load_policy().source == str(root / ".grpoflow" / "policy.yaml")
    for spec in ("spec.yaml", "k8s-spec.yaml"):
        assert deployment_check(load_spec(root / spec)[0], root) == [], spec
    monkeypatch.chdir(REPO)  # grpoflow's own deployments (deployments/prefect.yaml) run the shipped examples
    for spec in ("deployments/default-spec.yaml", "examples/arithmetic.yaml"):
        assert deployment_check(load_spec(REPO / spec)[0], REPO) == [], spec


def test_policy_show_and_check(project, capsys):
    assert main(["policy", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["source"] == "the built-in defaults" and shown["from_deployments"]["paths"] == ["data"]
    assert shown["sandbox_memory"]["total_mb"] >= shown["sandbox_memory"]["per_process_mb"]
    spec_of(project, base_model="x/y", trl={"trust_remote_code": True})
    assert main(["policy", "check", "spec.yaml"]) == 2
    err = capsys.readouterr().err
    assert "would be refused" in err and "\nbase_model: model 'x/y'" in err and "\ntrl.trust_remote_code:" in err
    spec_of(project)
    assert main(["policy", "check", "spec.yaml"]) == 0
    assert "allowed by the policy" in capsys.readouterr().out
