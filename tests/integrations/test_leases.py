"""Leases on the S3-protocol server (moto on loopback): one holder at a time, renewed while it lives, taken over once
it stopped renewing; and the job lease that keeps two machines from running one S3 job at once."""

import json
import threading
import time

import pytest
import s3fs

from grpoflow.core.jobdir import JobDir
from grpoflow.integrations.leases import LeaseHeld, S3Lease
from grpoflow.tasks import bookkeeping as job_module


def test_one_holder_at_a_time(bucket):
    uri = f"s3://{bucket}/job/.lease.json"
    first, second = S3Lease(uri, 60), S3Lease(uri, 60)
    first.acquire(what="job j")
    with pytest.raises(LeaseHeld, match=r"job j is held by pid \d+ on .* since "):
        second.acquire(what="job j")
    first.release()
    second.acquire()  # free again
    assert json.loads(s3fs.S3FileSystem().cat_file(f"{bucket}/job/.lease.json"))["pid"] > 0
    second.release()
    assert not s3fs.S3FileSystem().exists(f"{bucket}/job/.lease.json")


def test_racing_acquires_give_one_lease(bucket):
    uri, won, errors = f"s3://{bucket}/race/.lease.json", [], []

    def take(lease: S3Lease) -> None:
        try:
            lease.acquire()
            won.append(lease)
        except LeaseHeld:
            errors.append(lease)

    leases = [S3Lease(uri, 60) for _ in range(6)]
    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(errors) == 5


def test_a_dead_process_of_this_host_lets_go_at_once(bucket):
    # A SIGKILLed `grpoflow run` here: the resume need not wait for the lease to expire.
    uri = f"s3://{bucket}/job/.lease.json"
    gone = {"pid": 2**22 + 17, "host": __import__("socket").gethostname(), "process_started": 0.0, "at": time.time()}
    s3fs.S3FileSystem().pipe_file(f"{bucket}/job/.lease.json", json.dumps(gone).encode())
    S3Lease(uri, 600).acquire()


def test_an_expired_lease_is_taken_over_and_its_old_holder_knows(bucket):
    uri = f"s3://{bucket}/job/.lease.json"
    dead, alive = S3Lease(uri, 1.0), S3Lease(uri, 1.0)
    dead.acquire()
    time.sleep(1.3)  # the holder stopped renewing (a lost machine)
    alive.acquire()
    assert not dead.renew()  # the old holder finds out at its next beat ...
    dead.release()  # ... and its release leaves the new holder's lease alone
    assert alive.renew()
    alive.release()


def test_the_heartbeat_keeps_a_live_holders_lease(bucket):
    uri = f"s3://{bucket}/job/.lease.json"
    holder = S3Lease(uri, 0.8)
    holder.acquire()
    holder.heartbeat()
    try:
        time.sleep(1.6)  # twice the ttl: renewed every 0.2 s meanwhile
        with pytest.raises(LeaseHeld):
            S3Lease(uri, 0.8).acquire()
    finally:
        holder.release()
    S3Lease(uri, 0.8).acquire()


def test_a_second_machine_cannot_take_a_running_s3_job(bucket, make_spec, tmp_path, monkeypatch):
    # Two machines, each with its own staging folder: the local .lock cannot see the other; the lease on S3 does.
    from grpoflow.core.spec import load_spec

    spec, _ = load_spec(make_spec("s3job", output_uri=f"s3://{bucket}/runs"))
    job = JobDir(tmp_path / "machine-a" / "s3job-20261201-000000-abcdef")
    job_module.lock_remote(job, spec)
    try:
        monkeypatch.setattr(job_module, "_leases", {})  # the other machine's process holds no lease
        with pytest.raises(LeaseHeld, match=r"job s3job-20261201-000000-abcdef is held by pid \d+ on "):
            job_module.lock_remote(JobDir(tmp_path / "machine-b" / job.job_id), spec)
    finally:
        monkeypatch.undo()
        job_module.unlock_remote(job)
    job_module.lock_remote(JobDir(tmp_path / "machine-b" / job.job_id), spec)  # free once the first run ended
    job_module.unlock_remote(job)
