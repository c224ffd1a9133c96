"""The job folder layout (`<output_uri>/<job_id>/`, shared/DESIGN.md): one place that names every file in it."""

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def check_job_id(job_id: str) -> str:
    """`job_id` when it can name a job folder (one path segment); else `ValueError` saying so.

    >>> check_job_id("arithmetic-demo-20261130-064628-4013d1")
    'arithmetic-demo-20261130-064628-4013d1'
    """
    if not isinstance(job_id, str) or "/" in job_id or "\\" in job_id or job_id in ("", ".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


@dataclass(frozen=True)
class JobDir:
    """Paths of one job's folder. Every stage reads and writes through these names."""

    root: Path

    @property
    def job_id(self) -> str:
        return self.root.name

    spec = property(lambda self: self.root / "spec.yaml")
    dataset = property(lambda self: self.root / "dataset")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    checkpoints = property(lambda self: self.root / "checkpoints")
    sft = property(lambda self: self.root / "sft")
    adapter = property(lambda self: self.root / "adapter")
    merged = property(lambda self: self.root / "merged")
    model_json = property(lambda self: self.root / "model.json")
    events = property(lambda self: self.root / "events.jsonl")
    webhooks = property(lambda self: self.root / "webhooks.jsonl")
    evaluation = property(lambda self: self.root / "evaluation.json")
    rollouts = property(lambda self: self.root / "rollouts")  # step-NNNNNN.parquet: a kept step's completions
    evaluation_rollouts = property(lambda self: self.root / "evaluation")  # the same for each held-out evaluation
    report = property(lambda self: self.root / "report.md")
    training_result = property(lambda self: self.root / "training.json")
    logs = property(lambda self: self.root / "logs")


def write_json_atomic(path: Path, data) -> None:
    """Writes JSON to a temp file beside `path` and renames it, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def replace_dir(staged: Path, dest: Path) -> None:
    """Puts the finished folder `staged` at `dest`, keeping the old `dest` until the swap.

    `dest` is at every moment absent, the old folder or the complete new one; a failed rename puts the old one back.

    Args:
        staged (`Path`): the complete new folder, on the same filesystem as `dest` (written beside it).
        dest (`Path`): where it goes; an existing folder there is replaced.
    """
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex}")
    if dest.exists():
        dest.rename(old)
    try:
        staged.rename(dest)
    except OSError:
        if old.exists():
            old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


# --- the job index --------------------------------------------------------------------------------------------------
# Where jobs live: a small index of job locations, so a job id alone finds its job from any folder.
#
# `grpoflow run` (the job's create stage) records `<job_id> -> <output_uri>/<job_id>` as one file per job under
# `GRPOFLOW_JOB_INDEX` (default `~/.grpoflow/jobs`); `grpoflow jobs|metrics|model|publish|deploy JOB_ID` look there
# when the job is not under `--output-uri` (or `./runs`). One file per job, written atomically, so concurrent runs
# never race on a shared file; a location whose job folder is gone is skipped by the readers.

INDEX_ENV = "GRPOFLOW_JOB_INDEX"


def index_dir() -> Path:
    """The index folder: `GRPOFLOW_JOB_INDEX`, else `~/.grpoflow/jobs`."""
    return Path(os.environ.get(INDEX_ENV) or "~/.grpoflow/jobs").expanduser()


def remember(job_id: str, location: str) -> None:
    """Records that job `job_id` lives at `location` (a local folder or a URL such as `s3://bucket/runs/<job_id>`).

    An index that cannot be written (a read-only home) costs only the lookup, never the job.
    """
    try:
        write_text_atomic(index_dir() / check_job_id(job_id), location + "\n")
    except OSError:
        pass


def locate(job_id: str) -> str | None:
    """Where job `job_id` was recorded, or None."""
    try:
        return (index_dir() / check_job_id(job_id)).read_text().strip() or None
    except (OSError, ValueError):
        return None


def known_roots() -> list[str]:
    """The output roots of every indexed job (the folders or URLs holding job folders), each once, newest first."""
    folder = index_dir()
    entries = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
    roots = []
    for entry in entries:
        try:
            location = entry.read_text().strip()
        except OSError:
            continue
        roots.append(location.rstrip("/").rsplit("/", 1)[0])
    return list(dict.fromkeys(roots))
