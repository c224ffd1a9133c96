"""Events: each goes to Prefect and to the job's events.jsonl, in order, about the job's resource."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime

import pytest
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventIDFilter, EventResourceFilter

from grpoflow.core.jobdir import JobDir
from grpoflow.integrations.events import emit

pytestmark = pytest.mark.usefixtures("prefect_server")


def lines(job: JobDir) -> list[dict]:
    return [json.loads(line) for line in job.events.read_text().splitlines()]


def test_events_are_appended_in_order_about_the_job(tmp_path):
    job = JobDir(tmp_path / "demo-20261130-000000-abcdef")  # emit creates the folder if needed
    first = emit(job, "grpoflow.job.started", {"name": "demo"})
    emit(job, "grpoflow.dataset.ingested", {"num_train": 20})
    emit(job, "grpoflow.job.completed")

    records = lines(job)
    assert records[0] == first  # what emit returns is the line it wrote
    assert [r["event"] for r in records] == [
        "grpoflow.job.started",
        "grpoflow.dataset.ingested",
        "grpoflow.job.completed",
    ]
    assert [r["payload"] for r in records] == [{"name": "demo"}, {"num_train": 20}, {}]  # no payload: {}
    for r in records:
        assert r["resource"] == {
            "prefect.resource.id": "grpoflow.job.demo-20261130-000000-abcdef",
            "grpoflow.job_id": "demo-20261130-000000-abcdef",
        }
        assert uuid.UUID(r["id"]) and datetime.fromisoformat(r["occurred"]).tzinfo is not None
    times = [datetime.fromisoformat(r["occurred"]) for r in records]
    assert times == sorted(times) and len({r["id"] for r in records}) == 3


def stored_events(flt: EventFilter, count: int) -> list:
    """The events the server stored that match `flt`, once it has `count` of them (or after two minutes)."""
    # The server stores events in the background, within a second or two; waiting longer only costs a loaded machine
    # time, never the test.
    deadline = time.monotonic() + 120
    with get_client(sync_client=True) as client:
        while len(stored := client.read_events(filter=flt, limit=50).events) < count and time.monotonic() < deadline:
            time.sleep(0.5)
    return stored


def test_prefect_receives_the_same_events(tmp_path):
    job = JobDir(tmp_path / "sent-20261130-000000-abcdef")
    written = [emit(job, "grpoflow.training.progress", {"step": s}) for s in (1, 2)]
    stored = stored_events(EventFilter(resource=EventResourceFilter(id=[f"grpoflow.job.{job.job_id}"])), 2)
    assert sorted(str(e.id) for e in stored) == sorted(r["id"] for r in written)
    assert {e.event for e in stored} == {"grpoflow.training.progress"}
    assert sorted(e.payload["step"] for e in stored) == [1, 2]


def test_concurrent_emits_write_whole_lines(tmp_path):
    # The training task's watcher and the webhook threads emit while other stages may too.
    job = JobDir(tmp_path / "busy-20261130-000000-abcdef")

    def burst(n: int) -> None:
        for i in range(20):
            emit(job, "grpoflow.training.progress", {"thread": n, "i": i})

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = lines(job)  # every line parses
    assert len(records) == 80 and len({r["id"] for r in records}) == 80
    for n in range(4):  # each thread's events in the order it emitted them
        assert [r["payload"]["i"] for r in records if r["payload"]["thread"] == n] == list(range(20))


def test_without_a_prefect_api_events_stay_local(tmp_path, monkeypatch):
    """Outside a flow run, with no Prefect API configured, an event goes to events.jsonl only: Prefect's emit_event
    would start an ephemeral server for it (15 s for `grpoflow serving register`)."""
    import prefect.events
    from prefect.settings import PREFECT_API_URL, temporary_settings

    def no_prefect(**kwargs):
        raise AssertionError("emit_event called with no Prefect API configured")

    monkeypatch.setattr(prefect.events, "emit_event", no_prefect)
    job = JobDir(tmp_path / "demo-20261130-000000-abcdef")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        record = emit(job, "grpoflow.deployment.registered", {"name": "tiny"})
    assert lines(job) == [record]


EMIT_AND_EXIT = """
import sys
from pathlib import Path
from grpoflow.integrations.events import emit
from grpoflow.core.jobdir import JobDir

print(emit(JobDir(Path(sys.argv[1])), "grpoflow.deployment.registered", {"name": "tiny"})["id"])
"""


def test_a_command_that_emits_and_exits_has_sent_the_event(tmp_path):
    """`serving register` emits outside any flow run, then its process ends: the event reaches Prefect before `emit`
    returns, and nothing of Prefect's is left sending at exit ("EventsWorker - Still processing items")."""
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_API_URL": get_current_settings().api.url}  # this session's server
    job = tmp_path / "deployed-20261130-000000-abcdef"
    proc = subprocess.run(
        [sys.executable, "-c", EMIT_AND_EXIT, str(job)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "Still processing" not in proc.stderr and "EventsWorker" not in proc.stderr, proc.stderr
    event_id = proc.stdout.strip()
    [stored] = stored_events(EventFilter(id=EventIDFilter(id=[uuid.UUID(event_id)])), 1)
    assert stored.event == "grpoflow.deployment.registered" and stored.resource.id == f"grpoflow.job.{job.name}"
