"""The canary (grpoflow.jobs.canary, tasks/canary.py, `grpoflow canary`): one real full-length GRPO step of
builtin:tiny on this CPU, measured; a memory it cannot fit and a known-bad stack fail it, by the CLI (exit 2) and in
the pipeline (Rejected before training, nothing trained)."""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from grpoflow.core.spec import load_spec
from grpoflow.jobs import canary
from grpoflow.trainers.child import free_port
from tests.conftest import cli


def test_every_entry_of_the_shipped_table_reads():
    for entry in yaml.safe_load(canary.COMPAT_TABLE.read_text()):
        assert entry["issue"] and entry["fix"] and entry["when"]
        for specifier in entry["when"].values():
            SpecifierSet(specifier)  # raises on a malformed one


def test_a_known_bad_pair_is_named_with_its_issue(tmp_path):
    table = tmp_path / "compat.yaml"
    transformers = version("transformers")
    table.write_text(
        yaml.safe_dump(
            [
                {"when": {"transformers": f"=={transformers}", "torch": ">=1"}, "issue": "X #1: breaks", "fix": "y"},
                {"when": {"transformers": f"=={transformers}", "no-such-package": ">=0"}, "issue": "never", "fix": ""},
            ]
        )
    )
    versions = canary.installed_versions()
    [line] = canary.known_bad(versions, table)
    assert f"transformers {transformers}" in line and "torch " in line and line.endswith(": X #1: breaks; install y")
    assert canary.known_bad(versions) == []  # the shipped table: this stack is fine


def test_the_step_is_the_jobs_own_at_full_length(make_spec):
    spec, _ = load_spec(make_spec("c", trl={"generation_kwargs": {"top_k": 5}}))
    data = canary.canary_spec(spec)
    assert data["hyperparameters"]["max_steps"] == 1
    assert data["trl"]["generation_kwargs"] == {"top_k": 5, "min_new_tokens": spec.hyperparameters.max_response_length}
    assert data["hyperparameters"]["rollouts_per_prompt"] == spec.hyperparameters.rollouts_per_prompt
    load_spec(_written(data, make_spec))  # what the canary's child reads is a valid spec


@pytest.mark.parametrize(
    "changes",
    [
        {"evaluation": {"holdout": 4, "every": 2, "select": "best"}},  # "best" wants every > 0: the canary has none
        {"evaluation": {"holdout": 4, "every": 2, "gate": {"min_gain": 0.05, "approval": True}}},
        {"checkpoint_every": 2, "rollouts": {"every": 2, "groups_per_step": 1}},
        {"sft": {"enabled": True, "max_steps": 5}, "budget": {"max_training_hours": 0.5}},
        {"hyperparameters": {"max_steps": 3, "lora_rank": 4, "skip_zero_variance_groups": True}},
        {"stop_on_alert": True, "health": {"no_signal_window": 2}},
    ],
    ids=["select-best", "gate-approval", "checkpoints-rollouts", "sft-budget", "lora-skip", "health"],
)
def test_the_canarys_spec_of_any_job_shape_is_valid(make_spec, changes):
    # Found by `grpoflow canary` on a job with select: best: the canary's own spec was refused before its step.
    spec, _ = load_spec(make_spec("c", **changes))
    load_spec(_written(canary.canary_spec(spec), make_spec))


@pytest.mark.parametrize("prompts, share", [(4, 2), (3, 2), (1, 1)])
def test_a_machines_share_is_a_valid_one_machine_spec(make_spec, prompts, share):
    spec, _ = load_spec(make_spec("c", hyperparameters={"prompts_per_step": prompts}, **TWO_MACHINES))
    data, said = canary.machine_share(spec)
    assert data["hyperparameters"]["prompts_per_step"] == share and data["distributed"]["num_machines"] == 1
    assert ("groups kept whole" in said) is (prompts % 2 == 1)  # rounded up: at least its share
    load_spec(_written(data, make_spec))
    one, _ = load_spec(make_spec("c"))
    assert canary.machine_share(one) == (canary.canary_spec(one), None)


