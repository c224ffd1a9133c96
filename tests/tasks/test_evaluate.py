"""The evaluation task: held-out before/after scores and the report; a score the training child already made is
taken as it is."""

import json
import shutil

import pytest
import torch
from prefect import flow

from grpoflow.core.jobdir import write_json_atomic
from grpoflow.core.spec.markdown import number
from grpoflow.tasks.evaluate import evaluate_and_report, evaluate_task
from grpoflow.trainers.metrics import read_events
from grpoflow.trainers.model.tiny import build_tiny

pytestmark = pytest.mark.usefixtures("prefect_server")

TRAINING = {"wall_seconds": 2.5, "resumed_from": None}


def evaluate(job, spec, sft=None, training=TRAINING):
    return flow(lambda: evaluate_task(job, spec, sft, training, wall_seconds=12.0))()


def test_scores_the_start_model_and_merged_and_writes_the_report(make_job):
    job, spec = make_job("ev")  # holdout 4
    shutil.copytree(build_tiny(), job.merged)  # "trained" weights equal to the base: the same score before and after
    evaluation = evaluate(job, spec)
    assert evaluation["metric"] == "exact_answer" and evaluation["n"] == 4
    assert evaluation["before"] == evaluation["after"]
    assert evaluation["improved"] is False and evaluation["note"].startswith("no checkpoint beat the starting model")
    assert json.loads(job.evaluation.read_text()) == evaluation
    report = job.report.read_text()
    assert "exact_answer" in report and "2.5 s" in report  # the scores' metric and the training time


def test_takes_the_training_childs_evaluation(make_job):
    job, spec = make_job("child")
    in_child = {"metric": "exact_answer", "n": 4, "before": 0.25, "after": 0.75}
    write_json_atomic(job.training_result, {"evaluated_in_training": True, "evaluation": in_child})
    # No merged/ to load: the task must not score again.
    assert evaluate(job, spec) == in_child
    assert "+50.0 points" in job.report.read_text()  # 0.25 -> 0.75, as the child scored it


def test_reports_the_warm_up(make_job):
    job, spec = make_job("warm", sft={"enabled": True})
    in_child = {"metric": "exact_answer", "n": 4, "before": 0.0, "after": 0.5}
    write_json_atomic(job.training_result, {"evaluated_in_training": True, "evaluation": in_child})
    evaluate(job, spec, sft={"seconds": 3.25})
    assert "3.2 s" in job.report.read_text()  # the SFT warm-up's time, in the report


# --- no regression: select: best keeps the start when no checkpoint beat it


