"""Job folders, for the CLI and the flows alike: where a job's folder is (`job_dir`,
`job_location`), which output roots hold jobs (`search_roots`: `./runs` and every root the job index knows), a job
found by its id (`find_job`), its status as its events tell it (`job_status`), and a remote job folder copied down
(`download_job`) or up (`upload_job`).

A remote output root (`s3://...`) is read through a local copy of its jobs' top-level files (spec, metrics, events,
model.json); a remote job runs in a local staging folder and is uploaded as it ends.
"""

import os
from datetime import datetime
from pathlib import Path

from grpoflow.core.jobdir import JobDir, check_job_id, index_dir, known_roots, locate
from grpoflow.core.spec import JobSpec, SpecError, load_spec, resolved_dict
from grpoflow.integrations.checkpoint_sync import FileMirror, sync_checkpoints
from grpoflow.integrations.storage import (
    filesystem,
    is_remote,
    join,
    mirror_job_files,
    staging_root,
    storage_options,
)
from grpoflow.trainers.metrics import read_events


class UnknownJob(LookupError):
    """No such job under the output roots looked in: the user's to fix, exit code 2 (docs/design.md, "The CLI")."""


class BadJobReference(ValueError):
    """A job id that cannot name a job folder, or an output root that cannot be read: the user's to fix (exit 2)."""


def job_dir(output_root: str | Path, job_id: str) -> JobDir:
    """The local job folder: under `output_root`, or under the staging folder when `output_root` is remote."""
    check_job_id(job_id)  # a flow parameter too: the UI could pass anything
    if is_remote(output_root):
        return JobDir(staging_root() / job_id)
    return JobDir(Path(output_root).expanduser().resolve() / job_id)


def job_location(job: JobDir, spec: JobSpec) -> str:
    """Where the job folder ends up: `<output_uri>/<job_id>` for a remote output_uri, else the local folder."""
    return join(spec.output_uri, job.job_id) if is_remote(spec.output_uri) else str(job.root)


def checked_job_id(job_id: str, option: str = "") -> str:
    """`job_id` when it names a job folder; a `BadJobReference` otherwise. `option` prefixes the message."""
    try:
        return check_job_id(job_id)
    except ValueError as e:
        raise BadJobReference(f"{option}{': ' if option else ''}{e}") from None


def local_root(root: str) -> Path:
    """The local folder holding the job folders of output root `root` (for `s3://...`, a copy of their files)."""
    if is_remote(root):
        from grpoflow.core.uris import unopenable

        if reason := unopenable(root):
            raise BadJobReference(f"cannot read output root {root}: {reason}")
        return mirror_job_files(root)
    return Path(root).expanduser().resolve()


def search_roots(explicit: str | None) -> list[str]:
    """Where to look for jobs: `explicit` alone when given; else `./runs` and every output root in the job index
    (`grpoflow.core.jobdir`: each `grpoflow run` records where its job went)."""
    if explicit:
        return [explicit]
    return list(dict.fromkeys([str(Path("runs").resolve()), *known_roots()]))


def resume_problem(spec: JobSpec, job_id: str, option: str) -> str | None:
    """Why `job_id` cannot be resumed with `spec`, or None: a resumed job must run the spec it started with (its
    stages' records, its checkpoints and whoever later promotes its model count on it), so a job id that names no
    job under the spec's output_uri (local or remote), or whose spec.yaml differs from `spec` (output_uri aside), is
    refused. `option` prefixes the message (`--resume`, `job_id`); a job id that is no job id raises
    `BadJobReference`."""
    root = spec.output_uri if is_remote(spec.output_uri) else str(Path(spec.output_uri).expanduser().resolve())
    saved = join(root, checked_job_id(job_id, option), "spec.yaml")
    fs, path = filesystem(saved)
    if not fs.exists(path):
        return f"{option}: unknown job {job_id!r} under {root}"
    try:
        before = resolved_dict(load_spec(saved, storage_options=storage_options(saved))[0])
    except SpecError as e:  # edited since, or written by a grpoflow whose rules differ
        return f"{option}: job {job_id}'s spec.yaml no longer loads ({'; '.join(e.problems)}); start a new job instead"
    after = resolved_dict(spec)
    changed = sorted(k for k in before.keys() | after.keys() if k != "output_uri" and before.get(k) != after.get(k))
    if changed:
        return (
            f"{option}: the spec differs from job {job_id}'s spec.yaml in: {', '.join(changed)}; start a new job "
            "instead (without " + ("--resume)" if option.startswith("--") else "a job id)")
        )
    return None


