"""What the API keeps of each team, in the team's own folders, so that a restarted API finds it again:

- `<output_uri>/<team>/.api-jobs/<job_id>.json`: a job the API submitted: its Prefect flow run's id, when it was
  created, and the OpenAI request it came from (for a `/v1/fine_tuning/jobs` job), one file a job, written atomically;
- `<output_uri>/files/<team>/<file_id>.<ext>` and `<file_id>.json`: an uploaded file and its record (received into a
  `.upload-*.part` file beside them, renamed into place once whole).

A team reads only its own folders: an id that is not in them is unknown, whoever else has it.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from grpoflow.core.apikeys import FILES_FOLDER
from grpoflow.core.jobdir import JobDir, check_job_id, write_json_atomic

JOBS_FOLDER = ".api-jobs"
FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


@dataclass(frozen=True)
class TeamStore:
    """A team's jobs and files under the API's output root."""

    root: Path
    team: str

    @property
    def jobs_root(self) -> Path:
        return self.root / self.team

    @property
    def files_root(self) -> Path:
        return self.root / FILES_FOLDER / self.team

    # --- jobs

    def job_dir(self, job_id: str) -> JobDir:
        return JobDir(self.jobs_root / check_job_id(job_id))

    def add_job(self, job_id: str, flow_run_id: str, **more) -> dict:
        """Records the team's job `job_id` (its flow run's id, `more`: what the API shows of it later)."""
        record = {"id": job_id, "flow_run_id": flow_run_id, "created_at": int(time.time()), **more}
        write_json_atomic(self.jobs_root / JOBS_FOLDER / f"{check_job_id(job_id)}.json", record)
        return record

    def update_job(self, job_id: str, **changes) -> dict:
        """Rewrites the team's record of `job_id` (which it has) with `changes`; returns it."""
        record = {**self.job(job_id), **changes}
        write_json_atomic(self.jobs_root / JOBS_FOLDER / f"{check_job_id(job_id)}.json", record)
        return record

    def job(self, job_id: str) -> dict | None:
        """The team's record of `job_id`, or None (unknown, or another team's)."""
        try:
            return json.loads((self.jobs_root / JOBS_FOLDER / f"{check_job_id(job_id)}.json").read_text())
        except (OSError, ValueError):
            return None

    def jobs(self) -> list[dict]:
        """Every job of the team, newest first."""
        folder = self.jobs_root / JOBS_FOLDER
        records = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
        return sorted(records, key=lambda r: (r["created_at"], r["id"]), reverse=True)

    # --- files

    def upload_path(self) -> Path:
        """A new temporary file in the team's files folder for an upload being received (a dotfile: `files` lists
        none, and `add_file` renames it into place)."""
        self.files_root.mkdir(parents=True, exist_ok=True)
        return self.files_root / f".upload-{secrets.token_hex(8)}.part"

    def add_file(self, filename: str, received: Path, purpose: str) -> dict:
        """Records the upload `received` (an `upload_path`, complete) as a new file of the team; returns its record."""
        file_id = f"file-{secrets.token_hex(12)}"
        suffix = Path(filename).suffix.lower()
        data = self.files_root / f"{file_id}{suffix if suffix in DATA_SUFFIXES else '.jsonl'}"
        size = received.stat().st_size
        received.replace(data)
        record = {"id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()),
                  "filename": Path(filename).name, "purpose": purpose, "status": "processed",
                  "expires_at": None, "status_details": None, "path": data.name}  # fmt: skip
        write_json_atomic(self.files_root / f"{file_id}.json", record)
        return record

    def file(self, file_id: str) -> dict | None:
        if not FILE_ID.match(file_id):
            return None
        try:
            return json.loads((self.files_root / f"{file_id}.json").read_text())
        except (OSError, ValueError):
            return None

    def files(self) -> list[dict]:
        folder = self.files_root
        records = [json.loads(p.read_text()) for p in folder.glob("file-*.json")] if folder.is_dir() else []
        return sorted(records, key=lambda r: (r["created_at"], r["id"]), reverse=True)

    def file_path(self, record: dict) -> Path:
        return self.files_root / record["path"]


def public_file(record: dict) -> dict:
    """A file's record as OpenAI's `FileObject` (without where it is stored)."""
    return {k: v for k, v in record.items() if k != "path"}
