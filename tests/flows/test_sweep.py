"""Sweeps (flows/sweep.py, `grpoflow sweep`): the grid's expansion and validation, the report, and real sweeps of
builtin:tiny jobs against a real Prefect server (a failing job fails its row, not the sweep; the concurrency limit)."""

import json
from pathlib import Path

import pytest
import yaml
from prefect.artifacts import Artifact
from prefect.utilities.callables import parameter_schema

from grpoflow.core.spec import SpecError
from grpoflow.flows.errors import UsageError
from grpoflow.flows.sweep import (
    best_row,
    compared_jobs,
    grid_overrides,
    grpo_sweep,
    new_sweep_id,
    parse_grid,
    report_markdown,
    sweep_key,
)
from tests.conftest import cli

BASE = {
    "name": "s",
    "base_model": "builtin:tiny",
    "dataset": {"uri": "examples/data/arithmetic.jsonl"},
    "rewards": [{"name": "exact_answer"}],
}


# --- the grid


@pytest.mark.parametrize(
    "options, expected",
    [
        # values parsed as --set parses them: numbers, strings, booleans
        (["hyperparameters.learning_rate=1e-5,3e-5"], {"hyperparameters.learning_rate": [1e-5, 3e-5]}),
        (["trl.loss_type=grpo, dr_grpo"], {"trl.loss_type": ["grpo", "dr_grpo"]}),
        (
            ["sft.enabled=true,false", "hyperparameters.max_steps=5"],
            {"sft.enabled": [True, False], "hyperparameters.max_steps": [5]},
        ),
        # a quoted number stays a string
        (['name="2024",b'], {"name": ["2024", "b"]}),
    ],
)
def test_parse_grid(options, expected):
    assert parse_grid(options) == expected


@pytest.mark.parametrize(
    "options, message",
    [
        (["hyperparameters.learning_rate"], "expected key=value1,value2"),  # no values
        (["hyperparameters.learning_rate=1e-5,"], "expected key=value1,value2"),  # an empty value
        (["=1,2"], "expected key=value1,value2"),  # no key
        (["hyperparameters.seed=1", "hyperparameters.seed=2"], "given twice"),
    ],
)
def test_parse_grid_rejects(options, message):
    with pytest.raises(SpecError, match=message):
        parse_grid(options)


def test_grid_is_the_cartesian_product_in_order():
    grid = {"hyperparameters.learning_rate": [1e-5, 3e-5], "trl.loss_type": ["grpo", "dr_grpo", "dapo"]}
    combinations = grid_overrides(BASE, grid)
    assert len(combinations) == 6
    assert combinations[0] == {"hyperparameters.learning_rate": 1e-5, "trl.loss_type": "grpo"}
    assert combinations[-1] == {"hyperparameters.learning_rate": 3e-5, "trl.loss_type": "dapo"}


@pytest.mark.parametrize(
    "grid, problems",
    [
        # one bad value: only its combinations are named, each with the spec's own message
        (
            {"hyperparameters.learning_rate": [1e-5, -1], "hyperparameters.seed": [1]},
            [
                "combination hyperparameters.learning_rate=-1, hyperparameters.seed=1: hyperparameters.learning_rate: "
                "must be > 0 (got -1)"
            ],
        ),
        # a key that is not a spec path: said once, with the closest valid name
        (
            {"hyperparameters.learning_rat": [1e-5, 3e-5]},
            ["every combination: hyperparameters.learning_rat: unknown key (did you mean 'learning_rate'?)"],
        ),
        # a path through a value that is not a mapping
        ({"name.first": ["a"]}, ["combination name.first=a: --set 'name.first=\"a\"': name is not a mapping or list"]),
        # a key with no values
        ({"hyperparameters.seed": []}, ["grid.hyperparameters.seed: give at least one value"]),
        ({}, ["--grid: give at least one grid, e.g. --grid hyperparameters.learning_rate=1e-5,3e-5"]),
    ],
)
def test_grid_validation(grid, problems):
    with pytest.raises(SpecError) as e:
        grid_overrides(BASE, grid)
    assert e.value.problems == problems


