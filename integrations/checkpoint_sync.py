"""Checkpoints that survive losing the machine: with a remote `output_uri`, the job folder reaches
`<output_uri>/<job_id>/` while GRPO trains, not only when the job ends.

`CheckpointSync(job, location)` is a background thread of the training task (the parent process; the training child
knows nothing of it). Every half second it looks for a new intact checkpoint in `checkpoints/`; for each, and at
least every `FILES_EVERY_S` seconds, it first uploads the rest of the job folder that changed (metrics.jsonl,
events.jsonl, logs/, and once the spec, dataset/ and sft/ a fresh machine needs to resume), then the checkpoint:
its files, `trainer_state.json`, and last a manifest, `grpoflow-checkpoint.json` (each file's size and sha256). Remote
checkpoints the child's `save_total_limit` removed locally are removed remotely too. Training never waits for an
upload: when a store takes longer for a checkpoint than training takes to save the next, the thread goes on with the
newest one and skips those in between.

A remote checkpoint is intact when its manifest exists and every file it lists is there with that size; a killed
upload leaves no manifest, so it is never taken. `restore_checkpoint(job, location)`, before a training child starts,
downloads the newest intact remote checkpoint when the local folder has none as new (a fresh machine, or an empty
staging folder), checks every file's sha256, and only then puts it in `checkpoints/`.
"""

import contextvars
import hashlib
import json
import logging
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import fsspec

from grpoflow.core.jobdir import JobDir
from grpoflow.integrations.storage import filesystem
from grpoflow.trainers.grpo import checkpoint_step, intact_checkpoint

logger = logging.getLogger(__name__)
MANIFEST = "grpoflow-checkpoint.json"
TRAINER_STATE = "trainer_state.json"  # what `intact_checkpoint` reads: uploaded after the other files
CHECK_S = 0.5  # how often the thread looks for a new checkpoint (a local listing)
FILES_EVERY_S = 10.0  # metrics, events and logs at least this often between checkpoints
CHUNK = 8 * 2**20


# --- checkpoints, one at a time --------------------------------------------------------------------------------------


def local_checkpoints(job: JobDir) -> list[Path]:
    """The intact checkpoints in `checkpoints/`, oldest first."""
    if not job.checkpoints.exists():
        return []
    found = [p for p in job.checkpoints.glob("checkpoint-*") if p.name.rsplit("-", 1)[-1].isdigit()]
    return sorted((p for p in found if intact_checkpoint(p)), key=checkpoint_step)


def _copy(src, dst) -> tuple[int, str]:
    """Streams `src` into `dst` (open file objects); returns the bytes copied and their sha256."""
    digest, size = hashlib.sha256(), 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _listing(local: Path) -> dict[str, int]:
    return {p.relative_to(local).as_posix(): p.stat().st_size for p in local.rglob("*") if p.is_file()}


