"""The data watcher: emits one `grpoflow.dataset.landed` event per new dataset file version in a folder or bucket.

It lists a local folder or `s3://bucket/prefix` (recursively, through fsspec; see `grpoflow.integrations.storage` for
credentials) and emits, for each dataset file (`.jsonl`, `.json`, `.csv`, `.parquet`, compressed text too) it has not
emitted before, an event with resource `grpoflow.dataset.<uri>` and payload `{"uri", "size", "etag", "mtime",
"version", "spec"}`; the `grpo-pipeline/on-new-data` deployment's trigger starts a run on it. By hand, one look:

    python -m grpoflow.flows.watch data/incoming --spec deployments/default-spec.yaml

How it runs, deployed (`watch-new-data/watch`): one flow run an hour, which keeps looking every `poll_seconds` (30)
for `watch_minutes` (55): a file is announced within about half a minute of settling, and the runs list holds 24
watcher runs a day (not 720, as a 2-minute schedule made), each with a state message that sums up its looks. The
work pool's `watch` queue (concurrency limit 1) keeps a late run from overlapping the next; the 5 minutes between a
run's end and the next start cost at most that much latency. A queue's limit holds no lease, so a running watcher
outlives a restart of the server (a deployment's `concurrency_limit` makes Prefect renew a lease every 225 s, and a
restarted server, whose leases live in memory, refused it: the run ended Crashed). `watch_minutes=0` makes a run one
look (the CLI's default): the `watch-new-data/look` deployment, unscheduled and on the pool's `default` queue, so
that a look outside the schedule runs at once instead of waiting for the hour-long run (its looks take the same
state's lock in turn).

Guarantees:
- Complete files are announced by the look that sees them: a file whose size and version (ETag on object stores,
  mtime on local disks) have not changed for `settle_seconds` is complete. A file seen for the first time has
  settled when its modification time (LastModified on S3) is that long ago; one seen before, when the earlier look
  found the same size and version that long ago.
- Half-written files are never announced: names starting with `.` or `_` (anywhere in the path) or ending with
  `.tmp`, `.part` or `.partial` are skipped, and a file still changing (a newer mtime, another size) waits until it
  settles. A writer that pauses longer than `settle_seconds` mid-file should write under a temporary name and rename.
- A version is announced once: what was emitted, and the files waiting to settle, are kept in a JSON state file per
  watched URI under `state_dir` (the deployment names `.grpoflow/watch-state`, in the project folder; by hand,
  `GRPOFLOW_WATCH_STATE_DIR`, else `~/.grpoflow/watch-state`), replaced atomically after each event and locked for
  each look, so restarts of the server or the worker keep it. Each event's id is derived from the file's version,
  so even a crash between an emit and the state write cannot start a second run: the Prefect server drops an event
  whose id it has seen.
- Watchers on several machines (pods without a shared disk) share one state when `state_dir` is an `s3://` prefix:
  the state is one object per watched URI there, and a look holds a lease on it, `<state>.lock`, an object created
  with a conditional write (If-None-Match), so one watcher looks at a time and each file is announced once. The
  state is written back only over the version the look read (If-Match); a lease older than `LEASE_SECONDS` (its
  watcher died mid-look) is taken over, also by a conditional write, and a look that lost its lease fails instead of
  writing. Any S3-compatible store that honours conditional writes works (AWS S3 does since 2024; MinIO does).
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.events import emit_event
from prefect.runtime import flow_run
from prefect.states import Completed

from grpoflow.core.jobdir import write_json_atomic
from grpoflow.core.spec.models import OptionalUrl, Url
from grpoflow.core.trust import path_outside
from grpoflow.core.uris import OBJECT_STORES, STORES, outside_stores
from grpoflow.integrations.leases import LeaseHeld, S3Lease, conditional_put
from grpoflow.integrations.storage import filesystem, is_remote, join
from grpoflow.trainers.sources import COMPRESSIONS, FORMATS

EVENT = "grpoflow.dataset.landed"
STATE_DIR_ENV = "GRPOFLOW_WATCH_STATE_DIR"
TEMP_PREFIXES = (".", "_")
TEMP_SUFFIXES = (".tmp", ".part", ".partial")
LEASE_SECONDS = 300.0  # a look lasts seconds; a lease this old belongs to a watcher that died mid-look
LEASE_WAIT_S = 60.0  # how long a look waits for another watcher's look before giving up (the next look retries)


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

    @property
    def modified(self) -> float | None:
        """The modification time (LastModified on S3) in seconds since the epoch, when the listing gave one."""
        try:
            return datetime.fromisoformat(self.mtime).timestamp() if self.mtime else None
        except ValueError:
            return None


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
    if refused := outside_stores(uri, OBJECT_STORES):
        raise ValueError(f"uri {uri}: {refused}")
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


def state_dir(explicit: str | None = None) -> Path | str:
    """The state folder: a local folder (`Path`), or an `s3://` prefix (`str`) that watchers on several machines
    share."""
    value = explicit or os.environ.get(STATE_DIR_ENV) or "~/.grpoflow/watch-state"
    if is_remote(value):
        if not value.lower().startswith("s3://"):
            raise ValueError(f"state_dir: {value!r}: a shared state needs conditional writes: an s3:// prefix")
        return value.rstrip("/")
    return Path(value).expanduser()


def state_path(uri: str, directory: str | None = None) -> Path | str:
    """`<state dir>/<readable tail>-<hash>.json`: one file (or object) per watched URI."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", uri.rstrip("/").rsplit("/", 1)[-1])[-40:].strip("-.") or "root"
    name = f"{tail}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}.json"
    folder = state_dir(directory)
    return join(folder, name) if isinstance(folder, str) else folder / name