# --- the report


def row(index, status="completed", before=0.25, after=0.5, job_id=None):
    evaluation = {"metric": "exact_answer", "n": 4, "before": before, "after": after}
    return {
        "index": index, "values": {"hyperparameters.seed": index}, "job_id": job_id or f"s-{index}", "status": status,
        "message": "" if status == "completed" else "boom", "evaluation": evaluation, "final_reward": 0.5,
        "wall_seconds": 12.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    "rows, best",
    [
        ([row(1, after=0.5), row(2, after=0.75)], "s-2"),  # the highest score of the kept model
        ([row(1, before=0.0, after=0.5), row(2, before=0.5, after=0.6)], "s-2"),  # ranked by it, not by the gain
        ([row(1, before=0.25, after=0.5), row(2, before=0.0, after=0.5)], "s-2"),  # same score: the higher gain
        ([row(1, after=0.5), row(2, status="failed", after=1.0)], "s-1"),  # a failed job is never best
        ([row(1, before=None, after=None), row(2, after=0.3)], "s-2"),  # nor an unscored one
        ([row(1, status="failed")], None),
        ([row(1, before=0.0, after=0.0), row(2, before=0.0, after=0.0)], None),  # a tie names no best (was s-1)
        ([row(1, after=0.3 + 1e-12), row(2, after=0.3)], None),  # float noise is no lead either
        ([row(1, before=0.0, after=0.0), row(2, before=0.0, after=0.0), row(3, after=0.3)], "s-3"),  # ahead alone
    ],
)
def test_best_job(rows, best):
    found = best_row(rows)
    assert (found["job_id"] if found else None) == best


def unscored(index):
    return {**row(index), "evaluation": None}


@pytest.mark.parametrize(
    "rows, baseline, jobs, left_out",
    [
        ([row(1), row(2), row(3)], None, ["s-1", "s-2", "s-3"], []),  # every job, in grid order
        ([row(1), row(2), row(3)], "s-3", ["s-3", "s-1", "s-2"], []),  # --baseline first, the rest in grid order
        ([row(1, "failed"), row(2), row(3)], None, ["s-2", "s-3"], ["job 1 (s-1): failed"]),  # only completed jobs
        ([row(1), unscored(2)], None, ["s-1"], ["job 2 (s-2): no held-out evaluation"]),  # only scored ones
        ([row(1), {**row(2, "failed"), "job_id": None}], None, ["s-1"], ["job 2 (never started): failed"]),
    ],
)
def test_sweep_compare_takes_the_completed_scored_jobs(rows, baseline, jobs, left_out):
    assert compared_jobs({"sweep_id": "s", "jobs": rows}, baseline) == (jobs, left_out)


def test_sweep_compare_baseline_must_be_a_compared_job():
    with pytest.raises(UsageError, match="--baseline 's-1' is not one of sweep s's completed, scored jobs: s-2"):
        compared_jobs({"sweep_id": "s", "jobs": [row(1, "failed"), row(2)]}, "s-1")


def test_report_table_marks_the_best_and_the_failed():
    markdown = report_markdown("s-sweep-x", [row(1), row(2, status="failed", after=1.0)], "exact_answer")
    lines = markdown.splitlines()
    assert "2 jobs, 1 completed, 1 failed." in lines
    header = next(line for line in lines if line.startswith("| rank | hyperparameters.seed"))
    assert header.split(" | ")[2:] == [
        "job",
        "status",
        "held-out before → after",
        "model kept",
        "final reward",
        "wall time",
        "best |",
    ]
    [first] = [line for line in lines if "s-1" in line]
    assert "0.250 → 0.500 (+25 pts)" in first and "★ best" in first and "0.500" in first and "12 s" in first
    [second] = [line for line in lines if "s-2" in line]
    assert "failed (boom)" in second and "★" not in second


