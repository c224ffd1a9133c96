"""Remote storage for every path grpoflow accepts (`dataset.uri`, `output_uri`, spec files, the watcher's `uri`).

Anything fsspec opens works; `s3://` goes through s3fs, which takes its endpoint and credentials from the standard
AWS environment variables (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT_URL_S3`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_PROFILE`, ...). To keep them in Prefect instead, save a `RemoteFileSystem` block whose `settings` are the fsspec
options and name it in `GRPOFLOW_STORAGE_BLOCK`:

    from prefect.filesystems import RemoteFileSystem
    RemoteFileSystem(basepath="s3://my-bucket", settings={
        "key": "...", "secret": "...", "client_kwargs": {"endpoint_url": "https://minio.example:9000"}}
    ).save("grpoflow-s3")

    export GRPOFLOW_STORAGE_BLOCK=grpoflow-s3

A job whose `output_uri` is remote runs in a local staging folder (`GRPOFLOW_STAGING_DIR`, default
`~/.grpoflow/staging`), which is uploaded to `<output_uri>/<job_id>/` when the job ends
(`grpoflow.tasks.bookkeeping.upload_job_task`). `grpoflow jobs/metrics/model --output-uri s3://...` read a local
copy of the jobs' top-level files (`mirror_job_files`).
"""

import functools
import hashlib
import os
from pathlib import Path

import fsspec

from grpoflow.core.uris import is_remote

STORAGE_BLOCK_ENV = "GRPOFLOW_STORAGE_BLOCK"
STAGING_ENV = "GRPOFLOW_STAGING_DIR"


def storage_options(uri: str | os.PathLike) -> dict:
    """fsspec options for `uri`: the settings of the `GRPOFLOW_STORAGE_BLOCK` block, else none (AWS env vars apply).

    Args:
        uri (`str`): the path or URL about to be opened; local paths get no options.
    """
    block = os.environ.get(STORAGE_BLOCK_ENV)
    if not block or not is_remote(uri):
        return {}
    return dict(_block_settings(block))


@functools.cache
def _block_settings(name: str) -> dict:
    from prefect.filesystems import RemoteFileSystem

    return RemoteFileSystem.load(name).settings


def filesystem(uri: str | os.PathLike) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and in-filesystem path of `uri`, with `storage_options`; listings are never cached."""
    fs, path = fsspec.core.url_to_fs(str(uri), **storage_options(uri))
    # s3fs keeps directory listings; a watcher or a second look must see the store as it is now.
    fs.invalidate_cache()
    return fs, path


def join(root: str, *parts: str) -> str:
    """`root/part/...` for a URL or a local path."""
    return "/".join([str(root).rstrip("/"), *parts]) if is_remote(root) else str(Path(root).joinpath(*parts))


def mirror_job_files(uri: str) -> Path:
    """A local copy of the top-level files of every job folder under the remote output root `uri` (spec.yaml,
    metrics.jsonl, events.jsonl, model.json, ...), for `grpoflow jobs/metrics/model`; weights and checkpoints stay
    remote. Returns the copy's root, `<staging root>/.remote/<hash of uri>`."""
    fs, root = filesystem(uri)
    local = staging_root() / ".remote" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    for job in fs.ls(root, detail=True) if fs.exists(root) else []:
        if job["type"] != "directory":
            continue
        job_id = job["name"].rstrip("/").rsplit("/", 1)[-1]
        for entry in fs.ls(job["name"], detail=True):
            if entry["type"] == "file":
                (local / job_id).mkdir(parents=True, exist_ok=True)
                fs.get_file(entry["name"], str(local / job_id / entry["name"].rsplit("/", 1)[-1]))
    return local


def staging_root() -> Path:
    """Where jobs with a remote `output_uri` run before their folder is uploaded."""
    return Path(os.environ.get(STAGING_ENV) or "~/.grpoflow/staging").expanduser().resolve()