def find_job(job_id: str, explicit: str | None = None) -> tuple[JobDir, str]:
    """The job folder of `job_id` (a local copy for a remote job) and its location (the folder or URL): under
    `explicit` when given, else in `./runs`, else where the job index says `grpoflow run` put it."""
    checked_job_id(job_id)
    indexed = locate(job_id)
    roots = [explicit] if explicit else [str(Path("runs").resolve())]
    if indexed and not explicit:
        roots.append(indexed.rstrip("/").rsplit("/", 1)[0])
    for root in dict.fromkeys(roots):
        job = JobDir(local_root(root) / job_id)
        if job.spec.exists():
            return job, join(root, job_id) if is_remote(root) else str(job.root)
    index = "" if explicit or indexed else f", nor in the job index {index_dir()}"
    raise UnknownJob(f"unknown job {job_id!r} under {', '.join(roots)}{index} (see `grpoflow jobs`)")


def job_status(job: JobDir) -> str:
    """`running`, `completed` or `failed` by the job's last `grpoflow.job.*` event; `unknown` without one."""
    status = "unknown"
    for record in read_events(job.events):
        event = record.get("event", "")
        if event in ("grpoflow.job.started", "grpoflow.job.completed", "grpoflow.job.failed"):
            status = {"started": "running", "completed": "completed", "failed": "failed"}[event.rsplit(".", 1)[1]]
    return status


# --- a remote job folder and its local copy ----------------------------------------------------------------------


def download_job(job: JobDir, location: str) -> None:
    """Copies the remote job folder at `location` into the local `job.root`, all but `checkpoints/`: the training
    task takes the newest intact one (`grpoflow.integrations.checkpoint_sync.restore_checkpoint`) when it needs one.
    Each file keeps its remote modification time, so the uploads that follow skip what is already there."""
    fs, remote = filesystem(location)
    remote = remote.rstrip("/")
    if not fs.exists(remote):
        return
    for name, info in fs.find(remote, detail=True).items():
        rel = name.removeprefix(remote + "/")
        if rel.split("/", 1)[0] == job.checkpoints.name or info.get("type") != "file" or rel.startswith("."):
            continue  # checkpoints come as needed; hidden names (the lease) are no job files
        (job.root / rel).parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(name, str(job.root / rel))
        if isinstance(modified := info.get("LastModified"), datetime):
            os.utime(job.root / rel, (modified.timestamp(), modified.timestamp()))


def upload_job(job: JobDir, spec: JobSpec, names: tuple[str, ...] = ()) -> str | None:
    """Copies the job folder (or only the top-level files `names`) to `<output_uri>/<job_id>/` when output_uri is
    remote; a no-op for a local output_uri. Returns the remote location, or None.

    Files already uploaded unchanged (the training task's `CheckpointSync` sends most while GRPO trains) are skipped;
    checkpoints go up as `grpoflow.integrations.checkpoint_sync.upload_checkpoint` sends them (a manifest last), and
    the remote keeps only those the local folder still has. A second upload after the last events were appended is
    cheap with `names`.
    """
    if not is_remote(spec.output_uri):
        return None
    location = job_location(job, spec)
    fs, remote = filesystem(location)
    if names:
        for name in names:
            if (job.root / name).exists():
                fs.put_file(str(job.root / name), f"{remote}/{name}")
    else:
        # Every file but the lock (it only means something on the machine that holds it) and temporary ones.
        FileMirror(fs, job, remote).push()
        sync_checkpoints(fs, job, remote.rstrip("/"))
    return location
