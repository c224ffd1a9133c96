"""The jobs API's rules without a server: OpenAI's reinforcement hyperparameters as grpoflow's, the job a base_model
names, a job's status from its events, a problem line as {param, message}, and the keys file."""

import stat
from types import SimpleNamespace

import pytest
import yaml
from prefect.states import Cancelled, Cancelling, Completed, Running

from grpoflow.api.errors import bad_spec
from grpoflow.api.fine_tuning import _hyperparameters, fine_tuning_job
from grpoflow.api.jobs import JobState, Settings, _status_from_events, parent_job, resumed_spec
from grpoflow.core.apikeys import KeysError, add_key, digest, read_keys, team_of
from grpoflow.core.jobdir import JobDir, write_text_atomic
from grpoflow.core.spec import load_spec
from grpoflow.core.spec.loading import to_yaml
from grpoflow.flows.admission import team_spec
from grpoflow.integrations.job_folders import resume_problem

HP = "method.reinforcement.hyperparameters"


@pytest.mark.parametrize(
    "given, rows, hyperparameters, evaluation, problems",
    [
        # one epoch of 48 rows at 16 prompts a step: 3 steps
        ({"n_epochs": 1, "batch_size": 16}, 48, {"prompts_per_step": 16, "max_steps": 3}, {}, []),
        # a part step rounds up; prompts_per_step 1 when no batch size is given
        ({"n_epochs": 2}, 5, {"max_steps": 10}, {}, []),
        ({"n_epochs": 1, "prompts_per_step": 4}, 10, {"prompts_per_step": 4, "max_steps": 3}, {}, []),
        # the group is 8 x the multiplier
        ({"compute_multiplier": 0.5}, 1, {"rollouts_per_prompt": 4}, {}, []),
        # the multiplier scales the full fine-tune's rate, or LoRA's with lora_rank
        ({"learning_rate_multiplier": 2}, 1, {"learning_rate": 2e-6}, {}, []),
        ({"learning_rate_multiplier": 2, "lora_rank": 8}, 1, {"learning_rate": 4e-5, "lora_rank": 8}, {}, []),
        ({"eval_interval": 5}, 1, {}, {"every": 5}, []),
        # several sampled completions per held-out prompt
        ({"eval_interval": 2, "eval_samples": 4}, 1, {}, {"every": 2, "samples": 4}, []),
        # "auto" and null leave grpoflow's default
        ({"n_epochs": "auto", "batch_size": None}, 1, {}, {}, []),
        # grpoflow's own names pass as they are
        ({"max_steps": 7, "kl_coef": 0.1}, 1, {"max_steps": 7, "kl_coef": 0.1}, {}, []),
        # one setting given both ways
        ({"n_epochs": 1, "max_steps": 2}, 4, {"max_steps": 4}, {}, [f"{HP}.n_epochs"]),
        ({"batch_size": 2, "prompts_per_step": 2}, 4, {"prompts_per_step": 2}, {}, [f"{HP}.batch_size"]),
        # no equivalent, or no such name at all
        ({"reasoning_effort": "low", "beta": 1}, 1, {}, {}, [f"{HP}.reasoning_effort", f"{HP}.beta"]),
    ],
)  # fmt: skip
def test_openai_hyperparameters_as_grpoflows(given, rows, hyperparameters, evaluation, problems):
    hp, ev, found = _hyperparameters(given, rows)
    assert hp == pytest.approx(hyperparameters) and ev == evaluation
    assert sorted(p.split(":")[0] for p in found) == sorted(problems)


@pytest.mark.parametrize(
    "model, job",
    [
        ("job:words-20261206-090304-ced1e9", "words-20261206-090304-ced1e9"),
        ("ft:builtin:tiny:a:words:words-20261206-090304-ced1e9", "words-20261206-090304-ced1e9"),  # base with a ':'
        ("ft:Qwen/Qwen2.5-0.5B:b:words:w-1", "b:w-1"),  # another team's: no job id of team a's
        ("builtin:tiny", None),
        ("Qwen/Qwen2.5-0.5B-Instruct", None),
        (None, None),
    ],
)
def test_the_job_a_base_model_names(model, job):
    assert parent_job(model, "a") == job


