"""The job's bookkeeping: its id and folder, create-job, and how it ends (`JobEnding`): the last event, a rejected new
job leaving nothing behind, a resumed one keeping its folder."""

import re
import time
from datetime import UTC, datetime

import pytest
import yaml
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventResourceFilter
from prefect.exceptions import TerminationSignal

from grpoflow.core.jobdir import new_job_id
from grpoflow.core.spec import load_spec
from grpoflow.integrations.job_folders import job_dir
from grpoflow.integrations.stages import REJECTED
from grpoflow.tasks.bookkeeping import JobEnding, create_job_task
from grpoflow.trainers.metrics import read_events

pytestmark = pytest.mark.usefixtures("prefect_server")

STARTED = datetime(2026, 11, 30, 6, 46, 28, tzinfo=UTC)


@pytest.mark.parametrize(
    "name, run_id, started, expected",
    [
        # <name>-<UTC time>-<6 hex of the flow run id>: the same on every retry of that flow run.
        ("demo", "4013d1e2-0000-4000-8000-000000000000", STARTED, "demo-20261130-064628-4013d1"),
        # A start time in another zone is written in UTC.
        (
            "demo",
            "4013d1e2-0000-4000-8000-000000000000",
            datetime.fromisoformat("2026-11-30T07:46:28+01:00"),
            "demo-20261130-064628-4013d1",
        ),
        # No flow run (a plain call): a random suffix.
        ("demo", None, STARTED, re.compile(r"^demo-20261130-064628-[0-9a-f]{6}$")),
    ],
)
def test_new_job_id(name, run_id, started, expected):
    job_id = new_job_id(name, run_id, started)
    assert expected.match(job_id) if isinstance(expected, re.Pattern) else job_id == expected


def test_two_plain_ids_in_the_same_second_differ():
    assert len({new_job_id("demo", started=STARTED) for _ in range(20)}) == 20


def test_job_dir(tmp_path, monkeypatch):
    assert job_dir(tmp_path / "runs", "j").root == (tmp_path / "runs" / "j").resolve()
    monkeypatch.setenv("GRPOFLOW_STAGING_DIR", str(tmp_path / "staging"))
    assert job_dir("s3://bucket/runs", "j").root == (tmp_path / "staging" / "j").resolve()  # uploaded at the end
    with pytest.raises(ValueError, match="not a job id"):
        job_dir(tmp_path / "runs", "../elsewhere")


@pytest.fixture
def spec(make_spec):
    return load_spec(make_spec("job"))[0]


def test_create_job_writes_the_resolved_spec_and_announces_it(spec):
    job = flow(lambda: create_job_task(spec, "job-20261130-064628-4013d1"))()
    assert job.root.is_dir() and job.job_id == "job-20261130-064628-4013d1"
    resolved = yaml.safe_load(job.spec.read_text())
    assert resolved["hyperparameters"]["max_steps"] == 3 and resolved["hyperparameters"]["kl_coef"] == 0.0  # defaults
    [started] = read_events(job.events)
    assert started["event"] == "grpoflow.job.started"
    assert started["payload"] == {"name": "job", "base_model": "builtin:tiny", "output_dir": str(job.root)}


def ended(job) -> dict:
    [last] = [
        r for r in read_events(job.events) if r["event"].startswith("grpoflow.job.") and "started" not in r["event"]
    ]
    return last


@pytest.mark.parametrize(
    "error, reason",
    [
        (KeyboardInterrupt(), "cancelled"),  # Ctrl-C
        (TerminationSignal(signal=15), "cancelled"),  # a cancelled flow run (SIGTERM from the worker or the UI)
        (RuntimeError("training child exited with code 1"), "RuntimeError"),  # a failed stage: the error's type
    ],
)
def test_an_exception_ends_the_job_failed_and_propagates(spec, error, reason):
    job = create_job_task(spec)
    with pytest.raises(type(error)):
        with JobEnding(job, spec, resumed=False):
            raise error
    last = ended(job)
    assert last["event"] == "grpoflow.job.failed" and last["payload"]["reason"] == reason
    assert last["payload"]["error"] == str(error)
    assert job.root.exists()  # a failed job keeps what it left, for inspection and resume


def prefect_events(job_id: str, count: int) -> list:
    flt = EventFilter(resource=EventResourceFilter(id=[f"grpoflow.job.{job_id}"]))
    deadline = time.monotonic() + 120  # the server stores events within seconds; a loaded machine only waits longer
    with get_client(sync_client=True) as client:
        while len(events := client.read_events(filter=flt, limit=50).events) < count and time.monotonic() < deadline:
            time.sleep(0.5)
    return events


def test_a_rejected_new_job_leaves_no_folder(spec):
    job = create_job_task(spec)
    with JobEnding(job, spec, resumed=False) as end:
        state = end.rejected("column 'answer' (needed by reward 'exact_answer') not found")
    assert state.is_failed() and state.name == REJECTED
    assert state.message == "column 'answer' (needed by reward 'exact_answer') not found"
    assert not job.root.exists()
    # Its folder is gone, but Prefect has the event.
    failed = [e for e in prefect_events(job.job_id, 2) if e.event == "grpoflow.job.failed"]
    assert [e.payload["reason"] for e in failed] == ["rejected"]


def test_a_rejected_resumed_job_keeps_its_folder(spec):
    job = create_job_task(spec)
    (job.root / "checkpoints").mkdir()  # an earlier attempt's work
    with JobEnding(job, spec, resumed=True) as end:
        state = end.rejected("bad dataset")
    assert state.name == REJECTED and (job.root / "checkpoints").is_dir()
    last = ended(job)
    assert last["event"] == "grpoflow.job.failed" and last["payload"] == {"reason": "rejected", "error": "bad dataset"}


def test_completed_announces_the_result_once(spec):
    job = create_job_task(spec)
    result = {"job_id": job.job_id, "status": "completed"}
    with JobEnding(job, spec, resumed=False) as end:
        assert end.completed(result) == result
    events = [r["event"] for r in read_events(job.events)]
    assert events == ["grpoflow.job.started", "grpoflow.job.completed"]  # and no job.failed after it
    assert read_events(job.events)[-1]["payload"] == result
