"""The evaluation task: held-out before/after scores and the report; a score the training child already made is
taken as it is."""

import json
import shutil

import pytest
from prefect import flow

from grpoflow.tasks.evaluate import evaluate_task
from grpoflow.trainers.jobdir import write_json_atomic
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
