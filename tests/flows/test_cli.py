"""The `grpoflow` CLI: exit codes, messages and outputs of its commands (docs/reference/cli.md)."""

import json

import pytest
import yaml

from tests.conftest import arithmetic_rows, cli, write_jsonl

# --- validate


def test_validate_prints_resolved_spec(make_spec):
    code, out, err = cli("validate", make_spec())
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["hyperparameters"]["kl_coef"] == 0.0  # defaults filled in
    assert resolved["checkpoint_every"] == 1  # a tenth of max_steps=3, at least 1


def test_validate_json_and_set(make_spec):
    code, out, _ = cli("validate", make_spec(), "--json", "--set", "hyperparameters.learning_rate=2e-5")
    assert code == 0
    assert json.loads(out)["hyperparameters"]["learning_rate"] == 2e-5


def test_validate_rejects_with_every_problem(make_spec):
    spec = make_spec(hyperparameters={"learning_rate": -1, "global_batch_size": 64, "lerning_rate": 1})
    code, out, err = cli("validate", spec)
    assert code == 2 and out == ""
    assert "hyperparameters.learning_rate" in err
    assert "global_batch_size" in err
    assert "did you mean 'learning_rate'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        # a spec file that does not exist
        (["validate", "nope.yaml"], "not found"),
        # an override without '='
        (["validate", "{spec}", "--set", "hyperparameters.max_steps"], "hyperparameters.max_steps"),
        # an unknown command
        (["trian"], "grpoflow: argument command: invalid choice: 'trian'"),
        # a command group without its action: named once, as argparse names it
        (["policy"], "grpoflow policy: the following arguments are required"),
    ],
)
def test_usage_mistakes_exit_2(make_spec, argv, message):
    spec = make_spec()
    code, _, err = cli(*[a.format(spec=spec) for a in argv])
    assert code == 2
    assert message in err and "Traceback" not in err and "grpoflow: grpoflow" not in err


# --- run: rejected inputs leave nothing behind


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize(
    "rows, message",
    [
        # the answer column that exact_answer reads is missing
        ([{"prompt": "What is 1+1?"}] * 8, "answer"),
        # an empty prompt on the 3rd row
        ([*arithmetic_rows(2), {"prompt": "", "answer": "1"}, *arithmetic_rows(6)], "row"),
    ],
)
def test_run_rejects_bad_dataset(tmp_path, make_spec, rows, message):
    write_jsonl(tmp_path / "arith.jsonl", rows)
    code, out, err = cli("run", make_spec(), "--json")
    assert code == 2 and json.loads(out)["status"] == "rejected"
    assert message in err and "Traceback" not in err
    assert not any((tmp_path / "runs").glob("*/spec.yaml"))  # no half-written job folder


