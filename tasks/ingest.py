"""Ingest task: loads and checks the dataset into the job folder (`grpoflow.trainers.dataset`), dry-runs the rewards on
it (`grpoflow.trainers.rewards`), and emits `grpoflow.dataset.ingested`. A bad dataset or reward ends the task
`Rejected`, and so does an evaluation suite that cannot run (`grpoflow.trainers.suites.suite_problems`)."""

import datasets
from prefect import task

from grpoflow.core.errors import DatasetError
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.events import emit
from grpoflow.integrations.stages import cancellable, rejected, resumable, retry_unless_final
from grpoflow.integrations.storage import storage_options
from grpoflow.tasks import RETRY_DELAY_S
from grpoflow.trainers.dataset import ValidationSet, ingest_dataset, load_ingested
from grpoflow.trainers.rewards import RewardError
from grpoflow.trainers.rewards.build import build_reward
from grpoflow.trainers.rewards.dry_run import dry_run_job_rewards, metric_columns, required_columns
from grpoflow.trainers.suites import suite_problems


@task(name="ingest", retries=2, retry_delay_seconds=RETRY_DELAY_S, retry_condition_fn=retry_unless_final)
@cancellable
@resumable("ingest", outputs=("dataset/dataset_dict.json",))
def ingest_task(job: JobDir, spec: JobSpec):
    """Ingests `spec.dataset` (and `evaluation.dataset`, as the `eval` split) into `job.dataset` and dry-runs the
    rewards on it; returns what was ingested.

    A bad dataset or reward is the user's mistake, not a failure to retry: the task then ends in a `Rejected` state
    (before any model is loaded) whose message says what is wrong, and the flow ends the job the same way.
    """
    datasets.disable_progress_bars()  # per-batch bars drown the flow's log; the event carries the counts
    if problems := suite_problems(spec):  # a deployment's run had no preflight: found now, not after training
        return rejected("; ".join(problems))
    try:
        rewards = [
            build_reward(r.name, r.function, r.kwargs, r.model, r.grader, spec.dataset.prompt_column)
            for r in spec.rewards
        ]
        result = ingest_dataset(
            spec.dataset.uri,
            job.dataset,
            prompt_column=spec.dataset.prompt_column,
            required_columns=required_columns(spec, rewards),
            holdout=spec.evaluation.holdout,
            seed=spec.hyperparameters.seed,
            split=spec.dataset.split,
            storage_options=storage_options(spec.dataset.uri),
            max_row_bytes=spec.dataset.max_row_bytes,
            validation=validation_set(spec),
        )
        dry_run_job_rewards(spec, rewards, load_ingested(job.dataset)["train"])
    except (DatasetError, RewardError) as e:
        return rejected(str(e))
    info = {
        "uri": result.uri,
        "num_train": result.num_train,
        "num_eval": result.num_eval,
        "columns": result.columns,
        "prompt_format": result.prompt_format,
        "fingerprint": result.fingerprint,
    }
    emit(job, "grpoflow.dataset.ingested", info)
    return info


def validation_set(spec: JobSpec) -> ValidationSet | None:
    """`evaluation.dataset` as the ingest takes it, with the columns the held-out metric reads; None without one."""
    vs = spec.evaluation.dataset
    if vs is None:
        return None
    return ValidationSet(
        vs.uri, vs.prompt_column, metric_columns(spec), vs.split, storage_options(vs.uri), vs.max_row_bytes
    )