def test_a_share_that_cannot_be_sharded_here_fails_before_any_child(make_spec, tmp_path):
    sharded = {**TWO_MACHINES, "distributed": {**TWO_MACHINES["distributed"], "strategy": "fsdp2"}}
    spec, _ = load_spec(make_spec("c", gpu_count=1, **sharded))
    result = canary.run_canary(spec, tmp_path / "never-read")
    assert result["status"] == "failed" and "one machine cannot take its share here" in result["reason"]


def test_a_failed_steps_log_outlives_the_canarys_folder(make_spec, dataset_file, tmp_path):
    from grpoflow.core.errors import ChildFailed
    from grpoflow.trainers.dataset import ingest_dataset

    def crashing(spec, job):
        job.logs.mkdir(parents=True, exist_ok=True)
        (job.logs / "canary.log").write_text("Traceback ...\nRuntimeError: boom\n")
        raise ChildFailed(f"... retried ...; the whole log is {job.logs / 'canary.log'}.", "training child exited 1")

    spec, _ = load_spec(make_spec("c"))
    ingest_dataset(str(dataset_file), tmp_path / "dataset")
    result = canary.run_canary(spec, tmp_path / "dataset", run_step=crashing)
    reason, kept = result["reason"].split("; its log: ")
    assert reason == "the step did not run: training child exited 1"  # not the stage's retry advice
    assert "boom" in open(kept).read()
    os.unlink(kept)
    job_log = tmp_path / "logs" / "canary.log"  # the pipeline's: the job folder's logs/canary.log
    result = canary.run_canary(spec, tmp_path / "dataset", run_step=crashing, log=job_log)
    assert result["reason"].endswith(f"; its log: {job_log}") and "boom" in job_log.read_text()


def _written(data: dict, make_spec):
    path = make_spec("c")
    path.write_text(yaml.safe_dump(data))
    return path


# A job over two machines: here, the step is one machine's share (its prompts divided among the machines).
TWO_MACHINES = {"distributed": {"num_machines": 2, "shared_volume": "rwx"}, "output_uri": "s3://bucket/runs"}


def test_the_cli_measures_a_step_and_a_memory_it_cannot_fit_fails_it(make_spec):
    spec = make_spec("c", hyperparameters={"prompts_per_step": 2}, **TWO_MACHINES)
    code, out, err = cli("canary", spec, "--json")
    assert code == 0, err[-2000:]
    result = json.loads(out)
    assert result["status"] == "passed" and result["device"] == "cpu"
    assert result["share"].startswith("one machine's share of the job's 2: its memory and step time, without")
    assert result["peak_memory_gb"] > 0.1 and result["step_seconds"] > 0 and result["tokens_per_second"] > 0
    # 3 steps of the measured one, and once what train() spent around it (at most the canary's whole time).
    projected = result["projected_training_hours"] * 3600
    assert result["step_seconds"] * 3 <= projected + 0.01 <= result["step_seconds"] * 3 + result["canary_seconds"]
    assert {"torch", "transformers", "trl", "peft"} <= set(result["versions"])
    # The same step against 10 MB: refused with what to change (the verdict from the measured figures).
    loaded, _ = load_spec(spec, ["canary.device_memory_gb=0.01"])
    measured = {"train_runtime": 1.0, "peak_memory_gb": result["peak_memory_gb"]}
    verdict = canary._verdict(loaded, measured, 0.01, loaded.hyperparameters.prompts_per_step)
    assert verdict["status"] == "failed" and "more than the 0.01 GB it must fit in" in verdict["reason"]
    assert "try, in order: fewer hyperparameters.rollouts_per_prompt" in verdict["reason"]


