"""The data watcher (`flows/watch.py`) on a local folder and on an S3 bucket (moto's server on loopback), emitting to
a real Prefect server: one `grpoflow.dataset.landed` per new file version, by the first look that finds it settled,
never for a half-written file, never twice (not after a restart either, nor from two watchers sharing a state on
S3)."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import s3fs
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.settings import PREFECT_API_URL

from grpoflow.flows.watch import (
    EVENT,
    FileVersion,
    LeaseLost,
    WatchState,
    event_id,
    is_candidate,
    look,
    state_path,
    watch_new_data,
)
from tests.hostile_server import HostileServer

ROW = b'{"prompt": "What is 1+2?", "answer": "3"}\n'


def landed_events(uri: str, expected: int = 1, timeout: float = 120.0) -> list:
    """The server's `grpoflow.dataset.landed` events for `uri` (waits until `expected` are stored, or timeout).

    The server stores an event within a second or two; the timeout is far above that, so a loaded machine only waits
    longer, and the caller's count is what the test checks."""
    flt = EventFilter(
        event=EventNameFilter(name=[EVENT]), resource=EventResourceFilter(id=[f"grpoflow.dataset.{uri}"])
    )
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            events = client.read_events(filter=flt, limit=50).events  # the server caps limit at 50
            if len(events) >= expected or time.monotonic() > deadline:
                return events
            time.sleep(0.5)


@pytest.mark.parametrize(
    "path, expected",
    [
        ("prompts.jsonl", True),
        ("day/2026-11-30.csv", True),  # nested folders are watched too
        ("prompts.jsonl.gz", True),  # compressed JSON Lines, as the ingest reads them
        ("prompts.parquet", True),
        ("prompts.parquet.gz", False),  # the ingest rejects compressed Parquet
        ("notes.txt", False),  # not a dataset
        (".prompts.jsonl", False),  # hidden: rsync and many uploaders write here first
        ("_temporary/part-0.jsonl", False),  # Spark/Hadoop's staging folder
        ("prompts.jsonl.part", False),  # a download in progress
        ("prompts.jsonl.tmp", False),
        ("prompts.jsonl.partial", False),
        ("PROMPTS.JSONL", True),  # extensions are case-insensitive
    ],
)
def test_candidates(path, expected):
    assert is_candidate(path) is expected


def one_look(uri: str, **parameters):
    """One run of the watcher that looks once (the deployment's runs keep looking for an hour)."""
    return watch_new_data(uri, watch_minutes=0, **parameters)


def settled(path, seconds_ago: float = 60.0):
    """`path` as a finished upload leaves it: last modified `seconds_ago`."""
    then = time.time() - seconds_ago
    os.utime(path, (then, then))
    return path


