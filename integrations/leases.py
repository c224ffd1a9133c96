"""Leases on S3: an object that says who holds something, written with conditional writes so two machines never
both hold it.

`S3Lease("s3://bucket/prefix/job/.lock", ttl_s)` is created only when absent (If-None-Match: *), renewed only over
the version its holder wrote (If-Match its ETag), and taken over only when the holder stopped renewing it for
`ttl_s` seconds, or at once when it names a process of this host that is gone (If-Match the stale version read).
`heartbeat()` renews it in the background while its holder works, so a live holder's lease never expires, and a
dead one's (a lost pod, a SIGKILL) does after `ttl_s`. Any
S3-compatible store that honours conditional writes works (AWS S3 since 2024, MinIO, the tests' moto server).
"""

import errno
import json
import threading
import time

from grpoflow.integrations.storage import filesystem
from grpoflow.jobs.lock import _alive, _me


def conditional_put(fs, bucket: str, key: str, body: bytes, **condition) -> str | None:
    """Writes `key` under `condition` (IfNoneMatch="*", or IfMatch=an ETag); its new ETag, or None when the
    condition did not hold."""
    try:
        return fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, **condition)["ETag"]
    except FileExistsError:  # If-None-Match failed
        return None
    except OSError as e:  # s3fs's PreconditionFailed (HTTP 412) for If-Match
        if e.errno == errno.EINVAL and "pre-condition" in str(e).lower():
            return None
        raise


class LeaseHeld(RuntimeError):
    """Another live holder has the lease; `holder` says who (host, pid, since)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


class S3Lease:
    """The lease object at `uri` (an s3:// URI), for `ttl_s` seconds without renewal."""

    def __init__(self, uri: str, ttl_s: float):
        self.uri, self.ttl_s = uri, ttl_s
        self.fs, path = filesystem(uri)
        self.bucket, self.key, _ = self.fs.split_path(path)
        self.etag: str | None = None  # the version we wrote, while we hold it
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.me = _me()  # pid, host, process start, since: what `grpoflow.jobs.lock` records in a local lock

    def _body(self) -> bytes:
        return json.dumps({**self.me, "at": time.time()}).encode()

    def _put(self, **condition) -> str | None:
        return conditional_put(self.fs, self.bucket, self.key, self._body(), **condition)

    def read(self) -> tuple[dict, str] | None:
        """The lease's content and ETag, or None when there is none."""
        try:
            info = self.fs.info(f"{self.bucket}/{self.key}", refresh=True)
            data = json.loads(self.fs.cat_file(f"{self.bucket}/{self.key}"))
        except FileNotFoundError:
            return None
        except ValueError:
            data = {}  # unreadable: an expired lease
        return (data if isinstance(data, dict) else {}), info["ETag"]

    def try_acquire(self) -> dict | None:
        """Takes the lease: None when it is ours now, else the live holder's record."""
        for _ in range(5):  # each round loses only to a writer that won; a few rounds settle any race
            self.etag = self._put(IfNoneMatch="*")
            if self.etag:
                return None
            found = self.read()
            if found is None:
                continue  # released meanwhile
            holder, etag = found
            fresh = time.time() - float(holder.get("at", 0) or 0) <= self.ttl_s
            if fresh and _alive(holder):  # a holder on another host is alive until its lease expires
                return holder
            self.etag = self._put(IfMatch=etag)  # expired: take it over, unless another did first
            if self.etag:
                return None
        return holder

    def acquire(self, wait_s: float = 0.0, what: str = "this") -> None:
        """Takes the lease, waiting up to `wait_s` seconds for the holder to let go; raises `LeaseHeld` naming it."""
        deadline = time.monotonic() + wait_s
        while (holder := self.try_acquire()) is not None:
            if time.monotonic() >= deadline:
                raise LeaseHeld(
                    f"{what} is held by pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')} "
                    f"({self.uri}; it expires {self.ttl_s:.0f} s after its holder stops renewing it)",
                    holder,
                )
            time.sleep(0.5)

    def renew(self) -> bool:
        """Renews our lease; False when it is no longer ours (expired and taken over)."""
        if self.etag is None:
            return False
        self.etag = self._put(IfMatch=self.etag)
        return self.etag is not None

    def heartbeat(self) -> None:
        """Renews the lease every quarter of its ttl in a daemon thread, until `release()`."""

        def beat() -> None:
            while not self._stop.wait(self.ttl_s / 4):
                try:
                    if not self.renew():
                        return
                except OSError:
                    pass  # the store unreachable for a moment: the next beat tries again, well within the ttl

        self._stop.clear()
        self._beat = threading.Thread(target=beat, name=f"lease {self.key}", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Stops the heartbeat and removes the lease, only if it is still ours."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self.etag is None:
            return
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except (FileNotFoundError, OSError):
            pass
        self.etag = None
