"""One writer per job folder: `<job>/.lock` names the process that runs the job (pid, host, process start time).

`JobLock(job).acquire()` takes an exclusive kernel lock on the file (`flock`), which the kernel drops when its process
ends however it ends, then writes its owner record into it; a second run of the same job, here or on another machine
sharing the folder, fails to take the lock and is refused with `JobLocked` naming the holder. Taking over a stale
lock (a crashed or killed run's record, left in the file) happens under that same kernel lock, so two runs taking
over at the same moment cannot both win. A record written by another host that did not release it is never taken
over (a filesystem may not carry locks between machines): remove the file by hand once that run is known to be
dead. `release()` removes the file and drops the lock, only if it is ours.
"""

import fcntl
import json
import os
import socket
import threading
from datetime import UTC, datetime
from pathlib import Path

import psutil


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


# The locks this process holds: path -> the open file whose flock is the lock. A retried flow run in the same
# process takes the same job again (re-entrant); flock would refuse a second open file of the same process.
_held: dict[str, int] = {}
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
            fd = self._locked_fd()
            try:
                self._check_record(fd)
                record = json.dumps(_me()).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, record, 0)
                os.fsync(fd)
            except BaseException:
                os.close(fd)  # drops the flock
                raise
            _held[key] = fd

    def _locked_fd(self) -> int:
        """An open file of `.lock` holding its flock, the file that is at the path now (a file another run removed
        while this one opened it locks nothing: opened again)."""
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owner = self.holder()
                if owner is None:
                    raise JobLocked(
                        f"job {self.path.parent.name} is being started by another run; wait for it"
                    ) from None
                raise JobLocked(_held_by(self.path, owner)) from None
            try:
                same = os.fstat(fd).st_ino == self.path.stat().st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # released and removed by its holder between our open and our flock
        raise JobLocked(f"could not lock {self.path}: other runs keep taking and releasing it")

    def _check_record(self, fd: int) -> None:
        """Under the flock: the record a run that ended without releasing left in the file. One of this host whose
        process is gone is stale (taken over); one of another host, or of a live process that wrote it without the
        flock (grpoflow before the flock), is refused."""
        try:
            owner = json.loads(os.pread(fd, 1 << 16, 0) or b"null")
        except ValueError:
            owner = None  # a torn record: its writer died mid-write
        if isinstance(owner, dict) and owner.get("pid") is not None and _alive(owner):
            raise JobLocked(_held_by(self.path, owner))

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
            fd = _held.pop(str(self.path.resolve()), None)
            if fd is None:
                return
            self.path.unlink(missing_ok=True)  # before the flock goes: a waiting open then finds no file, or a new one
            os.close(fd)