def test_final_reward_and_report_on_s3(bucket, tmp_path):
    import s3fs

    from grpoflow.flows.sweep import final_reward, write_report

    fs = s3fs.S3FileSystem()
    records = [{"step": 1, "values": {"reward": 0.25}}, {"step": 2, "values": {"reward": 0.75, "loss": 0.1}}]
    fs.pipe(f"{bucket}/runs/s-1/metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
    assert final_reward(f"s3://{bucket}/runs/s-1/metrics.jsonl") == 0.75
    assert final_reward(f"s3://{bucket}/runs/s-2/metrics.jsonl") is None  # a job that never trained
    assert final_reward(str(tmp_path / "none.jsonl")) is None
    folder = write_report(f"s3://{bucket}/runs", "s-sweep-x", [row(1), row(2, status="failed")])
    assert folder == f"s3://{bucket}/runs/sweeps/s-sweep-x"
    assert json.loads(fs.cat(f"{bucket}/runs/sweeps/s-sweep-x/sweep.json"))["best"] == "s-1"
    assert "★ best" in fs.cat(f"{bucket}/runs/sweeps/s-sweep-x/sweep.md").decode()


def test_the_flow_parameters_have_descriptions():
    properties = parameter_schema(grpo_sweep).model_dump_for_openapi()["properties"]
    for name in ("spec", "grid", "max_concurrent", "deployment", "sweep_id"):
        assert properties[name].get("description"), name


# --- the CLI: a rejected sweep starts nothing


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grid", "hyperparameters.learning_rate=1e-3,-1"], "combination hyperparameters.learning_rate=-1"),
        (["--grid", "hyperparameters.learnig_rate=1e-3"], "hyperparameters.learnig_rate: unknown key"),
        (["--grid", "hyperparameters.seed"], "--grid 'hyperparameters.seed': expected key=value1,value2"),
        ([], "--grid: give at least one grid"),
        (["--grid", "hyperparameters.seed=1", "--max-concurrent", "0"], "--max-concurrent: '0' is not an integer"),
        # the preflight, per combination: a model that is not there
        (["--grid", "base_model=builtin:tiny,/no/such/model"], "combination base_model=/no/such/model: base_model"),
    ],
)
def test_sweep_rejected_before_anything_runs(make_spec, tmp_path, monkeypatch, args, message):
    import grpoflow.integrations.prefect_server

    def no_server(*args, **kwargs):
        raise AssertionError("the Prefect server started for a sweep that should have been rejected")

    monkeypatch.setattr(grpoflow.integrations.prefect_server, "start_if_needed", no_server)
    code, out, err = cli("sweep", make_spec(), *args)
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.usefixtures("prefect_server")
def test_sweep_on_a_deployment_the_server_lacks_fails_every_row(make_spec, tmp_path):
    from grpoflow.core.spec import load_spec

    spec, _ = load_spec(make_spec("dep"))
    grid = {"hyperparameters.seed": [1, 2]}
    state = grpo_sweep(spec, grid, max_concurrent=2, deployment="no-such-deployment", return_state=True)
    assert state.is_failed() and state.message.startswith("2 of 2 jobs failed")
    [folder] = (tmp_path / "runs" / "sweeps").iterdir()
    rows = json.loads((folder / "sweep.json").read_text())["jobs"]
    assert [r["status"] for r in rows] == ["failed", "failed"] and all(r["job_id"] is None for r in rows)
    assert all("ObjectNotFound" in r["message"] for r in rows), rows[0]["message"]
    assert not list((tmp_path / "runs").glob("dep-*"))  # no job ran here


@pytest.mark.usefixtures("prefect_server")
def test_a_spec_as_a_deployment_passes_it_is_checked_by_the_sweep(make_spec, tmp_path):
    """The spec as a deployment's run passes it (its JSON, not a JobSpec) with a mistake no schema can check (two
    rewards of one name): the sweep's run ends Rejected, naming it, with no job started (Prefect's own parameter
    check ended it Failed). The same spec without the mistake is taken: its one job is tried (and fails here, on a
    deployment the server lacks)."""
    spec = yaml.safe_load(make_spec("form").read_text())
    grid = {"hyperparameters.seed": [1]}
    twice = {**spec, "rewards": [*spec["rewards"], spec["rewards"][0]]}
    state = grpo_sweep(twice, grid, deployment="no-such-deployment", return_state=True)
    assert state.name == "Rejected", state
    assert "rewards[2].name: duplicate reward name 'exact_answer'" in state.message, state.message
    assert not (tmp_path / "runs").exists()
    state = grpo_sweep(spec, grid, deployment="no-such-deployment", return_state=True)
    assert state.is_failed() and state.message.startswith("1 of 1 jobs failed"), state
    [folder] = (tmp_path / "runs" / "sweeps").iterdir()
    assert folder.name.startswith("form-sweep-")


