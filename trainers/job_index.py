"""Where jobs live: a small index of job locations, so a job id alone finds its job from any folder.

`grpoflow run` (the job's create stage) records `<job_id> -> <output_uri>/<job_id>` as one file per job under
`GRPOFLOW_JOB_INDEX` (default `~/.grpoflow/jobs`); `grpoflow jobs|metrics|model|publish|deploy JOB_ID` look there
when the job is not under `--output-uri` (or `./runs`). One file per job, written atomically, so concurrent runs never
race on a shared file; a location whose job folder is gone is skipped by the readers.
"""

import os
from pathlib import Path

from grpoflow.trainers.jobdir import check_job_id, write_text_atomic

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