class LeaseLost(RuntimeError):
    """The shared state changed under a look (its lease expired and another watcher took it): nothing written."""


class SharedState:
    """One watched URI's state as an object on S3, with the lease (`<state>.lock`) that makes a look exclusive.

    Both go through conditional writes: the lease is created only when absent (If-None-Match: *) or replaced only
    when it is the expired one read (If-Match its ETag); the state is written only over the version the look read.
    """

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, path = filesystem(uri)
        self.bucket, self.key, _ = self.fs.split_path(path)
        self.etag = None  # the state object's version this look read or last wrote
        self.lease = S3Lease(uri + ".lock", LEASE_SECONDS)

    def acquire(self) -> None:
        """Takes the lease, waiting up to `LEASE_WAIT_S` seconds for another watcher's look to end."""
        try:
            self.lease.acquire(wait_s=LEASE_WAIT_S, what=self.uri)
        except LeaseHeld as e:
            raise TimeoutError(f"another watcher: {e}") from None

    def release(self) -> None:
        """Removes our lease (only ours: a lease another watcher took over stays)."""
        self.lease.release()

    def load(self) -> dict:
        try:
            self.etag = self.fs.info(f"{self.bucket}/{self.key}", refresh=True)["ETag"]
            return json.loads(self.fs.cat_file(f"{self.bucket}/{self.key}"))
        except FileNotFoundError:
            self.etag = None
            return {}

    def save(self, data: dict) -> None:
        body = json.dumps(data, indent=2).encode()
        condition = {"IfMatch": self.etag} if self.etag else {"IfNoneMatch": "*"}
        etag = conditional_put(self.fs, self.bucket, self.key, body, **condition)
        if etag is None:
            raise LeaseLost(f"the watch state {self.uri} changed under this look (its lease expired): not written")
        self.etag = etag


