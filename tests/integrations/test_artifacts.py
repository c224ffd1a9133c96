"""What a run shows in Prefect (`grpoflow.integrations.artifacts`): the progress lines' fixed format, the score in the
final state's message, artifact keys; and, read back from a real Prefect server through the client API, the report (its
plots inlined), the evaluation table, the progress artifact and the links."""

import base64
import json

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec
from grpoflow.integrations.artifacts import (
    StageProgress,
    artifact_key,
    evaluation_artifact,
    evaluation_rows,
    grpo_line,
    link_artifact,
    report_artifact,
    score_summary,
    sft_line,
)

PNG = base64.b64decode(  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class Lines(list):
    """A logger stand-in that keeps the lines it is given."""

    def info(self, line):
        self.append(line)


def flow_run_artifacts(flow_run_id) -> dict:
    """The artifacts a flow run (and its task runs) created, by key, as the server stores them."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found}


def flow_run_logs(flow_run_id) -> list[str]:
    """The messages the server holds for a flow run, its task runs' included, in order."""
    APILogWorker.drain_all(timeout=10)  # the logs still queued for the server
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


# --- the lines -------------------------------------------------------------------------------------------------------


def test_grpo_line_has_a_fixed_format():
    record = {"reward": 0.25, "reward_std": 0.4330127, "kl": 0.0012, "completions/mean_length": 5.25, "loss": 0.1}
    assert grpo_line(3, 120, record, 1.5) == (
        "step   3/120  reward 0.2500  reward_std 0.4330  kl 0.0012  mean_length 5.2  1.50 s/step  ETA 0:02:56"
    )
    # kl only when kl_coef > 0; no rate before the second step without the child's step_time.
    assert grpo_line(120, 120, {"reward": -1}, None) == (
        "step 120/120  reward -1.0000  reward_std -  kl -  mean_length -  - s/step  ETA -"
    )


def test_sft_line_has_a_fixed_format():
    assert sft_line(40, 200, {"loss": 1.23456, "learning_rate": 0.0029}, 0.05) == (
        "sft step  40/200  loss 1.2346  lr 2.9e-03  0.05 s/step  ETA 0:00:08"
    )


NO_GAIN = (
    "no checkpoint beat the starting model: the best, step 3, scored 0.05937 against the start's 0.05942; the "
    "starting model is kept (merged/ holds it)"
)


@pytest.mark.parametrize(
    "evaluation, summary",
    [
        # Scores in [0, 1]: the change in points.
        ({"metric": "exact_answer", "n": 40, "before": 0.33, "after": 0.75}, "exact_answer 0.33 -> 0.75 (+42 pts)"),
        # Any other scale: the plain difference.
        ({"metric": "close", "n": 4, "before": -2.0, "after": 3.5}, "close -2.00 -> 3.50 (+5.5)"),
        # Nothing scored: why, not NaN.
        (
            {"metric": "m", "n": 4, "before": None, "after": None, "note": "no row scored"},
            "m not scored (no row scored)",
        ),
        # No held-out prompts.
        (None, "no held-out evaluation"),
        # Equal scores: no change (was "+0 pts"); a loss under half a point: its digits (was "-0 pts").
        ({"metric": "m", "n": 4, "before": 0.0, "after": 0.0}, "m 0.00 -> 0.00 (no change)"),
        ({"metric": "m", "n": 4, "before": 0.05942, "after": 0.05937}, "m 0.06 -> 0.06 (-0.005 pts)"),
        # select: best kept a checkpoint that beat the start.
        (
            {"metric": "m", "n": 4, "before": 0.3, "after": 0.5, "select": "best", "selected_step": 4},
            "m 0.30 -> 0.50 (+20 pts, best at step 4)",
        ),
        # No checkpoint beat the start (was "m 0.06 -> 0.06 (-0 pts, best at step 3)"): the start is kept, and said.
        (
            {"metric": "m", "n": 4, "before": 0.05942, "after": 0.05942, "select": "best", "selected_step": 0}
            | {"improved": False, "trained": {"step": 3, "score": 0.05937}, "note": NO_GAIN},
            f"m 0.06 -> 0.06 (no change); {NO_GAIN}",
        ),
    ],
)
def test_score_summary(evaluation, summary):
    assert score_summary(evaluation) == summary


def test_score_summary_and_evaluation_table_carry_the_gains_interval():
    evaluation = {"metric": "exact_answer", "n": 40, "before": 0.4, "after": 0.62, "confidence": 0.95}
    evaluation["ci"] = {"before": [0.25, 0.55], "after": [0.47, 0.77], "gain": [0.12, 0.31]}
    assert score_summary(evaluation) == "exact_answer 0.40 -> 0.62 (+0.22, 95% CI +0.12 to +0.31)"
    best = evaluation | {"select": "best", "selected_step": 4}
    assert score_summary(best) == "exact_answer 0.40 -> 0.62 (+0.22, 95% CI +0.12 to +0.31, best at step 4)"
    assert evaluation_rows(evaluation)[0]["95% CI of the gain"] == "+0.12 to +0.31"
    assert "95% CI of the gain" not in evaluation_rows(evaluation | {"ci": None})[0]  # confidence: null
    # The start kept (no checkpoint beat it): no gain, so no interval of one.
    kept = evaluation | {"after": 0.4, "improved": False, "trained": {"step": 2, "score": 0.3}, "note": NO_GAIN}
    assert score_summary(kept | {"ci": {"gain": [0.0, 0.0]}}) == f"exact_answer 0.40 -> 0.40 (no change); {NO_GAIN}"


def test_keys_are_prefect_keys(make_spec):
    spec, _ = load_spec(make_spec("arith_demo.v2"))
    assert artifact_key(spec, "report") == "arith-demo-v2-report"  # outside a deployment: the spec's name


# --- on a real server ------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("prefect_server")
def test_a_deployments_run_keys_its_artifacts_by_the_deployments_name(make_spec, monkeypatch):
    import prefect.runtime.deployment
    from prefect import task
    from prefect.flow_engine import run_flow

    spec, _ = load_spec(make_spec("art"))
    asked = []
    read_flow_run = prefect.runtime.deployment._get_flow_run
    monkeypatch.setattr(prefect.runtime.deployment, "_get_flow_run", lambda i: asked.append(i) or read_flow_run(i))

    @task
    def in_a_task():
        return artifact_key(spec, "evaluation")

    @flow
    def keyed():
        return [artifact_key(spec, "report"), in_a_task(), artifact_key(spec, "training-progress")]

    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(flow_id=client.create_flow(keyed), name="Nightly Retrain")
        flow_run = client.create_flow_run_from_deployment(deployment_id)
    keys = run_flow(keyed, flow_run=flow_run)
    assert keys == ["nightly-retrain-report", "nightly-retrain-evaluation", "nightly-retrain-training-progress"]
    # Outside a deployment (the flow's own call), the spec's name, with no question to the API.
    assert keyed() == ["art-report", "art-evaluation", "art-training-progress"]
    assert asked == []


@pytest.mark.usefixtures("prefect_server")
def test_artifacts_read_back_from_the_server(tmp_path, make_spec):
    spec, _ = load_spec(make_spec("art"))
    job = JobDir(tmp_path / "runs" / "art-20261201-000000-abcdef")
    job.root.mkdir(parents=True)
    job.report.write_text(
        "# GRPO job report\n\n| metric | first |\n| --- | --- |\n| `reward` | 0.1 |\n\n![reward](reward.png)\n"
    )
    (job.root / "reward.png").write_bytes(PNG)
    evaluation = {"metric": "exact_answer", "n": 4, "before": 0.25, "after": 0.75}
    lines = Lines()

    @flow
    def shows():
        report_artifact(job, spec, str(job.root))
        evaluation_artifact(spec, job, evaluation)
        link_artifact(spec, "hub-repo", "https://huggingface.co/o/m", "o/m", "the model")
        progress = StageProgress(spec, "training", 4, lines)
        for step in range(1, 5):
            progress.update(step, f"step {step}/4")
        progress.close()

    state = shows(return_state=True)
    artifacts = flow_run_artifacts(state.state_details.flow_run_id)
    assert set(artifacts) == {"art-report", "art-evaluation", "art-hub-repo", "art-training-progress"}

    report = artifacts["art-report"]
    assert report.type == "markdown" and "| `reward` | 0.1 |" in report.data  # the table of figures
    assert f"![reward](data:image/png;base64,{base64.b64encode(PNG).decode()})" in report.data  # the plot, inlined
    assert f"Job folder: `{job.root}`" in report.data

    table = artifacts["art-evaluation"]
    assert table.type == "table"
    row = {"metric": "exact_answer", "prompts": 4, "before": 0.25, "after": 0.75, "change": "+50 pts"}
    assert [{k: r[k] for k in row} for r in json.loads(table.data)] == [row]

    assert artifacts["art-hub-repo"].data == "[o/m](https://huggingface.co/o/m)"
    progress = artifacts["art-training-progress"]
    assert progress.type == "progress" and progress.data == 100 and progress.description == "step 4/4"
    assert lines == [f"step {step}/4" for step in range(1, 5)]  # each step logged, none skipped by the throttle


def test_no_terminal_bar_without_a_terminal(make_spec, capsys):
    spec, _ = load_spec(make_spec("bar"))
    progress = StageProgress(spec, "sft", 2, Lines())
    progress.update(1, "sft step 1/2")
    progress.close()
    assert capsys.readouterr().err == ""  # stderr is no tty here: no bar, no control characters


@pytest.mark.usefixtures("prefect_server")
def test_rollouts_artifact_shows_the_best_the_worst_and_one_between(tmp_path, make_spec):
    from grpoflow.integrations.artifacts import rollouts_artifact
    from grpoflow.trainers.rollouts import step_file, write_rows

    spec, _ = load_spec(make_spec("art"))
    job = JobDir(tmp_path / "runs" / "art-20261201-000000-abcdef")
    totals = [0.5, 1.5, 0.0, 1.0, None]  # the last scored by no reward
    write_rows(
        step_file(job.rollouts, 2),
        {
            "step": [2] * 5,
            "group": [0, 0, 0, 0, 0],
            "prompt": ["# Task\nWhat is 2+2? Answer in <answer> tags, as the examples below show."] * 5,
            "completion": ["4", "<answer>4</answer>!", "iiii", "four", ""],
            "reward": totals,
            "rewards.exact_answer": [0.0, 1.0, 0.0, 1.0, None],
            "rewards.length_penalty": [0.5, 0.5, 0.0, 0.0, None],
            "advantage": [0.0, 1.2, -1.2, 0.6, 0.0],
            "completion_tokens": [2, 3, 4, 2, 1],
            "truncated": [False, False, True, False, False],
        },
    )

    @flow
    def evaluates():
        rollouts_artifact(job, spec, 3)  # a held-out evaluation at step 3: the newest kept step before it, 2
        rollouts_artifact(job, spec, 1)  # before any kept step: nothing to show

    state = evaluates(return_state=True)
    artifact = flow_run_artifacts(state.state_details.flow_run_id)["art-rollouts"]
    assert artifact.type == "table" and "at step 2" in artifact.description
    rows = json.loads(artifact.data)
    assert [(r["rollout"], r["completion"], r["reward"]) for r in rows] == [
        ("best", "<answer>4</answer>!", 1.5),
        ("between", "4", 0.5),
        ("worst", "iiii", 0.0),
    ]
    assert rows[2]["exact_answer"] == 0.0 and rows[2]["length_penalty"] == 0.0 and rows[2]["truncated"] is True
    # The UI's columns in the keys' order: the scores and the completion before what fits only with scrolling.
    assert list(rows[0])[:5] == ["rollout", "reward", "exact_answer", "length_penalty", "completion"]
    # The text as written, on one line: the default (V2) UI shows a table's cells as plain text (V1 renders them as
    # markdown, where the tags would vanish; an escaped `\<answer\>` would show its backslashes in V2).
    assert rows[0]["prompt"] == "# Task What is 2+2? Answer in <answer> tags, as the examples below show."