@pytest.mark.usefixtures("prefect_server")
def test_run_rejects_malformed_jsonl_line(tmp_path, make_spec):
    lines = [json.dumps(r) for r in arithmetic_rows(6)]
    lines[3] = '{"prompt": "What is 1+1?", "answer": '
    (tmp_path / "arith.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = cli("run", make_spec())
    assert code == 2
    assert "line 4" in err


@pytest.mark.usefixtures("prefect_server")
def test_run_rejects_a_reward_that_raises(tmp_path, make_spec, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def broken_reward(completions, answer, **kwargs):\n    raise KeyError('oops')\n"
    )
    monkeypatch.chdir(tmp_path)
    spec = make_spec(rewards=[{"name": "mine", "function": "my_rewards:broken_reward"}])
    code, _, err = cli("run", spec)
    assert code == 2
    assert "'mine'" in err and "KeyError" in err
    assert not any((tmp_path / "runs").glob("*/spec.yaml"))


# --- the preflight: a job that cannot run is rejected before Prefect starts


class BootingServer:
    """What `grpoflow.integrations.prefect_server.start_if_needed` returns while the temporary server boots: `run`
    must stop it, never wait for it (connect), when the preflight rejects the job."""

    calls: list[str] = []

    def wait(self):
        self.calls.append("wait")
        raise AssertionError("a flow run was started for a job the preflight should have rejected")

    def stop(self):
        self.calls.append("stop")


def test_validate_and_run_preflight_before_prefect(tmp_path, make_spec, monkeypatch):
    import grpoflow.integrations.prefect_server

    # The temporary server boots beside the preflight (it is the longer of the two); a rejected job stops it.
    booting = BootingServer()
    booting.calls = []
    monkeypatch.setattr(grpoflow.integrations.prefect_server, "start_if_needed", lambda: booting)
    spec = make_spec(base_model=str(tmp_path / "no-such-model"))
    for command in ("validate", "run"):
        code, out, err = cli(command, spec, "--json")
        assert code == 2 and json.loads(out)["status"] == "rejected", err
        assert f"base_model: {tmp_path / 'no-such-model'} does not exist" in err and "Traceback" not in err
    assert booting.calls == ["stop"]  # by run, once; validate starts none
    assert not (tmp_path / "runs").exists()
    # The escape, for a spec whose paths are a worker's: the spec's own checks only.
    code, out, _ = cli("validate", spec, "--json", "--no-preflight")
    assert code == 0 and json.loads(out)["base_model"] == str(tmp_path / "no-such-model")


def child_starts(tmp_path, module: str = "grpoflow.trainers.grpo", log: str = "train.log") -> int:
    """How many times the training child started: its first line, once per start, in the job's logs/."""
    logs = (tmp_path / "runs").glob(f"*/logs/{log}")
    return sum(path.read_text().count(f"grpoflow: {module} started on") for path in logs)


@pytest.mark.usefixtures("prefect_server")
def test_run_a_setup_problem_starts_the_child_once_and_exits_2(tmp_path, make_spec, monkeypatch):
    import grpoflow.flows.cli.run

    # What the preflight cannot see from where it ran (a worker's machine): the child's own check meets it.
    monkeypatch.setattr(grpoflow.flows.cli.run, "preflight", lambda args, spec: None)
    code, _, err = cli("run", make_spec(base_model=str(tmp_path / "no-such-model")))
    assert code == 2, err
    assert f"grpoflow: cannot train: base_model: {tmp_path / 'no-such-model'} does not exist" in err
    assert child_starts(tmp_path) == 1  # not retried: it would fail the same way


@pytest.mark.usefixtures("prefect_server")
def test_run_stopped_by_the_health_monitor_exits_4(tmp_path, make_spec, standin):
    # A diverged run exited 1, as a crash does: a script could not tell "lower the learning rate" from "retry".
    message = "hyperparameters.learning_rate: training diverged at step 2: the weights became NaN or inf"
    standin(exit_at=2, exit_code=4, message=message)
    code, _, err = cli("run", make_spec())
    assert code == 4, err
    assert f"grpoflow: run stopped: stopped by the health monitor: {message}" in err
    assert child_starts(tmp_path) == 1  # not retried


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_run_says_when_the_budget_ended_training(tmp_path, make_spec, standin, json_flag):
    # training.json said `stopped_by: budget`; the lines `run` prints at the end said only "completed".
    standin(budget_stop_at=2)
    spec = make_spec(hyperparameters={"max_steps": 4}, budget={"max_training_hours": 0.5}, evaluation={"holdout": 0})
    code, out, err = cli("run", spec, *json_flag)
    assert code == 0, err
    if json_flag:
        assert json.loads(out)["stopped_by"] == "budget" and json.loads(out)["status"] == "completed"
        return
    job_id = out.split()[1]
    budget = "training stopped by budget.max_training_hours (0.5 h) at step 2"
    assert out.splitlines()[0] == f"job {job_id} completed, {budget}: {tmp_path / 'runs' / job_id}"
    # `grpoflow jobs` says it too, beside the steps it reached.
    code, out, _ = cli("--output-uri", tmp_path / "runs", "jobs")
    assert out.split() == [job_id, "completed", "2", "steps", "stopped", "by", "budget"]
    code, out, _ = cli("--output-uri", tmp_path / "runs", "jobs", "--json")
    assert json.loads(out)["jobs"] == [{"job_id": job_id, "status": "completed", "steps": 2, "stopped_by": "budget"}]


@pytest.mark.usefixtures("prefect_server")
def test_run_a_crash_is_retried_and_exits_1(tmp_path, make_spec, standin):
    # A crash (SIGKILL, an OOM kill) is retried; a reward's own exception is not (tests/tasks/test_train.py). A real
    # child killed and resumed: tests/tasks/test_train.py::test_sigkill_resumes_each_step_once.
    standin(crash_at=1)
    code, _, err = cli("run", make_spec())
    assert code == 1, err
    assert "the training child is killed" in (next((tmp_path / "runs").glob("*/logs/train.log"))).read_text()
    assert child_starts(tmp_path) == 3  # the first start and the train task's 2 retries


# --- reading jobs back


@pytest.fixture
def finished_job(tmp_path):
    """A job folder as a finished LoRA run leaves it (written directly: these commands only read)."""
    root = tmp_path / "runs" / "demo-20261130-000000-abcdef"
    root.mkdir(parents=True)
    (root / "spec.yaml").write_text("name: demo\n")
    records = [{"step": s, "values": {"reward": s / 10, "loss": 0.1, "entropy": 1.0}} for s in (1, 2, 3)]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "model.json").write_text(
        json.dumps({"artifact_type": "adapter", "files": ["adapter_config.json"], "merged_files": ["config.json"]})
    )
    events = [{"event": "grpoflow.job.started"}, {"event": "grpoflow.job.completed"}]
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return root


