"""The data watcher (`flows/watch.py`) on a local folder and on an S3 bucket (moto's server on loopback), emitting to
a real Prefect server: one `grpoflow.dataset.landed` per new file version, never for a half-written file, never
twice."""

import json
import os
import threading
import time

import pytest
import s3fs
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

from flows.watch import EVENT, FileVersion, WatchState, event_id, is_candidate, look, state_path, watch_new_data

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


@pytest.mark.usefixtures("prefect_server")
def test_local_file_lands_once_after_two_looks(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    (incoming / "prompts.jsonl").write_bytes(ROW)
    uri = str((incoming / "prompts.jsonl").resolve())

    assert watch_new_data(str(incoming), spec="specs/small.yaml", state_dir=state) == []  # first look: pending
    landed = watch_new_data(str(incoming), spec="specs/small.yaml", state_dir=state)
    assert len(landed) == 1
    payload = landed[0]
    assert payload["uri"] == uri and payload["size"] == len(ROW) and payload["etag"] is None
    assert payload["mtime"].endswith("+00:00") and payload["version"] == f"mtime:{payload['mtime']}"
    assert payload["spec"] == "specs/small.yaml"
    assert watch_new_data(str(incoming), spec="specs/small.yaml", state_dir=state) == []  # seen: nothing new

    events = landed_events(uri)
    assert len(events) == 1
    assert events[0].payload == payload and events[0].resource.id == f"grpoflow.dataset.{uri}"


@pytest.mark.usefixtures("prefect_server")
def test_half_written_files_wait(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    (incoming / "_temporary").mkdir(parents=True)
    growing = incoming / "growing.jsonl"
    growing.write_bytes(ROW)
    for name in (".hidden.jsonl", "upload.jsonl.part", "_temporary/part-0.jsonl", "notes.txt"):
        (incoming / name).write_bytes(ROW)

    assert watch_new_data(str(incoming), state_dir=state) == []
    with growing.open("ab") as f:  # still being written between the two looks
        f.write(ROW)
    os.utime(growing, ns=(time.time_ns(), time.time_ns() + 10**9))  # coarse filesystem clocks would hide the write
    assert watch_new_data(str(incoming), state_dir=state) == []
    landed = watch_new_data(str(incoming), state_dir=state)
    assert [p["uri"] for p in landed] == [str(growing.resolve())] and landed[0]["size"] == 2 * len(ROW)

    # The temporary names never land; renamed to its final name, the upload does (after two looks).
    assert watch_new_data(str(incoming), state_dir=state) == []
    (incoming / "upload.jsonl.part").rename(incoming / "upload.jsonl")
    assert watch_new_data(str(incoming), state_dir=state) == []
    assert [p["uri"] for p in watch_new_data(str(incoming), state_dir=state)] == [str(incoming / "upload.jsonl")]


@pytest.mark.usefixtures("prefect_server")
def test_state_outlives_the_process_and_new_versions_land_again(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    data = incoming / "prompts.jsonl"
    data.write_bytes(ROW)
    watch_new_data(str(incoming), state_dir=state)
    [first] = watch_new_data(str(incoming), state_dir=state)

    # What a restarted worker reads back: the emitted version, in a JSON file named after the watched folder.
    saved = json.loads(state_path(str(incoming), state).read_text())
    assert saved["uri"] == str(incoming) and saved["emitted"] == {str(data): [first["version"]]}
    with WatchState.locked(str(incoming), state) as fresh:
        assert look(fresh) == []

    data.write_bytes(ROW * 3)  # a new version of the same file
    os.utime(data, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert watch_new_data(str(incoming), state_dir=state) == []
    [second] = watch_new_data(str(incoming), state_dir=state)
    assert second["uri"] == first["uri"] and second["version"] != first["version"] and second["size"] == 3 * len(ROW)
    assert watch_new_data(str(incoming), state_dir=state) == []


@pytest.mark.usefixtures("prefect_server")
def test_concurrent_looks_emit_once(tmp_path):
    incoming, state = tmp_path / "incoming", str(tmp_path / "state")
    incoming.mkdir()
    (incoming / "prompts.jsonl").write_bytes(ROW)
    watch_new_data(str(incoming), state_dir=state)
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
    assert watch_new_data(str(tmp_path / "not-yet"), state_dir=str(tmp_path / "state")) == []


@pytest.mark.usefixtures("prefect_server")
def test_s3_prefix(bucket, tmp_path):
    fs, state = s3fs.S3FileSystem(), str(tmp_path / "state")
    fs.pipe(f"{bucket}/incoming/day1/prompts.jsonl", ROW)
    fs.pipe(f"{bucket}/incoming/day1/more.jsonl.part", ROW)  # a client that uploads under a temporary name
    fs.pipe(f"{bucket}/elsewhere/prompts.jsonl", ROW)  # outside the watched prefix
    prefix, uri = f"s3://{bucket}/incoming", f"s3://{bucket}/incoming/day1/prompts.jsonl"

    assert watch_new_data(prefix, spec="s3://specs/small.yaml", state_dir=state) == []
    [landed] = watch_new_data(prefix, spec="s3://specs/small.yaml", state_dir=state)
    assert landed["uri"] == uri and landed["size"] == len(ROW) and landed["spec"] == "s3://specs/small.yaml"
    assert landed["etag"] == fs.info(uri)["ETag"].strip('"') and landed["version"] == f"etag:{landed['etag']}"
    assert watch_new_data(prefix, spec="s3://specs/small.yaml", state_dir=state) == []

    fs.pipe(uri, ROW * 2)  # overwritten: a new ETag, a new version
    assert watch_new_data(prefix, spec="s3://specs/small.yaml", state_dir=state) == []
    [again] = watch_new_data(prefix, spec="s3://specs/small.yaml", state_dir=state)
    assert again["uri"] == uri and again["etag"] != landed["etag"]
    assert len(landed_events(uri, expected=2)) == 2