@dataclass
class WatchState:
    """What one watched URI has announced (`emitted`: file uri -> versions) and the files waiting to settle
    (`pending`: file uri -> the size, version, and since when a look found them so)."""

    path: Path | str
    uri: str
    emitted: dict[str, list[str]] = field(default_factory=dict)
    pending: dict[str, dict] = field(default_factory=dict)
    shared: SharedState | None = None

    @classmethod
    @contextlib.contextmanager
    def locked(cls, uri: str, directory: str | None = None) -> Iterator["WatchState"]:
        """The state of `uri`, loaded under an exclusive lock (a file lock, or the S3 lease) held until the `with`
        block ends."""
        path = state_path(uri, directory)
        if isinstance(path, str):
            shared = SharedState(path)
            shared.acquire()
            try:
                data = shared.load()
                yield cls(path, uri, data.get("emitted", {}), data.get("pending", {}), shared)
            finally:
                shared.release()
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(path.read_text()) if path.exists() else {}
            yield cls(path, uri, data.get("emitted", {}), data.get("pending", {}))

    def save(self) -> None:
        data = {"uri": self.uri, "emitted": self.emitted, "pending": self.pending}
        if self.shared is not None:
            self.shared.save(data)
        else:
            write_json_atomic(self.path, data)


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


def settled_since(file: FileVersion, earlier: dict | None, now: float) -> float:
    """Since when `file` is known unchanged: the earlier look's time when that look saw the same size and version,
    else its modification time (never later than `now`: a clock ahead of ours, or a coarse one, counts from now)."""
    if earlier and {k: earlier.get(k) for k in ("version", "size")} == file.look() and "since" in earlier:
        return earlier["since"]
    return min(file.modified if file.modified is not None else now, now)


def look(state: WatchState, spec: str | None = None, settle_seconds: float = 5.0, now: float | None = None) -> list:
    """Lists `state.uri` once: emits for every new file version unchanged for `settle_seconds`, keeps the others.

    Args:
        state (`WatchState`): the watched URI's state, saved after every event and at the end.
        spec (`str`, *optional*): path or URI of a spec file, passed on in each event's payload.
        settle_seconds (`float`, *optional*, defaults to 5): how long size and version must stay the same.
        now (`float`, *optional*): the time of the look, seconds since the epoch (default: the clock's).

    Returns:
        `list[dict]`: the payloads of the events emitted.
    """
    now = time.time() if now is None else now
    landed, pending = [], {}
    for file in list_files(state.uri):
        if file.version in state.emitted.get(file.uri, []):
            continue
        since = settled_since(file, state.pending.get(file.uri), now)
        if now - since < settle_seconds:
            pending[file.uri] = {**file.look(), "since": since}  # still changing, or changed too recently
            continue
        landed.append(emit_landed(file, spec))
        state.emitted.setdefault(file.uri, []).append(file.version)
        state.save()
    state.pending = pending
    state.save()
    return landed


def look_once(uri: str, spec: str | None, directory: str | None, settle_seconds: float) -> dict:
    """One look under the state's lock: the payloads emitted, the files waiting to settle, the state file."""
    with WatchState.locked(uri, directory) as state:
        landed = look(state, spec, settle_seconds)
        return {"landed": landed, "pending": sorted(state.pending), "state_file": str(state.path)}


def watch_run_name() -> str:
    """A watcher run's name: what it watches and when it started (`watch-incoming-20261202-0200`), so the runs list
    reads as a log of looks rather than Prefect's random names."""
    uri = str(flow_run.parameters.get("uri") or "").rstrip("/")
    where = re.sub(r"[^A-Za-z0-9._-]+", "-", uri.rsplit("/", 1)[-1]) or "data"
    started = flow_run.scheduled_start_time or datetime.now(UTC)
    return f"watch-{where}-{started.astimezone(UTC):%Y%m%d-%H%M}"