def upload_checkpoint(fs: fsspec.AbstractFileSystem, local: Path, remote: str) -> dict:
    """Uploads the checkpoint folder `local` to `remote`: its files, then `trainer_state.json`, then the manifest.
    Returns the manifest (`{"step", "files": {relative path: {"size", "sha256"}}}`).

    An earlier manifest at `remote` goes first, so a checkpoint saved again (a resumed run) is never intact while its
    files are replaced. The manifest is written only when the local folder is, after the upload, still intact with
    the same files: a checkpoint the child's rotation removed meanwhile raises `FileNotFoundError` instead."""
    if fs.exists(f"{remote}/{MANIFEST}"):
        fs.rm_file(f"{remote}/{MANIFEST}")
    listed = _listing(local)
    if TRAINER_STATE not in listed:
        raise FileNotFoundError(f"{local} has no {TRAINER_STATE}")
    entries = {}
    for name in sorted(listed, key=lambda n: (n == TRAINER_STATE, n)):
        with (local / name).open("rb") as src, fs.open(f"{remote}/{name}", "wb") as dst:
            size, sha = _copy(src, dst)
        entries[name] = {"size": size, "sha256": sha}
    sizes = {name: entry["size"] for name, entry in entries.items()}
    if not intact_checkpoint(local) or _listing(local) != listed or sizes != listed:
        raise FileNotFoundError(f"{local} changed during its upload (removed by the checkpoint rotation?)")
    manifest = {"step": checkpoint_step(local), "files": entries}
    fs.pipe_file(f"{remote}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
    return manifest


def remote_manifest(fs: fsspec.AbstractFileSystem, remote: str) -> dict | None:
    """The manifest of the remote checkpoint `remote` when it is intact: the manifest is there, names the folder's
    step, and every file it lists exists with its size; else None."""
    try:
        manifest = json.loads(fs.cat_file(f"{remote}/{MANIFEST}"))
        sizes = {n.removeprefix(remote.rstrip("/") + "/"): i["size"] for n, i in fs.find(remote, detail=True).items()}
        if manifest["step"] != checkpoint_step(remote) or TRAINER_STATE not in manifest["files"]:
            return None
        if all(sizes.get(name) == entry["size"] for name, entry in manifest["files"].items()):
            return manifest
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def remote_checkpoints(fs: fsspec.AbstractFileSystem, remote_dir: str) -> list[str]:
    """The `checkpoint-N` folders under `remote_dir`, intact or not, newest first."""
    fs.invalidate_cache()
    try:
        names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(remote_dir, detail=False)]
    except FileNotFoundError:
        return []
    names = [n for n in names if n.startswith("checkpoint-") and n.rsplit("-", 1)[-1].isdigit()]
    return [f"{remote_dir.rstrip('/')}/{n}" for n in sorted(names, key=checkpoint_step, reverse=True)]


def newest_remote_checkpoint(fs: fsspec.AbstractFileSystem, remote_dir: str) -> tuple[str, dict] | None:
    """The newest intact checkpoint under `remote_dir` and its manifest, or None."""
    for remote in remote_checkpoints(fs, remote_dir):
        if (manifest := remote_manifest(fs, remote)) is not None:
            return remote, manifest
    return None


def download_checkpoint(fs: fsspec.AbstractFileSystem, remote: str, manifest: dict, dest: Path) -> bool:
    """Downloads the remote checkpoint to `dest` when every file matches its manifest (size and sha256): into a
    hidden folder beside `dest`, renamed to `dest` once complete. Returns whether it did."""
    staged = dest.with_name(f".{dest.name}.download-{uuid.uuid4().hex[:8]}")
    try:
        for name, entry in manifest["files"].items():
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            with fs.open(f"{remote}/{name}", "rb") as src, (staged / name).open("wb") as dst:
                if _copy(src, dst) != (entry["size"], entry["sha256"]):
                    logger.warning("%s/%s does not match its manifest: checkpoint not taken", remote, name)
                    return False
        if dest.exists():
            shutil.rmtree(dest)  # a torn local copy of the same step
        staged.rename(dest)
        return True
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def restore_checkpoint(job: JobDir, location: str) -> str | None:
    """Before a training child starts: downloads the newest intact checkpoint under `<location>/checkpoints` into the
    job folder when no local intact checkpoint is as new (a fresh machine). Returns its name, or None."""
    fs, remote = filesystem(location)
    local = local_checkpoints(job)
    for candidate in remote_checkpoints(fs, f"{remote}/checkpoints"):
        if local and checkpoint_step(candidate) <= checkpoint_step(local[-1]):
            return None
        manifest = remote_manifest(fs, candidate)
        if manifest and download_checkpoint(fs, candidate, manifest, job.checkpoints / candidate.rsplit("/", 1)[-1]):
            return candidate.rsplit("/", 1)[-1]
    return None


def prune_remote(fs: fsspec.AbstractFileSystem, remote_dir: str, keep: set[str]) -> list[str]:
    """Removes the remote checkpoints whose names are not in `keep`; returns the names removed."""
    removed = []
    for remote in remote_checkpoints(fs, remote_dir):
        name = remote.rsplit("/", 1)[-1]
        if name not in keep:
            fs.rm(remote, recursive=True)
            removed.append(name)
    return removed


