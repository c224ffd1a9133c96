"""Registration in the serving registry (`grpoflow serving register`, the pipeline's register task); the server it
registers for is tested in tests/trainers/test_serve.py."""

import json
import os
import shutil

import pytest

from grpoflow.core.jobdir import JobDir
from tests.conftest import cli


@pytest.fixture
def finished_job(trained_job) -> JobDir:
    """A full fine-tune the real pipeline finished (tests/conftest.py's `trained_jobs`), copied for this test."""
    return trained_job("full")


@pytest.mark.usefixtures("prefect_server")
def test_register_is_ready_after_smoke_test_and_idempotent(finished_job):
    root = finished_job.root.parent
    code, out, err = cli("--output-uri", root, "serving", "register", finished_job.job_id, "--name", "tiny", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["status"] == "ready" and first["artifact_path"] == str(finished_job.merged)
    assert first["smoke"]["prompt"].startswith("What is") and isinstance(first["smoke"]["completion"], str)

    code, out, _ = cli("--output-uri", root, "serving", "register", finished_job.job_id, "--name", "tiny", "--json")
    second = json.loads(out)
    assert code == 0 and second["created"] == first["created"] and second["updated"] >= first["updated"]
    assert [p.name for p in (root / "deployments").iterdir()] == ["tiny.json"]  # one record per name
    events = [json.loads(line)["event"] for line in finished_job.events.read_text().splitlines()]
    assert events.count("grpoflow.deployment.registered") == 2


@pytest.mark.usefixtures("prefect_server")
def test_register_mistakes(finished_job):
    root = finished_job.root.parent
    code, _, err = cli("--output-uri", root, "serving", "register", "no-such-job")
    assert code == 2 and "unknown job" in err  # bad input, as a bad --name
    code, _, err = cli("--output-uri", root, "serving", "register", finished_job.job_id, "--name", "Bad Name")
    assert code == 2 and "--name" in err
    shutil.rmtree(finished_job.merged)
    code, _, err = cli("--output-uri", root, "serving", "register", finished_job.job_id)
    assert code == 1 and "merged" in err
    code, _, err = cli("--output-uri", root, "serve", "nothing-here")
    assert code == 2 and "unknown serving name" in err


def test_every_version_is_kept_and_rolled_back(finished_job):
    root = finished_job.root.parent
    finished_job.evaluation.write_text(json.dumps({"metric": "exact_answer", "n": 2, "before": 0.0, "after": 0.5}))
    newer = JobDir(root / "trained-full-20261201-000000-abcdef")
    shutil.copytree(finished_job.root, newer.root)
    newer.evaluation.write_text(json.dumps({"metric": "exact_answer", "n": 2, "before": 0.0, "after": 0.25}))
    for job in (finished_job, newer):
        code, out, err = cli("--output-uri", root, "serving", "register", job.job_id, "--name", "tiny")
        assert code == 0 and out.endswith(f"({'version 1' if job is finished_job else 'version 2'})\n"), err

    record = json.loads((root / "deployments" / "tiny.json").read_text())
    assert record["current"] == 2 and record["job_id"] == newer.job_id and record["score"] == 0.25
    assert [(v["job_id"], v["score"], v["status"]) for v in record["versions"]] == [
        (finished_job.job_id, 0.5, "ready"),
        (newer.job_id, 0.25, "ready"),
    ]
    registered = [json.loads(line) for line in newer.events.read_text().splitlines()][-1]
    assert registered["event"] == "grpoflow.deployment.registered" and registered["payload"]["version"] == 2

    code, out, err = cli("--output-uri", root, "serving", "rollback", "tiny")
    assert code == 0 and f"rolled back to version 1 (job {finished_job.job_id})" in out, err
    record = json.loads((root / "deployments" / "tiny.json").read_text())
    assert record["current"] == 1 and record["artifact_path"] == str(finished_job.merged)  # what serve now serves
    code, out, _ = cli("--output-uri", root, "serving", "list")
    assert code == 0 and out.splitlines()[1].startswith("  * v1 ") and "exact_answer 0.500" in out.splitlines()[1]


@pytest.mark.usefixtures("prefect_server", "standin")
def test_a_run_that_misses_the_gate_completes_unpromoted(make_spec, tmp_path):
    # A gain of 2 on a 0-1 reward is out of reach; were publish attempted, it would fail (no Hub here).
    spec = make_spec(
        "gated",
        hyperparameters={"max_steps": 2},
        evaluation={"holdout": 4, "gate": {"min_gain": 2.0}},
        publish={"repo_id": "grpo-org/never-published"},
        deploy={"name": "gated"},
    )
    code, out, err = cli("run", spec)
    assert code == 0, err
    # The stand-in saves the start's weights as its result: the same score after as before, and the end lines say
    # so (they read "before GRPO 0.000, after GRPO 0.000" and nothing else).
    [job] = [JobDir(p) for p in (tmp_path / "runs").iterdir() if (p / "spec.yaml").exists()]
    evaluation = json.loads(job.evaluation.read_text())
    score = f"{evaluation['before']:.4g}"
    assert evaluation["after"] == evaluation["before"] and evaluation["improved"] is False
    no_gain = f"no checkpoint beat the starting model: the last, step 2, scored {score} against the start's {score}"
    assert f"note: {no_gain}\n" in out
    assert (
        "model not promoted (not published, not deployed): no checkpoint beat the starting model "
        f"({score} -> {score}, no change); evaluation.gate.min_gain 2 promotes only a gain of at least 2"
    ) in out
    events = [json.loads(line) for line in job.events.read_text().splitlines()]
    names = [e["event"] for e in events]
    assert "grpoflow.model.published" not in names and "grpoflow.deployment.registered" not in names
    assert names[-2:] == ["grpoflow.model.rejected", "grpoflow.job.completed"]
    [alert] = [e["payload"] for e in events if e["event"] == "grpoflow.training.alert"]
    assert alert["kind"] == "no_improvement" and alert["message"] == no_gain and alert["evidence"]["kept"] == "step 2"
    rejected = events[-2]["payload"]
    assert (rejected["before"], rejected["after"]) == (evaluation["before"], evaluation["after"])
    assert rejected["promote"] is False and rejected["min_gain"] == 2.0
    # The reason is a kind (as an approval's); the sentence `grpoflow run` printed is the message.
    assert rejected["reason"] == "no_improvement" and "evaluation.gate.min_gain 2" in rejected["message"]
    assert not (tmp_path / "runs" / "deployments").exists()


def test_register_delivers_its_webhook_before_it_exits(finished_job, tmp_path):
    """`serving register` in a process of its own (no Prefect API): the spec's webhook gets deployment.registered
    before the process exits (its deliveries run in a thread that would end with it)."""
    import http.server
    import subprocess
    import sys
    import threading

    import yaml

    received = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = yaml.safe_load(finished_job.spec.read_text())
        spec["webhooks"] = [{"url": f"http://127.0.0.1:{server.server_port}/hook"}]
        finished_job.spec.write_text(yaml.safe_dump(spec))
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        command = [sys.executable, "-m", "grpoflow.flows.cli", "--output-uri", str(finished_job.root.parent),
                   "serving", "register", finished_job.job_id, "--name", "hooked"]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert [r["type"] for r in received] == ["deployment.registered"]
    finally:
        server.shutdown()