def test_jobs_metrics_model(finished_job):
    root = str(finished_job.parent)
    code, out, _ = cli("--output-uri", root, "jobs", "--json")
    assert code == 0
    assert json.loads(out)["jobs"] == [
        {"job_id": finished_job.name, "status": "completed", "steps": 3, "stopped_by": None}
    ]

    code, out, _ = cli("--output-uri", root, "metrics", finished_job.name, "--keys", "reward", "--json")
    assert code == 0
    assert json.loads(out) == {"metrics": [{"step": s, "values": {"reward": s / 10}} for s in (1, 2, 3)]}

    code, out, _ = cli("--output-uri", root, "model", finished_job.name, "--json")
    assert code == 0
    info = json.loads(out)
    assert info["artifact_type"] == "adapter" and info["merged_files"] == ["config.json"]


def test_jobs_lists_every_job_past_malformed_lines(finished_job, caplog):
    import logging
    import shutil

    root = finished_job.parent
    broken = root / "demo-20261130-000001-bbbbbb"
    shutil.copytree(finished_job, broken)
    with (broken / "metrics.jsonl").open("a") as f:
        f.write("[1,2,3]\nnull\n" + json.dumps({"step": 4, "values": {}}) + '\n{"step": 5, "val')  # torn at the end
    with (broken / "events.jsonl").open("a") as f:
        f.write('{"step": 5}\n')
    with caplog.at_level(logging.WARNING, logger="grpoflow"):
        code, out, _ = cli("--output-uri", root, "jobs", "--json")
    assert code == 0
    assert [(j["job_id"], j["steps"]) for j in json.loads(out)["jobs"]] == [(finished_job.name, 3), (broken.name, 4)]
    assert f"{broken / 'metrics.jsonl'}, line 4: skipped, not a record" in caplog.text
    assert f"{broken / 'metrics.jsonl'}, line 7: skipped, the last line is torn" in caplog.text
    assert f"{broken / 'events.jsonl'}, line 3: skipped, not a record" in caplog.text