def test_sweep_on_a_deployment_needs_a_server(make_spec, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: None}):
        code, _, err = cli("sweep", make_spec(), "--grid", "hyperparameters.seed=1,2", "--deployment", "retrain")
    assert code == 2 and "PREFECT_API_URL is not set" in err


# --- real sweeps

# A factory reward (kwargs from the spec, so a grid can vary them): a negative scale raises in training, never in the
# dry run (no trainer_state there), so the job passes every check and fails in its GRPO stage.
SCALED_REWARD = """
def get_scaled_reward(scale=1.0):
    def scaled_reward(completions, trainer_state=None, **kwargs):
        if trainer_state is not None and scale < 0:
            raise ValueError("a negative scale")
        return [scale * (len(c) <= 4) for c in completions]

    return scaled_reward
"""


@pytest.mark.usefixtures("prefect_server", "standin")
def test_sweep_a_failed_job_fails_its_row_not_the_sweep(make_spec, tmp_path, monkeypatch):
    (tmp_path / "sweep_rewards.py").write_text(SCALED_REWARD)
    monkeypatch.chdir(tmp_path)
    spec = make_spec(
        "sw",
        rewards=[{"name": "exact_answer"}, {"function": "sweep_rewards:get_scaled_reward", "kwargs": {"scale": 1}}],
        hyperparameters={"max_steps": 2},
    )
    code, out, err = cli("sweep", spec, "--grid", "rewards.1.kwargs.scale=1,-1,0.5", "--max-concurrent", "2", "--json")
    assert code == 1, err
    summary = json.loads(out)
    assert summary["status"] == "failed"
    rows = summary["jobs"]
    assert [r["values"] for r in rows] == [{"rewards.1.kwargs.scale": s} for s in (1, -1, 0.5)]
    assert [r["status"] for r in rows] == ["completed", "failed", "completed"]

    # Each completed row: its job folder, its held-out scores and its final reward, as the job wrote them.
    for r in (rows[0], rows[2]):
        job = Path(r["output_dir"])
        assert job.name == r["job_id"] and job.parent == tmp_path / "runs"
        assert r["evaluation"] == json.loads((job / "evaluation.json").read_text())
        last = json.loads((job / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["step"] == 2 and r["final_reward"] == last["values"]["reward"]
    # The failed row: its job's own end (job.failed), its state's message, no scores.
    failed = Path(rows[1]["output_dir"])
    assert json.loads((failed / "events.jsonl").read_text().splitlines()[-1])["event"] == "grpoflow.job.failed"
    assert "a negative scale" in (failed / "logs" / "train.log").read_text()
    assert "RewardFailed" in rows[1]["message"] and "a negative scale" in rows[1]["message"]
    assert rows[1]["evaluation"] is None
    # The best job, unless the two completed jobs tie (the same score and gain): then none, and both are named.
    ranking = lambda r: (r["evaluation"]["after"], r["evaluation"]["after"] - r["evaluation"]["before"])
    tied = ranking(rows[0]) == ranking(rows[2])
    assert summary["best"] == (None if tied else max(rows[0], rows[2], key=ranking)["job_id"])
    assert summary["tied"] == ([rows[0]["job_id"], rows[2]["job_id"]] if tied else [])

    # Never more than 2 jobs at once, and 2 did run at once (the limit is a limit, not a queue of one).
    moments = sorted([(r["started"], 1) for r in rows] + [(r["ended"], -1) for r in rows])
    running, most = 0, 0
    for _, change in moments:
        running += change
        most = max(most, running)
    assert most == 2

    # The report: files under <output_uri>/sweeps/<sweep_id>/, and the Prefect artifacts of the sweep's name.
    folder = tmp_path / "runs" / "sweeps" / summary["sweep_id"]
    assert Path(summary["report_dir"]) == folder
    assert json.loads((folder / "sweep.json").read_text())["jobs"] == rows
    markdown = (folder / "sweep.md").read_text()
    assert "3 jobs, 2 completed, 1 failed." in markdown and markdown.count("★ best") == (0 if tied else 1)
    assert ("No best job: 2 jobs tie for first" in markdown) is tied
    artifact = Artifact.get("sw-sweep")
    assert artifact is not None and summary["sweep_id"] in artifact.data and ("★ best" in artifact.data) is not tied
    table = Artifact.get("sw-sweep-table")
    cells = json.loads(table.data) if isinstance(table.data, str) else table.data
    # Ranked: the completed jobs by their held-out score (equal here: grid order, one shared rank), the failed last.
    assert [c["status"].split(" ")[0] for c in cells] == ["completed", "completed", "failed"]
    assert [c["rank"] for c in cells] == ["1", "1" if tied else "2", "—"]
    assert [c["job"] for c in cells] == [rows[0]["job_id"], rows[2]["job_id"], rows[1]["job_id"]]
    # `grpoflow sweep compare`: the completed jobs as `grpoflow compare` puts them side by side, the failed one named.
    completed = [rows[0]["job_id"], rows[2]["job_id"]]
    code, out, err = cli("sweep", "compare", summary["sweep_id"], "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(cli("compare", *completed, "--json")[1])
    assert f"left out job 2 ({rows[1]['job_id']}): failed" in err
    code, out, err = cli("sweep", "compare", summary["sweep_id"], "--baseline", completed[1], "--json")
    assert code == 0 and json.loads(out)["jobs"] == completed[::-1], err
    code, out, err = cli("sweep", "compare", "sw-sweep-20261206-000000-abcdef")
    assert code == 2 and "no sweep 'sw-sweep-20261206-000000-abcdef' under" in err
    # `grpoflow jobs` still lists the jobs, not the sweeps folder
    code, out, _ = cli("jobs", "--json")
    assert code == 0 and {j["job_id"] for j in json.loads(out)["jobs"]} >= {rows[0]["job_id"], rows[2]["job_id"]}
    assert yaml.safe_load((Path(rows[0]["output_dir"]) / "spec.yaml").read_text())["rewards"][1]["kwargs"] == {
        "scale": 1
    }


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server", "standin")
def test_sweep_as_flow_runs_of_a_deployment(make_spec, tmp_path):
    """With `deployment`, each job is a flow run of that grpo-pipeline deployment (here served by a process of its
    own, as a worker would run it), named after its job id; a job its run rejects is a rejected row."""
    import os
    import subprocess
    import sys
    import time

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    from grpoflow.core.spec import load_spec

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serve = "from grpoflow.flows.pipeline import grpo_pipeline; grpo_pipeline.serve(name='sweep-test', limit=2)"
    server = subprocess.Popen([sys.executable, "-c", serve], env=env, cwd=Path(__file__).parents[2])
    try:
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.read_deployment_by_name("grpo-pipeline/sweep-test")
                    break
                except ObjectNotFound:
                    assert time.monotonic() < deadline and server.poll() is None, "the deployment was never served"
                    time.sleep(1)
        spec, _ = load_spec(make_spec("dep", hyperparameters={"max_steps": 2}))
        grid = {"dataset.uri": [spec.dataset.uri, str(tmp_path / "missing.jsonl")]}
        state = grpo_sweep(spec, grid, max_concurrent=2, deployment="sweep-test", return_state=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert state.is_failed() and state.message.startswith("1 of 2 jobs failed"), state.message
    [folder] = (tmp_path / "runs" / "sweeps").iterdir()
    rows = json.loads((folder / "sweep.json").read_text())["jobs"]
    assert [r["status"] for r in rows] == ["completed", "rejected"]
    assert "missing.jsonl" in rows[1]["message"]
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        names = FlowRunFilter(name=FlowRunFilterName(any_=[r["job_id"] for r in rows]))
        children = client.read_flow_runs(flow_run_filter=names)
    assert len(children) == 2 and all(c.parent_task_run_id for c in children)  # the sweep's subflows in the UI
    job = tmp_path / "runs" / rows[0]["job_id"]
    assert rows[0]["evaluation"] == json.loads((job / "evaluation.json").read_text())
    assert rows[0]["final_reward"] is not None


def test_report_says_jobs_tie_instead_of_naming_a_best(tmp_path):
    from grpoflow.flows.sweep import summary_line, write_report

    rows = [row(1, before=0.0, after=0.0), row(2, status="failed"), row(3, before=0.0, after=0.0)]
    markdown = report_markdown("s", rows, "exact_answer")
    # Was: s-1 "★ best" with "0.000 → 0.000 (+0 pts)".
    assert "★" not in markdown and "No best job: 2 jobs tie for first at 0.000 → 0.000 (no change)." in markdown
    lines = [line for line in markdown.splitlines() if "| s-" in line]
    assert [line.split(" | ")[0] for line in lines] == ["| 1", "| 1", "| —"]  # the tied share the first place
    assert all(line.endswith("| tied for first |") for line in lines[:2])
    assert summary_line(rows) == "no best: s-1, s-3 tie at 0.000 → 0.000 (no change)"  # the run's final message
    summary = json.loads((Path(write_report(str(tmp_path), "s", rows)) / "sweep.json").read_text())
    assert summary["best"] is None and summary["tied"] == ["s-1", "s-3"]


def test_report_ranks_by_the_kept_models_score():
    kept = lambda r, step, select: r | {"evaluation": r["evaluation"] | {"selected_step": step, "select": select}}
    rows = [kept(row(1, after=0.5), 6, "last"), row(2, status="failed"), kept(row(3, after=0.75), 4, "best")]
    lines = [line for line in report_markdown("s", rows, "exact_answer").splitlines() if "| s-" in line]
    assert [line.split(" | ")[0] for line in lines] == ["| 1", "| 2", "| —"]  # best first, the failed job last
    assert "s-3" in lines[0] and "step 4 (best)" in lines[0] and "★" in lines[0]
    assert "s-1" in lines[1] and "step 6 (last)" in lines[1] and "s-2" in lines[2]


# --- names


@pytest.mark.parametrize(
    "name, sweep_id, key",
    [
        ("sw", "sw-sweep-", "sw-sweep"),  # a spec's name, "sweep" added
        ("lr-sweep", "lr-sweep-", "lr-sweep"),  # read lr-sweep-sweep-<time> before: the name says sweep already
        ("sweep-example", "sweep-example-", "sweep-example"),  # deployments/prefect.yaml's sweep: "sweep" is a word
        ("sweeper", "sweeper-sweep-", "sweeper-sweep"),  # "sweep" inside a word is not the word
        ("LR_Sweep", "LR_Sweep-", "lr-sweep"),  # any case and separator; the key in the letters Prefect takes
    ],
)
def test_a_sweep_says_sweep_once(name, sweep_id, key):
    made = new_sweep_id(name)
    assert made.startswith(sweep_id) and made.removeprefix(sweep_id)[:8].isdigit()
    assert (sweep_key(name), sweep_key(name, table=True)) == (key, f"{key}-table")


@pytest.mark.usefixtures("prefect_server", "standin")
def test_a_sweep_named_sweep_reads_sweep_once(make_spec, tmp_path):
    code, out, err = cli("sweep", make_spec("lr-sweep"), "--grid", "hyperparameters.seed=1", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["sweep_id"].startswith("lr-sweep-2") and "sweep-sweep" not in out + err
    assert [p.name for p in (tmp_path / "runs" / "sweeps").iterdir()] == [summary["sweep_id"]]
    assert Artifact.get("lr-sweep") is not None and Artifact.get("lr-sweep-table") is not None
