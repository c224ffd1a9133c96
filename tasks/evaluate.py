"""Evaluation and report task: held-out before/after scores (`grpoflow.trainers.evaluate`), the evaluation suites on
the start and the kept model (`grpoflow.trainers.suites`), health verdict, report.md with PNG plots
(`grpoflow.jobs.report`), and all as Prefect artifacts (`grpoflow.integrations.artifacts`). A GRPO
result that did not beat the start model emits `grpoflow.training.alert` (`no_improvement`)."""

import json
import os
import time
from functools import partial

from prefect import get_run_logger, task

from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import EVAL_SECONDS
from grpoflow.core.spec import JobSpec
from grpoflow.core.spec.markdown import number
from grpoflow.integrations.artifacts import evaluation_artifact, report_artifact, rollouts_artifact, suites_artifact
from grpoflow.integrations.events import emit
from grpoflow.integrations.job_folders import job_location
from grpoflow.integrations.stages import cancellable, rerecord, resumable
from grpoflow.jobs.report import RUN_STARTED_ENV, write_report
from grpoflow.tasks import RETRY_DELAY_S
from grpoflow.tasks.merge import merge_task
from grpoflow.tasks.train import train_task
from grpoflow.trainers.evaluate import evaluate, no_improvement_alert
from grpoflow.trainers.health import HealthMonitor
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.load import start_model
from grpoflow.trainers.rollouts import degenerate_example
from grpoflow.trainers.suites import run_suites


def held_out_seconds(job: JobDir) -> float | None:
    """The seconds GRPO's process spent on held-out scores during training (`evaluation.every`); None without any."""
    seconds = [r["values"][EVAL_SECONDS] for r in read_metrics(job.metrics) if EVAL_SECONDS in r["values"]]
    return sum(s for s in seconds if isinstance(s, int | float)) if seconds else None


def times(
    sft: dict | None, training: dict, evaluation: dict | None, wall_seconds: float, during: float | None = None
) -> list[tuple]:
    """The report's "Time" rows: each stage's share of what the user waited, from the stages' own summaries (the
    payloads of their events), and the total since `grpoflow run` started (`GRPOFLOW_RUN_STARTED`, which the CLI
    sets) or, without it (a deployment's run), since the flow run started."""
    rows = []
    cli_started = os.environ.get(RUN_STARTED_ENV)
    total = time.time() - float(cli_started) if cli_started else wall_seconds
    if cli_started:
        rows.append(("grpoflow's start and Prefect's, before the flow ran", total - wall_seconds))
    if sft:
        rows.append(("SFT warm-up (its child process)", sft["seconds"]))
    rows += [
        ("GRPO: imports and model load", training.get("setup_seconds")),
        ("GRPO: training (TRL's train_runtime)", training.get("train_runtime")),
        *([("GRPO: of which held-out scores during training", during)] if during is not None else []),
        ("GRPO: its whole child process", training.get("wall_seconds")),
    ]
    if evaluation:
        rows.append(("held-out evaluation, before and after", evaluation.get("seconds")))
    rows.append(("wall time until this report" + (" (since grpoflow run started)" if cli_started else ""), total))
    return rows


@task(name="evaluate", retries=1, retry_delay_seconds=RETRY_DELAY_S)
@cancellable
def evaluate_task(
    job: JobDir, spec: JobSpec, sft: dict | None, training: dict, wall_seconds: float = 0.0
) -> dict | None:
    """Scores the start model and the GRPO result on the held-out prompts and writes the report (`evaluate_and_report`,
    skipped when a resumed job already has them), then shows both in Prefect as artifacts, on every run."""
    evaluation = evaluate_and_report(job, spec, sft, training, wall_seconds)
    report_artifact(job, spec, job_location(job, spec))
    evaluation_artifact(spec, job, evaluation)
    suites_artifact(spec, job, suite_results(job))
    if evaluation and not spec.evaluation.every:  # with every > 0, training showed each evaluation's, the last too
        rollouts_artifact(job, spec, training.get("global_step") or 0)
    return evaluation


def suite_results(job: JobDir) -> dict | None:
    """suites.json (`grpoflow.trainers.suites.run_suites`); None when the job ran no suites."""
    return json.loads(job.suites.read_text()) if job.suites.exists() else None


@resumable(
    "evaluate",
    outputs=("report.md",),
    reads=("ingest", "sft", "merge"),
    digest=("evaluation.json", "suites.json", "report.md"),
)
def evaluate_and_report(
    job: JobDir, spec: JobSpec, sft: dict | None, training: dict, wall_seconds: float = 0.0
) -> dict | None:
    """Scores the start model and the GRPO result on the held-out prompts, runs the evaluation suites on the start
    and the kept model, then writes the report.

    A one-process full fine-tune was already scored by its training child
    (`grpoflow.trainers.grpo.evaluates_in_training`); its `evaluation.json` is then taken as it is.

    Args:
        job (`JobDir`), spec (`JobSpec`): the job.
        sft (`dict`, *optional*): the SFT task's summary, when the warm-up ran.
        training (`dict`): the training task's summary.
        wall_seconds (`float`, *optional*): the job's time so far, for the report.
    """
    logger = get_run_logger()
    in_child = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    if in_child.get("evaluated_in_training"):
        # The training child scored its model in memory (the weights in merged/) before it exited.
        evaluation = in_child["evaluation"]
    else:
        evaluation = evaluate(job, spec, start_model(spec, job))
        if evaluation and evaluation.get("trained"):
            # merged/ holds the start model now: the stages that wrote it take it as theirs, so a resume skips them.
            for stage in (train_task, merge_task):
                rerecord(job, spec, stage.fn.resumable)
    if alert := no_improvement_alert(evaluation):
        emit(job, "grpoflow.training.alert", alert.to_dict())
    if evaluation:
        logger.info(
            "held-out %s on %d prompts: before %s, after %s",
            evaluation["metric"],
            evaluation["n"],
            *(number(evaluation[side]) for side in ("before", "after")),
        )
        if evaluation.get("note"):
            logger.warning("evaluation: %s", evaluation["note"])
    if spec.evaluation.suites:  # on the kept model: after the held-out scores, which may keep the start
        suites = run_suites(job, spec, start_model(spec, job))
        logger.info("evaluation suites: %d run on the start and the kept model in %s s", len(suites["suites"]),
                    number(suites["seconds"], 3))  # fmt: skip
    alerts = HealthMonitor.for_spec(spec, partial(degenerate_example, job)).check(read_metrics(job.metrics))
    extra = {"resumed_from_checkpoint": training["resumed_from"] or "no"}
    rows = times(sft, training, evaluation, wall_seconds, held_out_seconds(job))
    report = write_report(job, spec, evaluation, alerts, extra, rows)
    logger.info("report: %s", report)
    return evaluation
