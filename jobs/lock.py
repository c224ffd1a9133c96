"""One writer per job folder: `<job>/.lock` names the process that runs the job (pid, host, process start time).

`JobLock(job).acquire()` takes the file's kernel lock through `filelock` (an `flock`, which the kernel drops when its
process ends however it ends), then writes its owner record into the locked file; a second run of the same job, here
or on another machine sharing the folder, fails to take the lock and is refused with `JobLocked` naming the holder.
filelock locks and says nothing of who holds it, so the owner record is ours: it is written, and a record a run that
ended without releasing left in the file is read, under the kernel lock (filelock's `on_acquired`), so two runs
taking over a stale lock at the same moment cannot both win. A record written by another host that did not release
it is never taken over (a filesystem may not carry locks between machines): remove the file by hand once that run is
known to be dead. `release()` removes the file and drops the lock, only if it is ours.
"""

import json
import os
import socket
import threading
from datetime import UTC, datetime
from pathlib import Path

import psutil
from filelock import FileLock, Timeout


class JobLocked(RuntimeError):
    """Another live process holds the job folder; the message names it."""


def _me() -> dict:
    proc = psutil.Process()
    return {
        "pid": proc.pid,
        "host": socket.gethostname(),
        "process_started": proc.create_time(),
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _alive(owner: dict) -> bool:
    """Whether the lock's owner still runs (on this host: its pid, with the same start time, so a reused pid is no
    owner). An owner on another host counts as alive: there is no way to know from here."""
    if owner.get("host") != socket.gethostname():
        return True
    try:
        proc = psutil.Process(int(owner["pid"]))
        return abs(proc.create_time() - float(owner["process_started"])) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False


def _held_by(path: Path, owner: dict) -> str:
    return (
        f"job {path.parent.name} is being run by pid {owner.get('pid')} on {owner.get('host')} since "
        f"{owner.get('since')}; wait for it, or remove {path} if that run is dead"
    )


# The locks this process holds, by path. A retried flow run in the same process takes the same job again
# (re-entrant, released once); and filelock releases a lock whose last reference goes, so this keeps it.
_held: dict[str, FileLock] = {}
_held_guard = threading.Lock()


class JobLock:
    """The lock of one job folder. Re-entrant within a process: a retried flow run in the same process keeps it."""

    def __init__(self, root: Path):
        self.path = Path(root) / ".lock"

    def holder(self) -> dict | None:
        """The lock file's owner record, or None when unlocked (or not yet written: an empty file)."""
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def acquire(self) -> None:
        """Takes the lock, taking over a stale one. Raises `JobLocked` when a live process holds it."""
        key = str(self.path.resolve())
        with _held_guard:
            if key in _held:
                return  # ours already
            # Not thread-local: a flow's tasks take and release it on different threads.
            lock = FileLock(self.path, mode=0o644, blocking=False, thread_local=False, on_acquired=self._claim)
            try:
                lock.acquire()
            except Timeout:
                owner = self.holder()
                if owner is None:
                    raise JobLocked(
                        f"job {self.path.parent.name} is being started by another run; wait for it"
                    ) from None
                raise JobLocked(_held_by(self.path, owner)) from None
            _held[key] = lock

    def _claim(self, fd: int) -> None:
        """Under the kernel lock: refuses a live owner's record, else writes ours. A record of this host whose process
        is gone is stale (taken over); one of another host, or of a live process that wrote it without the kernel
        lock (grpoflow before the flock), is refused (raising here makes filelock drop the lock)."""
        try:
            owner = json.loads(os.pread(fd, 1 << 16, 0) or b"null")
        except ValueError:
            owner = None  # a torn record: its writer died mid-write
        if isinstance(owner, dict) and owner.get("pid") is not None and _alive(owner):
            raise JobLocked(_held_by(self.path, owner))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        os.fsync(fd)

    def check(self) -> None:
        """Raises `JobLocked` when another live process holds the lock (without taking it)."""
        if str(self.path.resolve()) in _held:
            return
        owner = self.holder()
        if owner and _alive(owner):
            raise JobLocked(_held_by(self.path, owner))

    def release(self) -> None:
        """Removes the lock file and drops the lock when this process holds it."""
        with _held_guard:
            lock = _held.pop(str(self.path.resolve()), None)
            if lock is None:
                return
            # Removed before the lock goes (filelock leaves the file): a run waiting on this file then sees it gone
            # and opens the path again.
            self.path.unlink(missing_ok=True)
            lock.release(force=True)