@pytest.mark.parametrize(
    "argv, message",
    [
        # each command that reads a job back, given a job id that is not there (metrics and model exited 1)
        (["metrics", "no-such-job"], "unknown job 'no-such-job'"),
        (["model", "no-such-job"], "unknown job 'no-such-job'"),
        (["rollouts", "no-such-job"], "unknown job 'no-such-job'"),
        (["webhooks", "retry", "no-such-job"], "unknown job 'no-such-job'"),
        (["publish", "no-such-job", "--repo-id", "me/model"], "unknown job 'no-such-job'"),
        (["serving", "register", "no-such-job"], "unknown job 'no-such-job'"),
        # a job that is there but has no model yet (its training still runs)
        (["model", "{running}"], "has no trained model yet (status: running)"),
        # a name the serving registry does not hold (rollback and serve exited 1)
        (["serving", "rollback", "no-such-name"], "unknown serving name 'no-such-name'"),
        (["serve", "no-such-name"], "unknown serving name 'no-such-name'"),
    ],
)
def test_an_unknown_job_or_name_is_bad_input_exit_2(finished_job, argv, message):
    running = finished_job.parent / "demo-20261130-000002-cccccc"
    running.mkdir()
    (running / "spec.yaml").write_text("name: demo\n")
    (running / "events.jsonl").write_text(json.dumps({"event": "grpoflow.job.started"}) + "\n")
    argv = [a.format(running=running.name) for a in argv]
    code, out, err = cli("--output-uri", finished_job.parent, *argv)
    assert (code, out) == (2, ""), err
    assert message in err and "Traceback" not in err


def test_metrics_unknown_key(finished_job):
    code, out, err = cli("--output-uri", str(finished_job.parent), "metrics", finished_job.name, "--keys", "rewrd")
    assert code == 2 and out == ""
    assert "unknown metric key(s) rewrd (did you mean reward?); this job logged: entropy, loss, reward" in err


