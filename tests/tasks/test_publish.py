"""Tests for tasks/publish.py: the pipeline's publish task and `grpoflow publish` against the loopback Hub, the
Prefect Secret block `hf-token`, and how many attempts a failing Hub sees (one retry layer)."""

import json

import pytest

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec
from grpoflow.jobs.publish import PublishError
from grpoflow.tasks.publish import publish_task
from tests.publishing import REPO, TOKEN, WRONG, assert_no_token_in

pytestmark = pytest.mark.usefixtures("hf_home")


@pytest.fixture
def job(trained_job) -> JobDir:
    """A LoRA job the real pipeline finished (tests/conftest.py's `trained_jobs`), copied for this test."""
    return trained_job("lora")


def published_events(job: JobDir) -> list[dict]:
    events = [json.loads(line) for line in job.events.read_text().splitlines()]
    return [e for e in events if e["event"] == "grpoflow.model.published"]


# --- the Prefect task ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_publish_task_uses_the_secret_block_and_emits_the_event(hub, job, monkeypatch, capsys, caplog):
    from prefect.blocks.system import Secret

    monkeypatch.delenv("HF_TOKEN")
    spec = load_spec(job.spec, [f"publish.repo_id={REPO}"])[0]
    Secret(value=TOKEN).save("hf-token", overwrite=True)
    try:
        result = publish_task(job, spec)
    finally:
        Secret.delete("hf-token")

    assert result["changed"] and hub.repos[REPO].head.oid == result["commit"]
    published = json.loads((job.root / "published.json").read_text())
    assert {k: published[k] for k in result} == result
    events = published_events(job)
    assert len(events) == 1 and events[0]["payload"] == result
    out, err = capsys.readouterr()
    assert_no_token_in(job.root, caplog.text, out, err)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_publish_task_does_not_retry_a_rejected_token(hub, job, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", WRONG)
    spec = load_spec(job.spec, [f"publish.repo_id={REPO}"])[0]

    with pytest.raises(PublishError, match="401"):
        publish_task(job, spec)

    # One attempt: a rejected token is not retried (and the task has no Prefect retries on top).
    assert hub.hits("POST", r"/api/repos/create") == 1
    assert not (job.root / "published.json").exists() and published_events(job) == []


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_cli_publish_exit_codes(hub, job, monkeypatch):
    from tests.conftest import cli

    root, job_id = job.root.parent, job.job_id
    code, out, err = cli("--output-uri", root, "publish", job_id, "--repo-id", REPO, "--json")
    assert code == 0, err
    assert json.loads(out)["repo_id"] == REPO and (job.root / "published.json").exists()
    code, _, err = cli("--output-uri", root, "publish", job_id, "--repo-id", "not a repo")
    assert code == 2 and "--repo-id" in err
    code, _, _ = cli("--output-uri", root, "publish", "no-such-job", "--repo-id", REPO)
    assert code == 2
    monkeypatch.delenv("HF_TOKEN")
    code, _, err = cli("--output-uri", root, "publish", job_id, "--repo-id", REPO)
    assert code == 2 and "HF_TOKEN" in err and TOKEN not in err


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize(
    ("outage", "failed", "published"),
    [
        (2, 2, True),  # two 503s, then the Hub is back: the third attempt publishes
        (None, 3, False),  # the Hub stays down: three attempts in all, not three per Prefect retry
    ],
    ids=["transient", "permanent"],
)
def test_publish_task_attempts_for_a_503(hub, job, outage, failed, published):
    spec = load_spec(job.spec, [f"publish.repo_id={REPO}"])[0]
    hub.fail_always() if outage is None else hub.fail_next(outage)

    try:
        publish_task(job, spec)
    except PublishError as exc:
        assert not published and "503" in str(exc)

    # One retry layer: 3 attempts, each starting with create_repo (a failed one ends there). With Prefect's task
    # retries on top of publish's own, a Hub that stays down used to get 9.
    assert [status for _, _, status in hub.requests].count(503) == failed
    assert hub.hits("POST", r"/api/repos/create") == 3
    assert (REPO in hub.repos and len(hub.repos[REPO].commits) == 2) is published
    if not published:
        assert hub.requests == [("POST", "/api/repos/create", 503)] * 3