@flow(name="watch-new-data", flow_run_name=watch_run_name)
def watch_new_data(
    uri: Url,
    spec: OptionalUrl = None,
    state_dir: OptionalUrl = None,
    settle_seconds: float = 5.0,
    watch_minutes: float = 55.0,
    poll_seconds: float = 30.0,
) -> list[dict]:
    """Emits `grpoflow.dataset.landed` for each new, settled dataset file version under `uri`, looking every
    `poll_seconds` for `watch_minutes`; returns the payloads.

    Args:
        uri (`str`): a local folder (relative to the worker's working directory) or `s3://bucket/prefix`.
        spec (`str`, *optional*): path or URI of a spec file, passed on in each event (the triggered run uses it
            instead of its default spec).
        state_dir (`str`, *optional*): where the state file lives (relative: to the working directory), or an
            `s3://` prefix that watchers on several machines share; default `GRPOFLOW_WATCH_STATE_DIR`, else
            `~/.grpoflow/watch-state`.
        settle_seconds (`float`, *optional*, defaults to 5): a file is complete once its size and version (its
            modification time, or ETag) have not changed for this long.
        watch_minutes (`float`, *optional*, defaults to 55): how long this run keeps looking (0: one look); with the
            hourly schedule, one run an hour.
        poll_seconds (`float`, *optional*, defaults to 30): time between two looks of one run.
    """
    logger = get_run_logger()
    for name, value, stores in (("uri", uri, OBJECT_STORES), ("spec", spec, STORES)):
        if value and (refused := outside_stores(value, stores)):  # before the first look, not at each for an hour
            raise ValueError(f"{name} {value}: {refused}")
    for name, value in (("uri", uri), ("spec", spec), ("state_dir", state_dir)):
        if value and (refused := path_outside(name, value)):  # the pool's GRPOFLOW_DEPLOYED_PATHS
            raise ValueError(refused)
    if not is_remote(uri):
        uri = str(Path(uri).expanduser().resolve())
    if state_dir and not is_remote(state_dir):
        state_dir = str(Path(state_dir).expanduser().resolve())
    state_path(uri, state_dir)  # a state_dir it cannot use fails the run now, not every look for an hour
    deadline, landed, looks, result, error = time.monotonic() + watch_minutes * 60, [], 0, None, None
    while True:
        looks += 1
        try:
            result = look_once(uri, spec, state_dir, settle_seconds)
        except Exception as e:  # a storage hiccup: the next look tries again
            error = e
            logger.warning("look %d at %s failed: %s: %s", looks, uri, type(e).__name__, e)
        else:
            for payload in result["landed"]:
                logger.info("landed: %s (%d bytes, %s)", payload["uri"], payload["size"], payload["version"])
            landed += result["landed"]
        if time.monotonic() + poll_seconds > deadline:
            break
        time.sleep(poll_seconds)
    if result is None:
        raise error
    logger.info("state of %s: %s", uri, result["state_file"])
    return Completed(message=summary(uri, landed, result["pending"], looks), data=landed)


def summary(uri: str, landed: list[dict], pending: list[str], looks: int) -> str:
    """The run's state message, so the runs list in the UI shows what the run found."""
    text = f"{len(landed)} new dataset file(s) under {uri}"
    if looks > 1:
        text += f" in {looks} looks"
    if pending:
        text += f"; {len(pending)} waiting to settle: {', '.join(pending)}"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Look at a folder or s3://bucket/prefix for new datasets.")
    parser.add_argument("uri")
    parser.add_argument("--spec", help="spec file passed on in each event")
    parser.add_argument(
        "--state-dir", help=f"state folder or s3:// prefix (default ${STATE_DIR_ENV} or ~/.grpoflow/watch-state)"
    )
    parser.add_argument("--settle-seconds", type=float, default=5.0, help="unchanged this long: complete (5)")
    parser.add_argument("--minutes", type=float, default=0.0, help="keep looking this long (default 0: one look)")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="time between looks (30)")
    args = parser.parse_args(argv)
    landed = watch_new_data(
        args.uri,
        args.spec,
        args.state_dir,
        args.settle_seconds,
        watch_minutes=args.minutes,
        poll_seconds=args.poll_seconds,
    )
    print(json.dumps(landed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
