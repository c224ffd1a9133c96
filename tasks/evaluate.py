"""Evaluation and report task: held-out before/after scores, health verdict, report.md with PNG plots."""

import json

from prefect import get_run_logger, task

from tasks.stages import resumable
from trainers.evaluate import evaluate
from trainers.health import HealthMonitor
from trainers.jobdir import JobDir
from trainers.metrics import read_metrics
from trainers.report import write_report
from trainers.spec import JobSpec


@task(name="evaluate", retries=1, retry_delay_seconds=5)
@resumable("evaluate")
def evaluate_task(job: JobDir, spec: JobSpec, before_model: str, extra: dict | None = None) -> dict | None:
    """Scores the start model and the GRPO result on the held-out prompts, then writes the report.

    A one-process full fine-tune was already scored by its training child (`trainers.grpo.evaluates_in_training`);
    its `evaluation.json` is then taken as it is.
    """
    logger = get_run_logger()
    training = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    if training.get("evaluated_in_training"):
        # The training child scored its model in memory (the weights in merged/) before it exited.
        evaluation = training["evaluation"]
    else:
        evaluation = evaluate(job, spec, before_model)
    if evaluation:
        logger.info(
            "held-out %s on %d prompts: before %.3f, after %.3f",
            evaluation["metric"],
            evaluation["n"],
            evaluation["before"],
            evaluation["after"],
        )
    alerts = HealthMonitor.for_hyperparameters(spec.hyperparameters).check(read_metrics(job.metrics))
    report = write_report(job, spec, evaluation, alerts, extra)
    logger.info("report: %s", report)
    return evaluation
