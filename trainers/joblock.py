"""One writer per job folder: `<job>/.lock` names the process that runs the job (pid, host, process start time).

`JobLock(job).acquire()` creates the file atomically (`O_CREAT | O_EXCL`); a second run of the same job, here or on
another machine sharing the folder, finds it and is refused with `JobLocked` naming the holder. A lock whose holder
is gone (a crashed or killed run: same host, and no process with that pid and start time) is stale and taken over.
A lock held from another host cannot be checked from here and is never taken over: remove the file by hand once
that run is known to be dead. `release()` removes the file only if it is still ours.
"""

import json
import os
import socket
import time
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


class JobLock:
    """The lock of one job folder. Re-entrant within a process: a retried flow run in the same process keeps it."""

    def __init__(self, root: Path):
        self.path = Path(root) / ".lock"

    def holder(self) -> dict | None:
        """The lock file's owner record, or None when unlocked (or unreadable: a torn write counts as no lock)."""
        try:
            owner = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def acquire(self) -> None:
        """Takes the lock, taking over a stale one. Raises `JobLocked` when a live process holds it."""
        me = _me()
        for _ in range(3):  # a stale lock removed by two runs at once: one of them wins the create
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.holder()
                if owner and owner.get("pid") == me["pid"] and owner.get("host") == me["host"]:
                    return  # ours already
                if owner is None and time.time() - self._mtime() < 5:
                    time.sleep(0.2)  # being written right now
                    continue
                if owner is not None and _alive(owner):
                    raise JobLocked(_held_by(self.path, owner)) from None
                self.path.unlink(missing_ok=True)  # stale: its owner is gone
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            return
        raise JobLocked(f"could not lock {self.path}: another run keeps taking it")

    def check(self) -> None:
        """Raises `JobLocked` when another live process holds the lock (without taking it)."""
        owner = self.holder()
        mine = owner and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname()
        if owner and not mine and _alive(owner):
            raise JobLocked(_held_by(self.path, owner))

    def release(self) -> None:
        """Removes the lock file when this process holds it."""
        owner = self.holder()
        if owner and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)

    def _mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0