def test_a_known_bad_stack_ends_the_pipeline_rejected_before_sft_keeping_why(
    make_spec, tmp_path, monkeypatch, prefect_server
):
    from grpoflow.core.jobdir import JobDir
    from grpoflow.integrations.job_folders import job_status
    from grpoflow.trainers.metrics import read_events

    table = tmp_path / "compat.yaml"
    table.write_text(yaml.safe_dump([{"when": {"torch": ">=0"}, "issue": "T #9: bad", "fix": "another torch"}]))
    monkeypatch.setattr(canary, "COMPAT_TABLE", table)
    spec = make_spec("c", canary={"enabled": True}, sft={"enabled": True, "max_steps": 2})
    runs = tmp_path / "runs"
    code, out, err = cli("--output-uri", runs, "run", spec, "--json")
    assert code == 2, err[-2000:]
    assert "canary failed: a known-bad stack: torch" in err and "T #9: bad" in err
    # Before SFT and GRPO: no SFT model, no checkpoint, no training.json.
    assert "Task run 'sft" not in out + err and "Task run 'train" not in out + err
    assert (
        not list(runs.rglob("sft")) and not list(runs.rglob("checkpoint-*")) and not list(runs.rglob("training.json"))
    )
    # The refused job keeps its folder, marked rejected, with the canary's verdict and log saying why.
    [job] = [JobDir(path) for path in runs.iterdir() if path.is_dir()]
    verdict = json.loads((job.root / "canary.json").read_text())
    assert verdict["status"] == "failed" and "T #9: bad" in verdict["reason"]
    assert (job.logs / "canary.log").read_text().endswith(f"grpoflow canary: failed: {verdict['reason']}\n")
    assert job_status(job) == "failed"
    assert read_events(job.events)[-1]["payload"]["reason"] == "rejected"
    # The spec run again is a job of its own: the kept folder is not in the way (and stays as it was).
    kept = {path.relative_to(runs): path.stat().st_mtime_ns for path in job.root.rglob("*")}
    code, _, err = cli("--output-uri", runs, "run", spec, "--json")
    assert code == 2 and "canary failed: a known-bad stack" in err, err[-2000:]
    assert len([path for path in runs.iterdir() if path.is_dir()]) == 2
    assert {path.relative_to(runs): path.stat().st_mtime_ns for path in job.root.rglob("*")} == kept


# --- a vLLM server (generation.vllm_mode: server): its health endpoint, on loopback ------------------------------


class _Health(BaseHTTPRequestHandler):
    status = 200  # what GET /health answers

    def do_GET(self):
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    """An HTTP server on loopback whose GET /health answers `_Health.status`; yields (its URL, the handler class)."""
    handler = type("Handler", (_Health,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def test_the_vllm_servers_health_endpoint_is_checked(health_server):
    url, handler = health_server
    # Healthy; TRL's handshake (init_communicator) needs vllm and a CUDA GPU, neither of which is here.
    assert (
        canary.check_vllm_server(url, 2)
        == f"vLLM server at {url}: healthy; TRL's handshake not tried (no vllm or no GPU here)"
    )
    handler.status = 503  # up but not ready (a model still loading): refused once the timeout has passed
    with pytest.raises(canary.CanaryFailed, match=rf"vLLM server at {url} did not answer .* within 1 s \(HTTP 503\)"):
        canary.check_vllm_server(url, 1)


def test_an_unreachable_vllm_server_fails_the_canary_by_name(make_spec):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    generation = {"engine": "vllm", "vllm_mode": "server", "vllm_server_url": url}
    spec = make_spec("v", generation=generation, trl={"vllm_server_timeout": 2})
    code, out, err = cli("canary", spec, "--json")
    assert code == 2, err[-2000:]
    result = json.loads(out)
    assert result["status"] == "failed" and result["step_seconds"] is None  # the step never started
    assert result["reason"].startswith(f"the vLLM server at {url} did not answer its health check (GET {url}/health)")
    assert "fix generation.vllm_server_url" in result["reason"]


def test_the_summary_says_the_projection_in_a_unit_that_reads(make_spec):
    # A tiny job's projection read "project to 0.00 h of training"; the budget's cap is still said in hours.
    spec, _ = load_spec(make_spec("c", budget={"max_training_hours": 1}))
    passed = {"status": "passed", "device": "cpu", "peak_memory_gb": 0.6, "device_memory_gb": 24.0}
    passed |= {"step_seconds": 0.03, "tokens_per_second": 1000.0}
    lines = [canary.summary_line({**passed, "projected_training_hours": h}, spec) for h in (0.00005, 0.5, 3.0)]
    assert [line.split("; ")[1] for line in lines] == [
        "3 steps project to 0.2 s of training",
        "3 steps project to 30.0 min of training",
        "3 steps project to 3.0 h of training, above budget.max_training_hours (1 h): training stops at the cap",
    ]