def perturbed_tiny(folder):
    """builtin:tiny with noise on its weights: another model, with other completions."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(build_tiny(), folder)
    weights = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    # Ten times the weights' own scale (0.02): less leaves its greedy completions as they were.
    noisy = {k: v + 0.2 * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
    save_file(noisy, folder / "model.safetensors", metadata={"format": "pt"})


def start_better_than_merged(job, spec):
    """sft/ (the start) and merged/ (the GRPO result, as the merge stage leaves it): two different models, the
    start the better by the held-out metric; returns (start's score, merged's)."""
    from datasets import load_from_disk

    from grpoflow.trainers.evaluate import score
    from grpoflow.trainers.model.load import prepare_prompts

    shutil.copytree(build_tiny(), job.sft)
    perturbed_tiny(job.merged)
    rows = prepare_prompts(load_from_disk(str(job.dataset))["eval"], spec.dataset.prompt_column, None)
    start, merged = score(str(job.sft), rows, spec), score(str(job.merged), rows, spec)
    assert start != merged
    if merged > start:  # the better model is the start
        job.sft.rename(job.root / "swap")
        job.merged.rename(job.sft)
        (job.root / "swap").rename(job.merged)
    return max(start, merged), min(start, merged)


def test_select_best_keeps_the_start_that_no_checkpoint_beat(make_job):
    """A LoRA job's (or a several-process one's) evaluation stage, after GRPO and the merge recorded their outputs:
    the start is kept in merged/, everything that shows the score says so, and a resume redoes nothing."""
    from safetensors.torch import load_file

    from grpoflow.integrations.artifacts import completed_message, evaluation_rows
    from grpoflow.integrations.stages import output_digest, record, stage_key
    from grpoflow.tasks.gate import gate_task
    from grpoflow.tasks.merge import merge_task
    from grpoflow.tasks.train import train_task
    from grpoflow.trainers.model.merge import write_model_json

    metric = {"name": "text_hash", "function": "tests.trainers.test_evaluate:text_hash"}  # differs as texts do
    job, spec = make_job(
        "keep", sft={"enabled": True}, evaluation={"holdout": 4, "every": 1, "select": "best", "metric": metric}
    )
    start, trained = start_better_than_merged(job, spec)
    write_json_atomic(job.training_result, {"global_step": 3, "selected_step": 2})
    write_model_json(job)
    for stage, reads, paths in (
        ("train", ("ingest", "sft"), ("training.json", "merged")),
        ("merge", ("train",), ("model.json", "merged")),
    ):
        record(job, stage, stage_key(spec, stage, {up: output_digest(job, up) for up in reads}), {}, paths)

    evaluation = evaluate(job, spec)

    # evaluation.json: the start kept (was: merged/ kept, "best at step 2", after below before).
    assert evaluation["selected_step"] == 0 and evaluation["after"] == evaluation["before"] == start
    assert evaluation["improved"] is False and evaluation["trained"] == {"step": 2, "score": trained}
    note = f"no checkpoint beat the starting model: the best, step 2, scored {number(trained)} against the start's"
    assert evaluation["note"] == f"{note} {number(start)}; the starting model is kept (merged/ holds it)"
    assert json.loads(job.evaluation.read_text()) == evaluation
    kept, started = load_file(job.merged / "model.safetensors"), load_file(job.sft / "model.safetensors")
    assert kept.keys() == started.keys() and all(torch.equal(kept[k], started[k]) for k in kept)
    assert evaluation_rows(evaluation)[0]["model kept"] == "the starting model (step 0)"  # the table artifact's
    # The alert, with its evidence.
    [alert] = [e["payload"] for e in read_events(job.events) if e["event"] == "grpoflow.training.alert"]
    assert alert["kind"] == "no_improvement" and alert["message"] == evaluation["note"]
    assert alert["evidence"] | {"start_score": start, "trained_score": trained, "kept": "start"} == alert["evidence"]
    # The report.
    report = job.report.read_text()
    assert "**Model kept:** the starting model (step 0): no checkpoint beat its held-out text_hash" in report
    assert f"**No improvement:** {evaluation['note']}." in report
    # A resume skips GRPO, the merge and this evaluation: merged/ is the stages' own now.
    stages = (train_task.fn.resumable, merge_task.fn.resumable, evaluate_and_report.resumable)
    assert all(stage.is_done(job, spec) for stage in stages)

    # The default gate (min_gain 0): nothing published or deployed, the reason named.
    decision = flow(lambda: gate_task(job, spec, evaluation))()
    assert not decision["promote"] and decision["kind"] == "no_improvement"
    [rejected] = [e["payload"] for e in read_events(job.events) if e["event"] == "grpoflow.model.rejected"]
    assert rejected["reason"] == "no_improvement" and rejected["message"].startswith("no checkpoint beat the start")
    # The run's final state message (was "completed: variety 0.xx -> 0.yy (-n pts, best at step 2); healthy").
    message = completed_message(job, spec, evaluation)
    assert f"(no change); {evaluation['note']}; " in message and "best at step" not in message
    assert message.endswith(f"; not promoted: {decision['reason']}")


# --- evaluation.suites: inspect-ai tasks on the start and the kept model


def write_suite(folder) -> str:
    """An inspect-ai task on a local dataset of 4 samples, scored by `includes()`: two targets are empty (every answer
    includes them), two no model writes; so accuracy is 0.5 for any model, whatever it answers."""
    folder.mkdir()
    rows = [{"input": f"What is {i}+{i}?", "target": "" if i % 2 else "no-model-writes-this"} for i in range(4)]
    (folder / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "sums.py").write_text(
        "from pathlib import Path\n"
        "from inspect_ai import Task, task\n"
        "from inspect_ai.dataset import json_dataset\n"
        "from inspect_ai.scorer import includes\n"
        "from inspect_ai.solver import generate\n\n\n"
        "@task\n"
        "def sums(data='sums.jsonl'):\n"
        "    dataset = json_dataset(str(Path(__file__).with_name(data)))\n"
        "    return Task(dataset=dataset, solver=generate(), scorer=includes())\n\n\n"
        "@task\n"
        "def broken():\n"
        "    return sums('missing.jsonl')\n"
    )
    return f"{folder / 'sums.py'}@sums"


@pytest.mark.slow
def test_runs_the_suites_on_the_start_and_the_kept_model(make_job, tmp_path):
    from inspect_ai.log import read_eval_log
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from grpoflow.integrations.artifacts import artifact_key
    from grpoflow.trainers.model.tiny import resolve_model_path

    suite = write_suite(tmp_path / "evals")
    broken = suite.replace("@sums", "@broken")  # its dataset is missing: its row says so, the job goes on
    # holdout 0: no held-out scores to take first (the suites run with or without them)
    job, spec = make_job("suites", evaluation={"holdout": 0, "suites": [{"inspect": suite}, {"inspect": broken}]})
    perturbed_tiny(job.merged)  # the kept model: another model than the start (builtin:tiny)
    evaluate(job, spec)

    [entry, failed] = json.loads(job.suites.read_text())["suites"]
    assert failed["error"].startswith("FileNotFoundError") and "missing.jsonl" in failed["error"]
    assert failed["metrics"] == [] and failed["logs"] == {"start": None, "kept": None}
    assert entry["suite"] == suite and entry["samples"] == 4 and entry["error"] is None
    [accuracy] = entry["metrics"]
    assert accuracy | {"scorer": "includes", "metric": "accuracy", "start": 0.5, "kept": 0.5} == accuracy
    assert accuracy["change"] == 0.0
    # Each model ran through inspect-ai's hf/ provider, loaded from its own folder.
    for side, folder in (("start", resolve_model_path("builtin:tiny")), ("kept", str(job.merged))):
        log = read_eval_log(str(job.root / entry["logs"][side]), header_only=True)
        assert log.status == "success" and log.eval.model == f"hf/{job.job_id}/{side}"
        assert log.eval.model_args["model_path"] == folder
    # The report's table and the artifact's.
    report = job.report.read_text()
    assert "## Evaluation suites\n\n| suite | metric | start | kept | change |" in report
    assert f"| {suite} | includes accuracy | 50.0% | 50.0% | no change |" in report
    assert f"| {broken} | failed: FileNotFoundError" in report
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(spec, "suites")])), limit=1
        )
    assert json.loads(artifact.data)[0] == {
        "suite": suite,
        "metric": "includes accuracy",
        "start": 0.5,
        "kept": 0.5,
        "change": 0.0,
    }