def test_metrics_shows_the_main_series_as_a_table(finished_job):
    # One line of ~45 key=value pairs per step before; now the main series in aligned columns, each reward's mean
    # named by its reward, the held-out score where a step has one, and everything with --all.
    values = {
        "loss": 0.5, "grad_norm": 2.0, "reward": 0.25, "reward_std": 0.125, "rewards/exact_answer/mean": 0.25,
        "rewards/exact_answer/std": 0.5, "completions/mean_length": 12.5, "completions/clipped_ratio": 0.0,
        "eval/seconds": 3.0,
    }  # fmt: skip
    records = [{"step": 1, "values": values}, {"step": 10, "values": {**values, "eval/exact_answer": 0.75}}]
    (finished_job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    root = str(finished_job.parent)
    code, out, err = cli("--output-uri", root, "metrics", finished_job.name)
    assert code == 0, err
    assert out.splitlines() == [
        "step  reward  reward_std  exact_answer  loss  length  clipped  eval/exact_answer",
        "   1    0.25       0.125          0.25   0.5    12.5        0                  —",
        "  10    0.25       0.125          0.25   0.5    12.5        0               0.75",
    ]
    code, out, _ = cli("--output-uri", root, "metrics", finished_job.name, "--all")
    assert code == 0 and out.splitlines()[0].split() == ["step", *values, "eval/exact_answer"]


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_metrics_prints_the_keys_the_job_has_and_names_those_it_lacks(finished_job, json_flag):
    # kl is logged only with kl_coef > 0: `--keys reward,kl` printed nothing at all, exit 2.
    root = str(finished_job.parent)
    code, out, err = cli("--output-uri", root, "metrics", finished_job.name, "--keys", "reward,kl,x", *json_flag)
    assert code == 0, err
    assert err == "warning: unknown metric key(s) kl, x; this job logged: entropy, loss, reward\n"
    if json_flag:
        assert json.loads(out) == {"metrics": [{"step": s, "values": {"reward": s / 10}} for s in (1, 2, 3)]}
    else:
        assert out.splitlines() == ["step  reward", *(f"{s:>4}  {s / 10:>6g}" for s in (1, 2, 3))]


def test_json_answers_on_stdout_when_the_spec_is_rejected(make_spec):
    # A script reading `--json` got nothing on stdout; the message stays on stderr for the person.
    spec = make_spec(hyperparameters={"rollouts_per_prompt": 1, "temperature": 1e-300})
    for command in ("validate", "run"):
        code, out, err = cli(command, spec, "--json")
        assert code == 2
        answer = json.loads(out)
        assert answer["status"] == "rejected" and len(answer["problems"]) == 2
        assert answer["problems"][0].startswith("hyperparameters.rollouts_per_prompt: must be >= 2")
        assert all(problem in err for problem in answer["problems"]) and "Traceback" not in err
    code, out, _ = cli("validate", spec)  # without --json, stdout stays empty
    assert code == 2 and out == ""


# --- no Prefect where none is needed

# Runs each argv list of sys.argv[1] (JSON) through the CLI in this one process, then reports the exit codes and
# whether any Prefect server module was imported: Prefect's ephemeral server (the events worker's or the client's)
# cannot start without importing prefect.server.api.server.
NO_PREFECT_PROBE = """
import contextlib, io, json, sys
from grpoflow.flows.cli import main
codes = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        codes.append(main(argv))
print(json.dumps({"codes": codes, "server_modules": sorted(m for m in sys.modules if m.startswith("prefect.server"))}))
"""


def test_reading_and_model_commands_start_no_prefect(tmp_path, make_spec):
    import os
    import subprocess
    import sys

    from grpoflow.trainers.dataset import ingest_dataset
    from tests.hub_server import HubServer
    from tests.publishing import REPO, TOKEN, make_job

    job = make_job(tmp_path / "runs")
    ingest_dataset(str(write_jsonl(tmp_path / "d.jsonl", arithmetic_rows(10))), job.dataset, holdout=2)
    job.model_json.write_text(json.dumps({"artifact_type": "full", "files": [], "merged_files": ["config.json"]}))
    root = str(job.root.parent)
    commands = [
        ["validate", str(make_spec())],
        ["--output-uri", root, "jobs"],
        ["--output-uri", root, "metrics", job.job_id],
        ["--output-uri", root, "model", job.job_id],
        ["--output-uri", root, "serving", "register", job.job_id, "--name", "tiny"],
        ["--output-uri", root, "serving", "list"],
        ["--output-uri", root, "publish", job.job_id, "--repo-id", REPO],
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), HF_HOME=str(tmp_path / "hf-home"))  # no API in a profile
    env.update(HF_TOKEN=TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1")
    probe = [sys.executable, "-c", NO_PREFECT_PROBE, json.dumps(commands)]
    with HubServer(accepted_token=TOKEN) as hub:
        done = subprocess.run(probe, env={**env, "HF_ENDPOINT": hub.url}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["codes"] == [0] * len(commands), done.stderr
    assert report["server_modules"] == []  # no Prefect server, temporary or ephemeral, was started
    assert "temporary Prefect server" not in done.stderr
    events = [json.loads(line)["event"] for line in job.events.read_text().splitlines()]
    assert events == ["grpoflow.deployment.registered", "grpoflow.model.published"]  # still in events.jsonl


def test_every_exit_code_names_an_exception_that_exists():
    # EXIT_CODES is keyed by qualified names (so that an error imports nothing): each must name a real exception.
    import importlib

    from grpoflow.flows.errors import EXIT_CODES, exit_code

    for key in EXIT_CODES:
        module, name = key.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, Exception) and f"{cls.__module__}.{cls.__qualname__}" == key, key
    from grpoflow.flows.deployments import ServerNotSet
    from grpoflow.jobs.publish import PublishError

    # The nearest class listed wins: ServerNotSet is a DeploymentError (1) but the user's to fix (2).
    assert exit_code(ServerNotSet("set PREFECT_API_URL")) == 2
    assert [exit_code(PublishError("x", user_error=u)) for u in (True, False)] == [2, 1]
    assert exit_code(RuntimeError("a bug")) is None  # its traceback, not a one-line message


def test_a_servers_run_ends_the_command_as_grpoflow_run_would():
    # What `submit --wait` reads back of a run: its state's name and message (the exception only as Prefect words it).
    from prefect.states import Cancelled, Crashed, Failed

    from grpoflow.flows.cli.server import run_ending
    from grpoflow.flows.errors import exit_code
    from grpoflow.integrations.stages import rejected

    def failed(error: str) -> int:
        return exit_code(run_ending(Failed(message=f"Flow run encountered an exception: {error}")))

    assert exit_code(run_ending(rejected("dataset.uri: no such file"))) == 2
    assert failed("TrainingSetupError: grpoflow: vllm is not installed") == 2
    assert failed("TrainingStopped: stopped by the health monitor: loss is nan") == 4
    assert failed("ChildFailed: grpo child killed (SIGKILL)") == failed("RewardFailed: reward 'r' raised") == 1
    assert failed("RuntimeError: TrainingStopped: quoted by another error") == 1  # the class name leads, or nothing
    assert exit_code(run_ending(Crashed(message="TrainingStopped: "))) == exit_code(run_ending(Cancelled())) == 1


def commands(parser=None, words: tuple = ()):
    """(the words after `grpoflow`, its parser) for every parser of the CLI, groups (`webhooks`) included."""
    import argparse

    from grpoflow.flows.cli import build_parser

    parser = parser or build_parser()
    yield " ".join(words), parser
    for group in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for name, sub in group.choices.items():
            yield from commands(sub, (*words, name))


def help_text(*words) -> str:
    """What `grpoflow WORDS... --help` prints."""
    import contextlib
    import io

    from grpoflow.flows.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    assert done.value.code == 0
    return out.getvalue()


def test_every_command_says_its_own_exit_codes():
    from grpoflow.flows.errors import COMMAND_EXITS, MEANINGS

    said = {words: help_text(*words.split()) for words, parser in commands() if "exit codes" in parser.format_help()}
    for code, meaning in MEANINGS.items():  # `grpoflow --help`: what each code means for every command
        assert f"  {code:<6}{meaning.split(':')[0]}" in said[""]
    runnable = {words for words, parser in commands() if parser.get_default("func")}
    assert runnable == set(COMMAND_EXITS) and runnable <= set(said), runnable ^ set(COMMAND_EXITS)
    for words in runnable:
        codes = COMMAND_EXITS[words]
        assert set(codes) <= set(MEANINGS) and {0, 2} <= set(codes), words  # every command can be given bad input
        epilog = "\n" + said[words].split("exit codes:\n", 1)[1]
        assert all(f"\n  {code:<6}{text[:30]}" in epilog for code, text in codes.items()), (words, epilog)


def test_every_option_has_help():
    import argparse

    missing = [
        f"{words} {action.option_strings or action.dest}"
        for words, parser in commands()
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_python_dash_m_cli_maps_the_clis_own_errors(tmp_path):
    # Under `python -m grpoflow.flows.cli` the module is `__main__`: the CLI's errors still map (flows/errors.py).
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "grpoflow.flows.cli", "deploy"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "grpoflow: deploy: give the JOB_ID" in proc.stderr and "Traceback" not in proc.stderr


# --- a reader that stops early


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    # `grpoflow jobs | head -3` ended in a BrokenPipeError traceback (and "Exception ignored" at exit).
    import subprocess
    import sys

    for i in range(1500):  # ~120 KB of listing: more than a pipe holds, so the writes outlast the reader
        (tmp_path / f"j-20261130-000000-{i:06x}").mkdir()
        (tmp_path / f"j-20261130-000000-{i:06x}" / "spec.yaml").write_text("name: j\n")
    command = [sys.executable, "-m", "grpoflow.flows.cli", "--output-uri", str(tmp_path), "jobs"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("j-20261130-000000-000000")
    proc.stdout.close()  # as `head -1` exits
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, stderr  # 128 + SIGPIPE, as a program SIGPIPE ended
    assert stderr == ""


def test_only_a_pipe_whose_reader_left_counts_as_a_closed_stdout(monkeypatch, tmp_path):
    # Any other BrokenPipeError (a socket, a child's stdin) stays a traceback: it is a failure, not `| head`.
    import os
    import sys

    from grpoflow.flows.cli.main import _stdout_gone

    with open(tmp_path / "out.txt", "w") as file:
        monkeypatch.setattr(sys, "stdout", file)
        assert not _stdout_gone()
    read, write = os.pipe()
    with open(write, "w") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert not _stdout_gone()
        os.close(read)
        assert _stdout_gone()
    monkeypatch.undo()
    assert not _stdout_gone()  # pytest's capture: no file descriptor at all, or a live one


# --- grpoflow rollouts -----------------------------------------------------------------------------------------------


@pytest.fixture
def job_with_rollouts(finished_job):
    """The finished job with two kept steps of rollouts, as the training child writes them (two rewards)."""
    from grpoflow.trainers.rollouts import step_file, write_rows

    for step in (2, 4):
        completions = ["4", "iiiiiiiiiiiiiiii", "The answer is 4", "five\nlines"]
        exact = [1.0, 0.0, 1.0, 0.0] if step == 2 else [1.0, 1.0, 0.0, None]
        write_rows(
            step_file(finished_job / "rollouts", step),
            {
                "step": [step] * 4,
                "group": [0, 0, 1, 1],
                "prompt": ["What is 2+2? " * 8] * 2 + ["2+2="] * 2,
                "completion": completions,
                "reward": [e + 0.5 if e is not None else 0.5 for e in exact],
                "rewards.exact_answer": exact,
                "rewards.length_penalty": [0.5] * 4,
                "advantage": [0.5, -0.5, 0.5, -0.5],
                "completion_tokens": [2, 16, 5, 3],
                "truncated": [False, True, False, False],
            },
        )
    return finished_job


def test_rollouts_json_sorted_by_the_total(job_with_rollouts):
    root, job_id = str(job_with_rollouts.parent), job_with_rollouts.name
    code, out, _ = cli("--output-uri", root, "rollouts", job_id, "--json")
    assert code == 0
    rows = json.loads(out)["rollouts"]
    assert [(r["step"], r["reward"]) for r in rows][:2] in ([(2, 1.5), (2, 1.5)], [(4, 1.5), (4, 1.5)])
    assert [r["reward"] for r in rows] == sorted((r["reward"] for r in rows), reverse=True)
    assert set(rows[0]) >= {"step", "group", "prompt", "completion", "reward", "rewards", "advantage"}  # DESIGN's
    assert rows[0]["rewards"].keys() == {"exact_answer", "length_penalty"}

    # The newest step's worst by one reward: unscored rows are never among the worst.
    code, out, _ = cli(
        "rollouts", job_id, "--last", "--worst", "2", "--reward", "exact_answer", "--json", "--output-uri", root
    )
    assert code == 0
    rows = json.loads(out)["rollouts"]
    assert [(r["step"], r["rewards"]["exact_answer"]) for r in rows] == [(4, 0.0), (4, 1.0)]

    code, out, _ = cli(
        "--output-uri", root, "rollouts", job_id, "--step", "2", "--best", "1", "--grep", "ANSWER", "--json"
    )
    assert code == 0 and [r["completion"] for r in json.loads(out)["rollouts"]] == ["The answer is 4"]


def test_rollouts_table_fits_the_terminal(job_with_rollouts, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = cli(
        "--output-uri", str(job_with_rollouts.parent), "rollouts", job_with_rollouts.name, "--step", "2"
    )
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 5 and all(len(line) <= 100 for line in lines)
    header = lines[0].split()
    assert header[:6] == ["step", "group", "reward", "exact_answer", "length_penalty", "adv"]
    assert "…" in out  # the long prompt was cut
    assert "five lines" in out  # a completion's newline shown as a space: one line per rollout
    # Scores aligned: each figure ends where its header does.
    end = lines[0].index("reward") + len("reward")
    assert all(line[:end].endswith(("1.5", "0.5")) for line in lines[1:])


def test_rollouts_of_chat_prompts_show_the_question(finished_job, monkeypatch):
    from grpoflow.trainers.rollouts import as_text, step_file, write_rows

    system = {"role": "system", "content": "Reply with just the number. " * 4}
    chats = [[system, {"role": "user", "content": f"What is {i}+{i}?"}] for i in range(3)]
    write_rows(  # the chat as the training child keeps it: JSON
        step_file(finished_job / "rollouts", 1),
        {
            "step": [1] * 3,
            "group": [0, 1, 2],
            "prompt": [as_text(c) for c in chats],
            "completion": ["0", "2", "5"],
            "reward": [1.0, 1.0, 0.0],
            "rewards.exact_answer": [1.0, 1.0, 0.0],
            "advantage": [0.0] * 3,
            "completion_tokens": [1] * 3,
            "truncated": [False] * 3,
        },
    )
    monkeypatch.setenv("COLUMNS", "100")
    root, job_id = str(finished_job.parent), finished_job.name
    code, out, _ = cli("--output-uri", root, "rollouts", job_id)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 5 and all(len(line) <= 100 for line in lines)
    assert lines[0].startswith("system prompt: Reply with just the number.")  # once, above the table
    assert [line.split()[-2:] for line in lines[2:]] == [["0+0?", "0"], ["1+1?", "2"], ["2+2?", "5"]]
    assert "role" not in out and "Reply" not in "".join(lines[1:])

    code, out, _ = cli("--output-uri", root, "rollouts", job_id, "--json", "--grep", "2+2")
    rows = json.loads(out)["rollouts"]
    assert code == 0 and [(r["prompt"], r["system_prompt"]) for r in rows] == [("What is 2+2?", system["content"])]
    code, out, _ = cli("--output-uri", root, "rollouts", job_id, "--json", "--grep", "system")
    assert code == 0 and json.loads(out)["rollouts"] == []  # the question and the completion are searched


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no-such-job"], "unknown job"),  # an id no root holds: exit 2 here, as for every bad argument
        (["{job}", "--step", "3"], "no rollouts of step 3; kept: 2, 4"),
        (["{job}", "--step", "-1"], "not a step number"),
        (["{job}", "--reward", "exact"], "its rewards: exact_answer, length_penalty"),
        (["{job}", "--best", "0"], "is not an integer >= 1"),
        (["{job}", "--best", "1", "--worst", "1"], "not allowed with argument"),
        (["{job}", "--step", "2", "--last"], "not allowed with argument"),
    ],
)
def test_rollouts_bad_arguments_exit_2(job_with_rollouts, argv, message):
    argv = [a.format(job=job_with_rollouts.name) for a in argv]
    code, out, err = cli("--output-uri", str(job_with_rollouts.parent), "rollouts", *argv)
    assert code == 2 and message in err and out == ""


def test_rollouts_of_a_job_that_kept_none(finished_job):
    code, out, err = cli("--output-uri", str(finished_job.parent), "rollouts", finished_job.name, "--json")
    assert code == 0 and json.loads(out) == {"rollouts": []}
    code, out, err = cli("--output-uri", str(finished_job.parent), "rollouts", finished_job.name, "--step", "1")
    assert code == 2 and "it kept none (rollouts.every: 0" in err


def test_run_prints_the_gain_with_its_interval(make_spec, capsys):
    import argparse

    from grpoflow.core.spec import load_spec
    from grpoflow.flows.cli.run import print_result

    spec, _ = load_spec(make_spec())
    evaluation = {"metric": "exact_answer", "n": 40, "before": 0.4, "after": 0.62, "confidence": 0.95}
    result = {"job_id": "t-1", "output_dir": "/nowhere/t-1", "status": "completed"}
    ci = {"before": [0.25, 0.55], "after": [0.47, 0.77], "gain": [0.12, 0.31]}
    print_result(argparse.Namespace(json=False), result | {"evaluation": evaluation | {"ci": ci}}, spec)
    line = "held-out exact_answer on 40 prompts: before GRPO 0.400, after GRPO 0.620 (+0.22, 95% CI +0.12 to +0.31)"
    assert f"\n{line}\n" in capsys.readouterr().out
    print_result(argparse.Namespace(json=False), result | {"evaluation": evaluation | {"ci": None}}, spec)
    assert "\nheld-out exact_answer on 40 prompts: before GRPO 0.400, after GRPO 0.620\n" in capsys.readouterr().out