@pytest.mark.parametrize(
    "events, status",
    [
        ([], "queued"),
        (["grpoflow.job.started"], "running"),
        (["grpoflow.job.started", "grpoflow.job.completed"], "succeeded"),
        (["grpoflow.job.started", ("grpoflow.job.failed", "cancelled")], "cancelled"),
        (["grpoflow.job.started", ("grpoflow.job.failed", "rejected")], "rejected"),
        (["grpoflow.job.started", ("grpoflow.job.failed", "RuntimeError")], "failed"),
        # a resumed job: its last end counts
        ([("grpoflow.job.failed", "cancelled"), "grpoflow.job.started", "grpoflow.job.completed"], "succeeded"),
    ],
)
def test_a_status_from_the_job_folders_events(events, status):
    records = [{"event": e, "payload": {}} if isinstance(e, str) else {"event": e[0], "payload": {"reason": e[1]}}
               for e in events]  # fmt: skip
    assert _status_from_events(records) == status


@pytest.mark.parametrize(
    "state, paused, status",
    [
        (Running(), False, "running"),
        (Cancelling(), True, "paused"),  # the pause's cancel, while the worker stops the run
        (Cancelled(), True, "paused"),
        (Cancelled(), False, "cancelled"),  # cancelled for good (a cancel clears the pause)
        (Running(), True, "running"),  # a run of the record's that is not the paused one's
        (Completed(), True, "succeeded"),  # the pause came too late: the run had ended
    ],
)
def test_a_paused_job_is_paused_to_both_apis(tmp_path, state, paused, status):
    record = {"id": "j-1", "flow_run_id": "x", "created_at": 0, "paused": paused}
    job = JobState(record, SimpleNamespace(state=state, end_time=None), JobDir(tmp_path / "j-1"))
    assert job.status == status
    assert fine_tuning_job(job, "a")["status"] == {"paused": "paused", "cancelled": "cancelled"}.get(status, status)


def test_every_problem_becomes_param_and_message():
    error = bad_spec(["gpu_count: must be >= 1", "team 'x': not a team of the policy", "no colon at all"])
    body = error.body()["error"]
    assert error.status == 400 and body["param"] == "gpu_count" and body["code"] == "invalid_spec"
    assert body["problems"] == [
        {"param": "gpu_count", "message": "must be >= 1"},
        {"param": None, "message": "team 'x': not a team of the policy"},
        {"param": None, "message": "no colon at all"},
    ]


def test_the_keys_file_keeps_digests_and_finds_teams(tmp_path):
    path = tmp_path / "nested" / "keys.yaml"
    first, second = add_key(path, "a", "ci"), add_key(path, "b")
    assert first != second and first.startswith("gf-") and len(first) > 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [r.sha256 for r in read_keys(path)] == [digest(first), digest(second)]
    assert first not in path.read_text() and second not in path.read_text()
    records = read_keys(path)
    assert (team_of(first, records), team_of(second, records), team_of(first + "x", records)) == ("a", "b", None)
    for team in ("Not A Slug", "../x", "files"):
        with pytest.raises(KeysError, match="--team"):
            add_key(path, team)
    path.write_text(yaml.safe_dump({"keys": [{"team": "a"}]}))
    with pytest.raises(KeysError, match="sha256"):
        read_keys(path)


def test_a_paused_job_resumes_with_its_own_spec_in_its_own_folder(tmp_path):
    out = tmp_path / "out"
    spec = load_spec({"name": "w", "base_model": "builtin:tiny", "dataset": {"uri": "d.jsonl"},
                      "output_uri": str(out / "a"), "rewards": [{"name": "exact_answer"}],
                      "hyperparameters": {"max_steps": 3}})[0]  # fmt: skip
    job = JobDir(out / "a" / "w-20261206-100000-abcdef")
    write_text_atomic(job.spec, to_yaml(spec))
    resumed = resumed_spec(job, Settings(keys=tmp_path / "k.yaml", output_uri=out))
    assert resumed.output_uri == str(out) and resumed.hyperparameters.max_steps == 3
    # what the flow run checks: the team's folder under the API's output_uri holds the job, of the same spec
    assert resume_problem(team_spec(resumed, "a"), job.job_id, "job_id") is None
