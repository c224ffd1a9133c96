"""The data watcher: emits one `grpoflow.dataset.landed` event per new dataset file version in a folder or bucket.

It lists a local folder or `s3://bucket/prefix` (recursively, through fsspec; see `tasks.storage` for credentials)
and emits, for each dataset file (`.jsonl`, `.json`, `.csv`, `.parquet`, compressed text too) it has not emitted
before, an event with resource `grpoflow.dataset.<uri>` and payload `{"uri", "size", "etag", "mtime", "version",
"spec"}`; the `grpo-pipeline/on-new-data` deployment's trigger starts a run on it. Deployed as `watch-new-data/watch`
on an interval schedule; by hand:

    python -m flows.watch data/incoming --spec deployments/default-spec.yaml

Guarantees:
- Half-written files are never announced: names starting with `.` or `_` (anywhere in the path) or ending with
  `.tmp`, `.part` or `.partial` are skipped, and a file is announced only once two consecutive looks (two runs)
  found the same size and version (ETag on object stores, mtime on local disks).
- A version is announced once: what was emitted, and the pending first looks, are kept in a JSON state file per
  watched URI (`GRPOFLOW_WATCH_STATE_DIR`, default `~/.grpoflow/watch-state`), replaced atomically after each event
  and locked for the whole pass. It lives beside the worker, so restarts of the server or the worker keep it. Each
  event's id is derived from the file's version, so even a crash between an emit and the state write cannot start a
  second run: the Prefect server drops an event whose id it has seen.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.events import emit_event
from prefect.states import Completed

from tasks.storage import filesystem, is_remote
from trainers.dataset import COMPRESSIONS, FORMATS
from trainers.jobdir import write_json_atomic

EVENT = "grpoflow.dataset.landed"
STATE_DIR_ENV = "GRPOFLOW_WATCH_STATE_DIR"
TEMP_PREFIXES = (".", "_")
TEMP_SUFFIXES = (".tmp", ".part", ".partial")


@dataclass(frozen=True)
class FileVersion:
    """One version of one file, as a listing shows it."""

    uri: str  # s3://bucket/key, or an absolute local path
    size: int
    etag: str | None
    mtime: str | None  # ISO 8601, UTC

    @property
    def version(self) -> str:
        """What changes when the content does: the ETag on object stores, the modification time on disks."""
        return f"etag:{self.etag}" if self.etag else f"mtime:{self.mtime}"

    def look(self) -> dict:
        return {"version": self.version, "size": self.size}


# --- listing ---------------------------------------------------------------------------------------------------------


def is_candidate(relative_path: str) -> bool:
    """False for temporary or hidden names (any part of the path) and for files that are not datasets."""
    parts = [p for p in relative_path.split("/") if p]
    if any(p.startswith(TEMP_PREFIXES) for p in parts) or parts[-1].lower().endswith(TEMP_SUFFIXES):
        return False
    name = parts[-1].lower()
    for compression in COMPRESSIONS:
        if name.endswith(compression):  # compressed JSON or CSV, as the ingest reads them
            return FORMATS.get(os.path.splitext(name.removesuffix(compression))[1]) in ("json", "csv")
    return os.path.splitext(name)[1] in FORMATS


def list_files(uri: str) -> list[FileVersion]:
    """Every dataset file under `uri` (a folder, a prefix, or one file), temporary names left out."""
    fs, root = filesystem(uri)
    if not fs.exists(root):
        return []
    found = []
    for name, info in sorted(fs.find(root, detail=True).items()):
        if info.get("type") != "file":
            continue
        relative = name[len(root) :].strip("/") or name.rsplit("/", 1)[-1]
        if not is_candidate(relative):
            continue
        etag = info.get("ETag") or info.get("etag")
        found.append(
            FileVersion(
                uri=fs.unstrip_protocol(name) if is_remote(uri) else name,
                size=int(info.get("size") or 0),
                etag=etag.strip('"') if etag else None,
                mtime=_iso(info.get("LastModified") or info.get("mtime")),
            )
        )
    return found


def _iso(value) -> str | None:
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value) if value is not None else None


# --- the state file --------------------------------------------------------------------------------------------------


def state_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(STATE_DIR_ENV) or "~/.grpoflow/watch-state").expanduser()


def state_path(uri: str, directory: str | None = None) -> Path:
    """`<state dir>/<readable tail>-<hash>.json`: one file per watched URI."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", uri.rstrip("/").rsplit("/", 1)[-1])[-40:].strip("-.") or "root"
    return state_dir(directory) / f"{tail}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}.json"


