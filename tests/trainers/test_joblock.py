"""One writer per job folder (`trainers/joblock.py`): a live holder is refused by name, a dead one taken over."""

import json
import socket
import subprocess
import sys

import psutil
import pytest

from grpoflow.trainers.joblock import JobLock, JobLocked


def write_lock(root, **owner):
    (root / ".lock").write_text(json.dumps(owner))


def test_acquire_and_release(tmp_path):
    lock = JobLock(tmp_path)
    lock.acquire()
    holder = lock.holder()
    assert holder["pid"] == psutil.Process().pid and holder["host"] == socket.gethostname()
    lock.acquire()  # re-entrant: the same process (a retried flow run) keeps it
    lock.release()
    assert lock.holder() is None and not (tmp_path / ".lock").exists()


def test_a_live_holder_is_refused_by_name(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = psutil.Process(sleeper.pid).create_time()
        write_lock(tmp_path, pid=sleeper.pid, host=socket.gethostname(), process_started=started, since="2026-12-01")
        with pytest.raises(JobLocked, match=rf"is being run by pid {sleeper.pid} on {socket.gethostname()} since"):
            JobLock(tmp_path).acquire()
        JobLock(tmp_path).release()  # not ours: left alone
        assert (tmp_path / ".lock").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    "owner",
    [
        # the holder died (a SIGKILLed run): its pid is gone
        {"pid": 2**22 + 12345, "process_started": 1.0},
        # the pid was reused by another process since: its start time differs
        {"pid": psutil.Process().ppid(), "process_started": 1.0},
    ],
)
def test_a_stale_lock_is_taken_over(tmp_path, owner):
    write_lock(tmp_path, host=socket.gethostname(), since="2026-12-01", **owner)
    JobLock(tmp_path).acquire()
    assert JobLock(tmp_path).holder()["pid"] == psutil.Process().pid


def test_another_hosts_lock_is_never_taken_over(tmp_path):
    write_lock(tmp_path, pid=1, host="gpu-node-7", process_started=1.0, since="2026-12-01T02:00:00+00:00")
    with pytest.raises(JobLocked, match="pid 1 on gpu-node-7 since 2026-12-01T02:00:00"):
        JobLock(tmp_path).acquire()