def sync_checkpoints(fs: fsspec.AbstractFileSystem, job: JobDir, remote: str) -> list[str]:
    """Uploads every intact local checkpoint the remote lacks intact, oldest first, then removes the remote ones that
    are gone locally; what `grpoflow.tasks.bookkeeping.upload_job` does with `checkpoints/`. Returns the names
    uploaded."""
    uploaded, local = [], local_checkpoints(job)
    for path in local:
        if remote_manifest(fs, f"{remote}/checkpoints/{path.name}") is None:
            upload_checkpoint(fs, path, f"{remote}/checkpoints/{path.name}")
            uploaded.append(path.name)
    if local:  # never leave the remote without a checkpoint over a local folder that lost its own
        prune_remote(fs, f"{remote}/checkpoints", {p.name for p in local})
    return uploaded


# --- the rest of the job folder --------------------------------------------------------------------------------------


def job_files(job: JobDir) -> list[Path]:
    """The files of the job folder that belong remotely: all but `checkpoints/` (`upload_checkpoint`'s), the lock,
    and temporary files (hidden names: atomic writes, downloads in progress; `*.tmp`)."""
    files = []
    for path in sorted(job.root.rglob("*")):
        rel = path.relative_to(job.root)
        if rel.parts[0] == job.checkpoints.name or any(p.startswith(".") for p in rel.parts):
            continue
        if path.suffix != ".tmp" and path.is_file():
            files.append(path)
    return files