@dataclass
class WatchState:
    """What one watched URI has announced (`emitted`: file uri -> versions) and first looks awaiting a second."""

    path: Path
    uri: str
    emitted: dict[str, list[str]] = field(default_factory=dict)
    pending: dict[str, dict] = field(default_factory=dict)

    @classmethod
    @contextlib.contextmanager
    def locked(cls, uri: str, directory: str | None = None) -> Iterator["WatchState"]:
        """The state of `uri`, loaded under an exclusive lock held until the `with` block ends."""
        path = state_path(uri, directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(path.read_text()) if path.exists() else {}
            yield cls(path, uri, data.get("emitted", {}), data.get("pending", {}))

    def save(self) -> None:
        write_json_atomic(self.path, {"uri": self.uri, "emitted": self.emitted, "pending": self.pending})


# --- one look --------------------------------------------------------------------------------------------------------


def event_id(file: FileVersion, spec: str | None) -> uuid.UUID:
    """The same file version (and spec) always gives the same event id, which the Prefect server deduplicates."""
    return uuid.uuid5(uuid.NAMESPACE_URL, json.dumps([EVENT, file.uri, file.version, file.size, spec]))


def emit_landed(file: FileVersion, spec: str | None) -> dict:
    payload = {"uri": file.uri, "size": file.size, "etag": file.etag, "mtime": file.mtime, "version": file.version}
    payload["spec"] = spec
    emit_event(
        event=EVENT,
        resource={"prefect.resource.id": f"grpoflow.dataset.{file.uri}", "prefect.resource.name": file.uri},
        payload=payload,
        id=event_id(file, spec),
    )
    return payload


def look(state: WatchState, spec: str | None = None) -> list[dict]:
    """Lists `state.uri` once: emits for files seen unchanged since the previous look, remembers the others.

    Args:
        state (`WatchState`): the watched URI's state, saved after every event and at the end.
        spec (`str`, *optional*): path or URI of a spec file, passed on in each event's payload.

    Returns:
        `list[dict]`: the payloads of the events emitted.
    """
    landed, pending = [], {}
    for file in list_files(state.uri):
        if file.version in state.emitted.get(file.uri, []):
            continue
        if state.pending.get(file.uri) != file.look():
            pending[file.uri] = file.look()  # first look, or still changing: wait for the next look
            continue
        landed.append(emit_landed(file, spec))
        state.emitted.setdefault(file.uri, []).append(file.version)
        state.save()
    state.pending = pending
    state.save()
    return landed


@task(name="look-for-new-data", retries=2, retry_delay_seconds=10)
def look_task(uri: str, spec: str | None, directory: str | None) -> dict:
    with WatchState.locked(uri, directory) as state:
        landed = look(state, spec)
        return {"landed": landed, "pending": sorted(state.pending), "state_file": str(state.path)}


@flow(name="watch-new-data")
def watch_new_data(uri: str, spec: str | None = None, state_dir: str | None = None) -> list[dict]:
    """Emits `grpoflow.dataset.landed` for each new dataset file version under `uri`; returns their payloads.

    Args:
        uri (`str`): a local folder (relative to the worker's working directory) or `s3://bucket/prefix`.
        spec (`str`, *optional*): path or URI of a spec file, passed on in each event (the triggered run uses it
            instead of its default spec).
        state_dir (`str`, *optional*): where the state file lives; default `GRPOFLOW_WATCH_STATE_DIR`, else
            `~/.grpoflow/watch-state`.
    """
    logger = get_run_logger()
    if not is_remote(uri):
        uri = str(Path(uri).expanduser().resolve())
    result = look_task(uri, spec, state_dir)
    for payload in result["landed"]:
        logger.info("landed: %s (%d bytes, %s)", payload["uri"], payload["size"], payload["version"])
    logger.info("state of %s: %s", uri, result["state_file"])
    # The summary is the run's state message, so the runs list in the UI shows what each look found.
    summary = f"{len(result['landed'])} new dataset file(s) under {uri}"
    if result["pending"]:
        summary += f"; {len(result['pending'])} waiting for a second look: {', '.join(result['pending'])}"
    return Completed(message=summary, data=result["landed"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="One look at a folder or s3://bucket/prefix for new datasets.")
    parser.add_argument("uri")
    parser.add_argument("--spec", help="spec file passed on in each event")
    parser.add_argument("--state-dir", help=f"state folder (default ${STATE_DIR_ENV} or ~/.grpoflow/watch-state)")
    args = parser.parse_args(argv)
    print(json.dumps(watch_new_data(args.uri, args.spec, args.state_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
