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