class FileMirror:
    """Uploads the job folder's files that changed since their last upload (by size and mtime); the first call takes
    the remote's listing for what is already there (same size, uploaded after the local file was last changed)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, job: JobDir, remote: str):
        self.fs, self.job, self.remote, self.sent = fs, job, remote.rstrip("/"), None

    def _remote_state(self) -> dict[str, tuple[int, float]]:
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.remote, detail=True)
        except FileNotFoundError:
            return {}
        state = {}
        for name, info in found.items():
            modified = info.get("LastModified") or info.get("mtime")
            if isinstance(modified, datetime):
                modified = modified.astimezone(UTC).timestamp()
            state[name.removeprefix(self.remote + "/")] = (int(info.get("size") or 0), float(modified or 0))
        return state

    def push(self) -> int:
        """Uploads what changed; returns the number of files uploaded. JSON Lines files go up to their last complete
        line (the child may be writing one)."""
        if self.sent is None:
            self.sent = {}
            for name, (size, modified) in self._remote_state().items():
                path = self.job.root / name
                # LastModified has whole seconds on S3: a file changed within the second of its upload, to the
                # same size, would be missed; a job's files grow, or change far apart.
                if path.is_file() and path.stat().st_size == size and path.stat().st_mtime < modified + 1:
                    self.sent[name] = (path.stat().st_size, path.stat().st_mtime_ns)
        count = 0
        for path in job_files(self.job):
            name, stat = path.relative_to(self.job.root).as_posix(), path.stat()
            if self.sent.get(name) == (stat.st_size, stat.st_mtime_ns):
                continue
            if path.suffix == ".jsonl":
                data = path.read_bytes()
                self.fs.pipe_file(f"{self.remote}/{name}", data[: data.rfind(b"\n") + 1])
            else:
                self.fs.put_file(str(path), f"{self.remote}/{name}")
            self.sent[name] = (stat.st_size, stat.st_mtime_ns)
            count += 1
        return count


# --- the background thread -------------------------------------------------------------------------------------------


class CheckpointSync(threading.Thread):
    """Mirrors a training job to its remote location while the child trains: `start()` before the child, `stop()`
    after it (one last round: the newest checkpoint and the files). A failed round is logged and tried again; it
    never fails the training.

    The thread runs in a copy of the context that made it (as Prefect's own thread pool runs tasks): a thread starts
    with an empty one, in which Prefect's settings are those it read at import, without the API URL that `grpoflow
    run` sets later for its temporary server, and the run logger's first line there would boot a second, ephemeral,
    server (`grpoflow.integrations.prefect_server`).

    Args:
        job (`JobDir`): the local (staging) job folder.
        location (`str`): `<output_uri>/<job_id>`.
        log (`logging.Logger`, *optional*): where uploads are reported (the task's run logger).
    """

    def __init__(self, job: JobDir, location: str, log: logging.Logger | logging.LoggerAdapter | None = None):
        super().__init__(name=f"checkpoint-sync-{job.job_id}", daemon=True)
        self.job, self.location, self.log = job, location, log or logger
        self.fs, self.remote = filesystem(location)
        self.remote = self.remote.rstrip("/")
        self.files = FileMirror(self.fs, job, self.remote)
        self.uploaded: str | None = None  # the newest checkpoint known intact remotely
        self.uploads: list[dict] = []  # {"checkpoint", "seconds", "bytes"} per checkpoint uploaded
        self.errors, self.skipped = 0, 0  # failed rounds; checkpoints rotated away before their upload ended
        self._current: Path | None = None
        self._stopping = threading.Event()
        self._files_at = 0.0
        self._context = contextvars.copy_context()  # the task run's, with the Prefect settings of its server

    def run(self) -> None:
        self._context.run(self._rounds)

    def _rounds(self) -> None:
        while True:
            stopping = self._stopping.wait(CHECK_S)
            try:
                self._round(final=stopping)
            except Exception as e:  # a store hiccup: the next round retries
                if not (
                    isinstance(e, FileNotFoundError) and self._rotated()
                ):  # rotated: the next round takes the newest
                    self.errors += 1
                    self.log.warning("upload to %s failed (retried): %s: %s", self.location, type(e).__name__, e)
            if stopping:
                return

    def summary(self) -> dict:
        """What the thread uploaded: checkpoints, their seconds and megabytes, the failed rounds."""
        seconds, size = sum(u["seconds"] for u in self.uploads), sum(u["bytes"] for u in self.uploads)
        return {
            "checkpoints": len(self.uploads),
            "seconds": round(seconds, 3),
            "mb": round(size / 1e6, 1),
            "errors": self.errors,
            "skipped": self.skipped,
        }

    def stop(self, timeout: float | None = None) -> None:
        """Ends the thread after one last round; waits at most `timeout` seconds for it (None: until done)."""
        self._stopping.set()
        self.join(timeout)
        if self.is_alive():
            self.log.warning(
                "uploads to %s still running after %s s; the job's end uploads the rest", self.location, timeout
            )

    def _rotated(self) -> bool:
        """Whether the checkpoint being uploaded is gone or changed locally (the child's `save_total_limit`)."""
        if self._current is None or intact_checkpoint(self._current):
            return False
        self.skipped += 1
        return True

    def _round(self, final: bool) -> None:
        if self.uploaded is None:
            newest = newest_remote_checkpoint(self.fs, f"{self.remote}/checkpoints")
            self.uploaded = newest[0].rsplit("/", 1)[-1] if newest else ""
        local = local_checkpoints(self.job)
        due = local[-1] if local and local[-1].name != self.uploaded else None
        if due is not None or final or time.monotonic() - self._files_at >= FILES_EVERY_S:
            # Before the checkpoint: its metrics (and the spec, dataset and logs) are remote whenever it is intact.
            self.files.push()
            self._files_at = time.monotonic()
        if due is None:
            return
        started, self._current = time.monotonic(), due
        manifest = upload_checkpoint(self.fs, due, f"{self.remote}/checkpoints/{due.name}")
        self.uploaded = due.name
        size = sum(e["size"] for e in manifest["files"].values())
        self.uploads.append({"checkpoint": due.name, "seconds": round(time.monotonic() - started, 3), "bytes": size})
        self.log.info("%s uploaded to %s (%.1f MB)", due.name, self.location, size / 1e6)
        keep = {p.name for p in self.job.checkpoints.glob("checkpoint-*")} | {due.name}
        prune_remote(self.fs, f"{self.remote}/checkpoints", keep)
