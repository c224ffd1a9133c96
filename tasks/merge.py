"""Merge task: folds a LoRA adapter into the base (PEFT) and writes model.json; emits `grpoflow.adapter.merged`."""

import time

from prefect import get_run_logger, task

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.events import emit
from grpoflow.integrations.heartbeat import Heartbeat
from grpoflow.integrations.stages import cancellable, resumable
from grpoflow.tasks import RETRY_DELAY_S
from grpoflow.trainers.model.merge import merge_adapter, write_model_json


@task(name="merge", retries=1, retry_delay_seconds=RETRY_DELAY_S)
@cancellable
@resumable("merge", outputs=("model.json", "merged/config.json"), reads=("train",))
def merge_task(job: JobDir, spec: JobSpec) -> dict:
    """Merges `adapter/` into `merged/` for LoRA jobs (a full fine-tune is already in `merged/`)."""
    is_adapter = (job.adapter / "adapter_config.json").exists()
    if is_adapter:
        started = time.monotonic()
        with Heartbeat(get_run_logger(), "merge") as beat:  # a 7B base loads and saves for a minute or more
            merge_adapter(job.adapter, job.merged, say=beat.say)
        get_run_logger().info("merge: %s/ written in %.1f s", job.merged.name, time.monotonic() - started)
    info = write_model_json(job)
    if is_adapter:
        emit(job, "grpoflow.adapter.merged", {"artifact_type": "adapter", "merged_files": info["merged_files"]})
    return info
