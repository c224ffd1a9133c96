"""Stage records for resumable jobs: `stages/<stage>.json` in the job folder says a stage finished, for which
inputs, with which result and which outputs.

A resumed job (`grpoflow run SPEC --resume JOB_ID`, or a Prefect retry of the whole flow run) skips every stage
whose record matches its inputs and whose outputs are still there, so a failed late stage never retrains. A stage's
inputs are the resolved spec and the outputs of the stages it reads (`reads=`), by content: replace `sft/` and
GRPO, the merge and the evaluation run again; delete `report.md` and only the evaluation does. The records live in
the job folder rather than in Prefect's result storage: they travel with the folder to another worker, and deleting
an output is enough to redo its stage.
"""

import fnmatch
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prefect import get_client
from prefect.exceptions import TerminationSignal
from prefect.states import Cancelled, Failed, State

from grpoflow.core.errors import ChildEndedEarly, RewardFailed, TrainingSetupError, TrainingStopped
from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec, resolved_dict
from grpoflow.trainers.model.load import WRITE_ERRNOS


def _record_path(job: JobDir, stage: str) -> Path:
    return job.root / "stages" / f"{stage}.json"


def read_record(job: JobDir, stage: str) -> dict | None:
    """The record of `stage`, or None when it never completed (or its record is unreadable)."""
    try:
        record = json.loads(_record_path(job, stage).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _files(job: JobDir, names: Iterable[str]) -> dict[str, list[int]]:
    """`{relative path: [size, mtime_ns]}` of every file under the job folder's paths `names`, less the cache files
    `datasets` writes beside a saved dataset when a later stage maps it (`cache-<fingerprint>.arrow`)."""
    files = {}
    for name in names:
        top = job.root / name
        for path in sorted(top.rglob("*")) if top.is_dir() else [top] if top.is_file() else []:
            if path.is_file() and not fnmatch.fnmatch(path.name, "cache-*.arrow"):
                stat = path.stat()
                files[path.relative_to(job.root).as_posix()] = [stat.st_size, stat.st_mtime_ns]
    return files


def _content_digest(job: JobDir, files: dict[str, list[int]]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        with (job.root / name).open("rb") as f:
            digest.update(f"{name}\0{hashlib.file_digest(f, 'sha256').hexdigest()}\0".encode())
    return digest.hexdigest()


def output_digest(job: JobDir, stage: str) -> str | None:
    """A digest of what `stage` produced as it is on disk now; None when the stage has no record.

    Files whose size and mtime match the record's are taken at the recorded digest; otherwise (a replaced folder, or
    the job folder copied to another machine) their content is hashed again.
    """
    record = read_record(job, stage)
    if record is None:
        return None
    files = _files(job, record.get("paths", ()))
    if files == record.get("files") and record.get("digest"):
        return record["digest"]
    return _content_digest(job, files)


def stage_key(spec: JobSpec, stage: str, upstream: dict[str, str | None]) -> str:
    """A digest of the stage's inputs: the resolved spec (output_uri aside) and its upstream stages' output digests."""
    inputs = resolved_dict(spec)
    inputs.pop("output_uri", None)
    text = json.dumps([stage, inputs, upstream], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def completed(job: JobDir, stage: str, key: str, outputs: Iterable[str]) -> dict | None:
    """The record of `stage` (its `result` included) when it already ran with inputs `key` and `outputs` exist."""
    record = read_record(job, stage)
    if record is None or record.get("key") != key:
        return None
    if not all((job.root / out).exists() for out in outputs):
        return None
    return record


def record(job: JobDir, stage: str, key: str, result, digest: Iterable[str]) -> None:
    """Records that `stage` completed with inputs `key`: its result, and a digest of the paths `digest` (those that
    exist)."""
    paths = [name for name in digest if (job.root / name).exists()]
    files = _files(job, paths)
    entry = {"stage": stage, "key": key, "result": result, "paths": paths, "files": files}
    write_json_atomic(_record_path(job, stage), {**entry, "digest": _content_digest(job, files)})


def rerecord(job: JobDir, spec: JobSpec, stage: "StageRecord") -> None:
    """Records `stage` again as its outputs are now, its result kept: for an output a later stage replaced by design
    (the evaluation's start model in merged/, when no checkpoint beat it), so that a resume still finds it done."""
    old = read_record(job, stage.name)
    if old is not None:
        key = stage_key(spec, stage.name, {up: output_digest(job, up) for up in stage.reads})
        record(job, stage.name, key, old["result"], old.get("paths", ()))


@dataclass(frozen=True)
class StageRecord:
    """What a resumable stage writes and reads, as its `@resumable` declared it; `is_done(job, spec)` tells whether it
    would be skipped now (its record matches its inputs and its outputs exist)."""

    name: str
    outputs: tuple[str, ...]
    reads: tuple[str, ...]
    is_done: Callable[[JobDir, JobSpec], bool]


def resumable(
    stage: str,
    outputs: tuple[str, ...],
    reads: tuple[str, ...] = (),
    digest: tuple[str, ...] | Callable[[JobDir], tuple[str, ...]] = (),
):
    """Makes a stage task `(job, spec, ...)` skip itself when its record matches, and record itself when it ends.
    The wrapped function carries its `StageRecord` as `.resumable` (the pipeline's stage table reads it).

    Args:
        stage (`str`): the stage's name (its record is `stages/<stage>.json`).
        outputs (`tuple[str, ...]`): files the stage leaves in the job folder; when one is gone, the stage runs again.
        reads (`tuple[str, ...]`, *optional*): the stages whose outputs it reads; when their outputs change, it runs
            again.
        digest (`tuple[str, ...]` or `Callable`, *optional*): the files and folders that make up its output for the
            stages that read it (or a function of the job folder giving them, asked when the stage ends); defaults to
            the top-level paths of `outputs`.
    """
    if not digest:
        digest = tuple(dict.fromkeys(out.split("/", 1)[0] for out in outputs))

    def done(job: JobDir, spec: JobSpec) -> dict | None:
        return completed(job, stage, stage_key(spec, stage, {up: output_digest(job, up) for up in reads}), outputs)

    def wrap(fn):
        @functools.wraps(fn)
        def run_or_skip(job: JobDir, spec: JobSpec, *args, **kwargs):
            key = stage_key(spec, stage, {up: output_digest(job, up) for up in reads})
            done = completed(job, stage, key, outputs)
            if done is not None:
                logging.getLogger("grpoflow").info("%s: already completed for job %s; skipped", stage, job.job_id)
                return done["result"]
            result = fn(job, spec, *args, **kwargs)
            if not isinstance(result, State):  # a rejection is no result to keep
                # The inputs as the stage leaves them: the evaluation may replace merged/ with the start model.
                key = stage_key(spec, stage, {up: output_digest(job, up) for up in reads})
                record(job, stage, key, result, digest(job) if callable(digest) else digest)
            return result

        run_or_skip.resumable = StageRecord(stage, outputs, reads, lambda job, spec: done(job, spec) is not None)
        return run_or_skip

    return wrap


# --- how a stage ends ---------------------------------------------------------------------------------------------

# The name of the state of a task or flow run whose input was rejected (a spec, dataset or reward mistake): the CLI's
# exit code 2, never retried. Callers check a state's name, never its message.
REJECTED = "Rejected"


def rejected(message: str) -> State:
    """The final state of a run whose input was rejected: failed, named `Rejected`, with the reason as its message."""
    return Failed(name=REJECTED, message=message)


def flow_run_cancelling() -> bool:
    """Whether this flow run is being cancelled (the Prefect UI's Cancel, `prefect flow-run cancel`): its state on
    the server is Cancelling or Cancelled."""
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.id).state
    except Exception:  # no server to ask (gone, unreachable): the signal stays what it was, a crash
        logging.getLogger(__name__).warning("could not read flow run %s's state after a SIGTERM", flow_run.id)
        return False
    return state is not None and (state.is_cancelling() or state.is_cancelled())


def end_cancelled(message: str) -> None:
    """Sets this flow run `Cancelled` once it has done what a cancel asks of it (the stage's child stopped, the job
    ended cancelled), as its process is about to exit.

    Under a worker, Prefect's runner sets a cancelled run's last state only after the run's process has exited and it
    has run the flow's `on_cancellation` hooks in a new Python process that imports the flow again: grpoflow's flows
    have none, and the run stayed `Cancelling` 25-45 s after its processes were gone on a busy machine. The runner
    then finds the run `Cancelled` and leaves it so. A run that is not `Cancelling` (a SIGTERM that was no cancel) is
    left as it is."""
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.id).state
            if state is not None and state.is_cancelling():
                client.set_flow_run_state(flow_run.id, Cancelled(message=message))
    except Exception as e:  # no server to tell: the runner sets it once the process has exited, as before
        logging.getLogger(__name__).warning("could not set flow run %s Cancelled: %s", flow_run.id, e)


def cancellable(fn: Callable) -> Callable:
    """Makes a stage task end `Cancelled` when its flow run is cancelled while it works.

    A cancel reaches the flow run's process as SIGTERM, which Prefect raises as `TerminationSignal` wherever the
    process is; inside a task, the engine would record the task Crashed. The stage has stopped its child on the way
    out (`run_child`'s `finally`), so the task returns a Cancelled state instead, and the flow ends the job cancelled.
    A SIGTERM that is no cancel (a worker or a node shutting down) stays a crash, which Prefect's retries resume.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TerminationSignal:
            if not flow_run_cancelling():
                raise
            return Cancelled(message=f"{fn.__name__.removesuffix('_task')} stopped: the flow run was cancelled")

    return wrapper


def retry_unless_final(task, task_run, state) -> bool:
    """Prefect's `retry_condition_fn` of every stage: a rejected input, a setup problem, a deliberate stop, a reward
    that failed in training, a child that ended itself early and a write refused for want of space or permission
    (`WRITE_ERRNOS`) are final (a retry would meet them again); a crash or a transient error is retried."""
    if state.name == REJECTED:
        return False
    try:
        state.result()
    except (TrainingSetupError, TrainingStopped, RewardFailed, ChildEndedEarly):
        return False
    except OSError as e:
        return e.errno not in WRITE_ERRNOS
    except Exception:
        return True
    return False