@pytest.mark.usefixtures("prefect_server")
def test_a_settled_file_lands_in_one_look(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    (incoming / "prompts.jsonl").write_bytes(ROW)
    uri = str(settled(incoming / "prompts.jsonl").resolve())

    [payload] = one_look(str(incoming), spec="specs/small.yaml", state_dir=state)  # the first run announces it
    assert payload["uri"] == uri and payload["size"] == len(ROW) and payload["etag"] is None
    assert payload["mtime"].endswith("+00:00") and payload["version"] == f"mtime:{payload['mtime']}"
    assert payload["spec"] == "specs/small.yaml"
    again = one_look(str(incoming), spec="specs/small.yaml", state_dir=state, return_state=True)
    assert again.result() == [] and again.message == f"0 new dataset file(s) under {incoming}"  # seen: nothing new

    events = landed_events(uri)
    assert len(events) == 1
    assert events[0].payload == payload and events[0].resource.id == f"grpoflow.dataset.{uri}"


@pytest.mark.usefixtures("prefect_server")
def test_a_file_being_written_waits_until_it_settles(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    (incoming / "_temporary").mkdir(parents=True)
    growing = incoming / "growing.jsonl"
    growing.write_bytes(ROW)
    for name in (".hidden.jsonl", "upload.jsonl.part", "_temporary/part-0.jsonl", "notes.txt"):
        (incoming / name).write_bytes(ROW)
        settled(incoming / name)
    t = time.time()  # the looks below say when they happen: `now`, seconds since the epoch

    with WatchState.locked(str(incoming), state) as s:
        assert look(s, settle_seconds=5, now=t) == []  # written just now: it may still grow
        assert list(s.pending) == [str(growing)]
    with growing.open("ab") as f:  # still being written between the looks
        f.write(ROW)
    os.utime(growing, ns=(time.time_ns(), time.time_ns() + 10**9))  # coarse filesystem clocks would hide the write
    with WatchState.locked(str(incoming), state) as s:
        assert look(s, settle_seconds=5, now=t + 3) == []  # changed: settling starts again
        assert look(s, settle_seconds=5, now=t + 4) == []
    with WatchState.locked(str(incoming), state) as s:  # what the next run reads back
        landed = look(s, settle_seconds=5, now=t + 30)
    assert [p["uri"] for p in landed] == [str(growing.resolve())] and landed[0]["size"] == 2 * len(ROW)

    # The temporary names never land, however long they sit; renamed to its final name, the upload is complete.
    with WatchState.locked(str(incoming), state) as s:
        assert look(s, settle_seconds=5, now=t + 3600) == []
    (incoming / "upload.jsonl.part").rename(incoming / "upload.jsonl")
    assert [p["uri"] for p in one_look(str(incoming), state_dir=state)] == [str(incoming / "upload.jsonl")]


@pytest.mark.usefixtures("prefect_server")
def test_a_restarted_watcher_does_not_announce_again(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    data = incoming / "prompts.jsonl"
    data.write_bytes(ROW)
    [first] = one_look(str(settled(data).parent), state_dir=state)

    # What a restarted worker reads back: the emitted version, in a JSON file named after the watched folder.
    saved = json.loads(state_path(str(incoming), state).read_text())
    assert saved["uri"] == str(incoming) and saved["emitted"] == {str(data): [first["version"]]}
    # A new process (a restarted worker) on the same state folder: nothing to announce.
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    command = [sys.executable, "-m", "grpoflow.flows.watch", str(incoming), "--state-dir", state]
    restarted = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert restarted.returncode == 0, restarted.stderr
    assert json.loads(restarted.stdout.splitlines()[-1]) == []

    data.write_bytes(ROW * 3)  # a new version of the same file
    [second] = one_look(str(settled(data, 30).parent), state_dir=state)
    assert second["uri"] == first["uri"] and second["version"] != first["version"] and second["size"] == 3 * len(ROW)
    assert one_look(str(incoming), state_dir=state) == []
    assert len(landed_events(first["uri"], expected=2)) == 2


@pytest.mark.usefixtures("prefect_server")
def test_one_run_keeps_looking(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    (incoming / "prompts.jsonl").write_bytes(ROW)  # fresh: the first look may find it still settling
    run = watch_new_data(
        str(incoming), state_dir=state, settle_seconds=1, watch_minutes=0.1, poll_seconds=1, return_state=True
    )
    assert len(run.result()) == 1 and " looks" in run.message  # announced by the run, once, in one of its looks


@pytest.mark.usefixtures("prefect_server")
def test_concurrent_looks_emit_once(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    (incoming / "prompts.jsonl").write_bytes(ROW)
    settled(incoming / "prompts.jsonl")
    results, start = [], threading.Barrier(2)

    def one_look():
        start.wait()
        with WatchState.locked(str(incoming), state) as s:
            results.append(look(s))

    threads = [threading.Thread(target=one_look) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(r) for r in results) == [0, 1]


def test_event_id_names_the_version():
    file = FileVersion("s3://b/k.jsonl", 10, "abc", "2026-11-30T00:00:00+00:00")
    same = FileVersion("s3://b/k.jsonl", 10, "abc", "2026-11-30T00:05:00+00:00")  # re-listed later, same content
    changed = FileVersion("s3://b/k.jsonl", 12, "abd", "2026-11-30T00:05:00+00:00")
    assert event_id(file, None) == event_id(same, None)  # a retried emit is the same event to the server
    assert event_id(file, None) != event_id(changed, None)
    assert event_id(file, None) != event_id(file, "other.yaml")  # two watchers with different specs both start runs


@pytest.mark.usefixtures("prefect_server")
def test_missing_folder_is_empty(tmp_path):
    assert one_look(str(tmp_path / "not-yet"), state_dir=str(tmp_path / "state")) == []


@pytest.mark.usefixtures("prefect_server")
def test_s3_prefix(bucket, tmp_path):
    fs, state = s3fs.S3FileSystem(), str(tmp_path / "state")
    fs.pipe(f"{bucket}/incoming/day1/prompts.jsonl", ROW)
    fs.pipe(f"{bucket}/incoming/day1/more.jsonl.part", ROW)  # a client that uploads under a temporary name
    fs.pipe(f"{bucket}/elsewhere/prompts.jsonl", ROW)  # outside the watched prefix
    prefix, uri = f"s3://{bucket}/incoming", f"s3://{bucket}/incoming/day1/prompts.jsonl"
    spec = "s3://specs/small.yaml"

    # LastModified is just now: with an hour to settle, the look waits (and says so in the run's state message).
    waiting = one_look(prefix, spec=spec, state_dir=state, settle_seconds=3600, return_state=True)
    assert waiting.result() == [] and waiting.message.endswith(f"; 1 waiting to settle: {uri}")
    with WatchState.locked(prefix, state) as s:  # the next look, its settle time later
        [landed] = look(s, spec, settle_seconds=5, now=time.time() + 10)
    assert landed["uri"] == uri and landed["size"] == len(ROW) and landed["spec"] == spec
    assert landed["etag"] == fs.info(uri)["ETag"].strip('"') and landed["version"] == f"etag:{landed['etag']}"
    assert one_look(prefix, spec=spec, state_dir=state, settle_seconds=0) == []  # announced: never again

    fs.pipe(uri, ROW * 2)  # overwritten: a new ETag, a new version, settled by the first look that sees it
    [again] = one_look(prefix, spec=spec, state_dir=state, settle_seconds=0)
    assert again["uri"] == uri and again["etag"] != landed["etag"]
    with WatchState.locked(prefix, state) as fresh:  # the state read back, as a restarted worker would
        assert look(fresh, spec, settle_seconds=0) == []
    assert len(landed_events(uri, expected=2)) == 2


# --- a state shared by watchers on several machines (an s3:// state_dir) ---------------------------------------------


@pytest.mark.usefixtures("prefect_server")
def test_watchers_sharing_a_state_on_s3_announce_each_file_once(bucket):
    """Two watchers (threads here: two pods in production) look at the same prefix at the same moments, with their
    state under one s3:// prefix; files land between their looks. Each file is announced by exactly one of them."""
    fs, prefix, state = s3fs.S3FileSystem(), f"s3://{bucket}/incoming", f"s3://{bucket}/watch-state"
    rounds, announced = 4, {0: [], 1: []}
    start = threading.Barrier(2)

    def watcher(n: int):
        for _ in range(rounds):
            start.wait()  # both look at once
            with WatchState.locked(prefix, state) as s:
                announced[n] += [p["uri"] for p in look(s, settle_seconds=0)]
            start.wait()  # then the next files land

    threads = [threading.Thread(target=watcher, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for i in range(rounds):
        fs.pipe(f"{bucket}/incoming/day{i}/a.jsonl", ROW)
        fs.pipe(f"{bucket}/incoming/day{i}/b.jsonl", ROW)
        time.sleep(0.2)  # the watchers are at the barrier; release them once both files are there
    for t in threads:
        t.join(timeout=120)
    everything = sorted(announced[0] + announced[1])
    assert everything == sorted(f"s3://{bucket}/incoming/day{i}/{n}.jsonl" for i in range(rounds) for n in "ab")
    assert not fs.exists(state_path(prefix, state) + ".lock")  # the lease went with the last look
    saved = json.loads(fs.cat(state_path(prefix, state)))  # the one state object both read and wrote
    assert sorted(saved["emitted"]) == everything


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_two_watcher_processes_on_one_s3_state(bucket):
    """Two watcher processes (two pods) keep looking at one prefix, sharing an s3:// state, while files land."""
    fs, prefix, state = s3fs.S3FileSystem(), f"s3://{bucket}/incoming", f"s3://{bucket}/watch-state"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    command = [sys.executable, "-m", "grpoflow.flows.watch", prefix, "--state-dir", state, "--settle-seconds", "0"]
    command += ["--minutes", "0.25", "--poll-seconds", "0.3"]
    watchers = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    uris = []
    for i in range(6):
        uris.append(f"s3://{bucket}/incoming/file-{i}.jsonl")
        fs.pipe(uris[-1].removeprefix("s3://"), ROW)
        time.sleep(1)
    outputs = [w.communicate(timeout=300)[0] for w in watchers]
    assert [w.returncode for w in watchers] == [0, 0]
    announced = [p["uri"] for out in outputs for p in json.loads(out.splitlines()[-1])]
    assert sorted(announced) == sorted(uris)  # each file by one of them, once
    assert all(len(landed_events(uri)) == 1 for uri in uris)


@pytest.mark.usefixtures("prefect_server")
def test_a_dead_watchers_lease_is_taken_over(bucket, monkeypatch):
    import grpoflow.flows.watch

    fs, prefix, state = s3fs.S3FileSystem(), f"s3://{bucket}/incoming", f"s3://{bucket}/watch-state"
    fs.pipe(f"{bucket}/incoming/prompts.jsonl", ROW)
    lease = state_path(prefix, state) + ".lock"
    monkeypatch.setattr(grpoflow.flows.watch, "LEASE_WAIT_S", 1.0)
    # A live watcher's look: this one waits, then gives up naming it (the flow's next look tries again).
    fs.pipe(lease, json.dumps({"host": "pod-a", "pid": 7, "at": time.time()}).encode())
    with pytest.raises(TimeoutError, match=r"another watcher: .* is held by pid 7 on pod-a"):
        with WatchState.locked(prefix, state):
            pass
    # A watcher that died mid-look, long ago: its lease is taken over and the file announced.
    fs.pipe(lease, json.dumps({"host": "pod-a", "pid": 7, "at": time.time() - 3600}).encode())
    assert [p["uri"] for p in one_look(prefix, state_dir=state, settle_seconds=0)] == [
        f"s3://{bucket}/incoming/prompts.jsonl"
    ]
    assert not fs.exists(lease)


@pytest.mark.usefixtures("prefect_server")
def test_a_look_that_lost_its_lease_writes_nothing(bucket):
    fs, prefix, state = s3fs.S3FileSystem(), f"s3://{bucket}/incoming", f"s3://{bucket}/watch-state"
    fs.pipe(f"{bucket}/incoming/prompts.jsonl", ROW)
    with WatchState.locked(prefix, state) as s:
        # Meanwhile another watcher, taking this look for dead, announced the file and wrote the state.
        fs.pipe(
            state_path(prefix, state), json.dumps({"uri": prefix, "emitted": {"x": ["v"]}, "pending": {}}).encode()
        )
        with pytest.raises(LeaseLost, match="changed under this look"):
            s.save()
    assert json.loads(fs.cat(state_path(prefix, state)))["emitted"] == {"x": ["v"]}  # theirs, not overwritten


@pytest.mark.usefixtures("prefect_server")
def test_a_state_dir_without_conditional_writes_is_refused():
    with pytest.raises(ValueError, match=r"state_dir: 'gs://b/state': a shared state needs conditional writes"):
        one_look("s3://b/incoming", state_dir="gs://b/state")


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize("field", ["uri", "spec"])
def test_a_watch_of_a_web_address_is_refused_before_any_request(tmp_path, field):
    # A run's parameters are anyone's with access to the API: an http(s) uri or spec would have the worker list (and
    # each triggered run read) whatever address they name, the cloud's metadata service included.
    with HostileServer("huge", size=10) as server:
        parameters = {"uri": str(tmp_path), field: f"{server.url}/latest/meta-data/"}
        with pytest.raises(ValueError, match=rf"^{field} http://127.0.0.1:\d+/latest/meta-data/: http:// is refused"):
            one_look(parameters.pop("uri"), **parameters)
        assert server.requests == 0
