"""Stage records for resumable jobs: `stages/<stage>.json` in the job folder says a stage finished, for which
inputs, with which result.

A resumed job (`grpoflow run SPEC --resume JOB_ID`, or a Prefect retry of the whole flow run) skips every stage
whose record matches its inputs and whose outputs are still there, so a failed late stage never retrains. The
records live in the job folder rather than in Prefect's result storage: they travel with the folder to another
worker, and deleting an output is enough to redo its stage.
"""

import functools
import hashlib
import json
import logging

from trainers.jobdir import JobDir, write_json_atomic
from trainers.spec import JobSpec, resolved_dict

# What each stage leaves behind; a record whose outputs are gone is stale.
OUTPUTS = {
    "ingest": ("dataset/dataset_dict.json",),
    "sft": ("sft/config.json",),
    "train": ("training.json",),
    "merge": ("model.json", "merged/config.json"),
    "evaluate": ("report.md",),
}


def stage_key(spec: JobSpec, *upstream) -> str:
    """A digest of the stage's inputs: the resolved spec (output_uri aside) and what upstream stages produced."""
    inputs = resolved_dict(spec)
    inputs.pop("output_uri", None)
    text = json.dumps([inputs, *upstream], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def completed(job: JobDir, stage: str, key: str) -> dict | None:
    """The record of `stage` (its `result` included) when it already ran with inputs `key` and its outputs exist."""
    path = job.root / "stages" / f"{stage}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("key") != key or not all((job.root / out).exists() for out in OUTPUTS[stage]):
        return None
    return record


def record(job: JobDir, stage: str, key: str, result) -> None:
    write_json_atomic(job.root / "stages" / f"{stage}.json", {"stage": stage, "key": key, "result": result})


def resumable(stage: str):
    """Makes a stage task `(job, spec, ...)` skip itself when its record matches, and record itself when it ends."""

    def wrap(fn):
        @functools.wraps(fn)
        def run_or_skip(job: JobDir, spec: JobSpec, *args, **kwargs):
            key = stage_key(spec, stage)
            done = completed(job, stage, key)
            if done is not None:
                logging.getLogger("grpoflow").info("%s: already completed for job %s; skipped", stage, job.job_id)
                return done["result"]
            result = fn(job, spec, *args, **kwargs)
            record(job, stage, key, result)
            return result

        return run_or_skip

    return wrap
