"""End-to-end runs of the grpo-pipeline flow on builtin:tiny through the CLI, against a real Prefect server."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import gain_line
from grpoflow.core.spec.markdown import number
from grpoflow.flows.cli import main
from grpoflow.trainers.metrics import read_events, read_metrics
from grpoflow.trainers.model.tiny import build_tiny

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

REQUIRED_METRICS = {"reward", "reward_std", "loss", "completions/mean_length", "entropy"}


def run(spec_path, *extra) -> tuple[int, dict | None]:
    """`grpoflow run SPEC --json` in this process; returns the exit code and the printed JSON."""
    out = io.StringIO()
    # Only stdout is redirected: Prefect's log handlers keep the stderr they first saw.
    with contextlib.redirect_stdout(out):
        code = main(["run", str(spec_path), "--json", *extra])
    lines = out.getvalue().strip().splitlines()
    return code, json.loads(lines[-1]) if code == 0 else None


def events(job: JobDir) -> list[str]:
    return [r["event"] for r in read_events(job.events)]


def assert_generates(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    enc = tokenizer(["What is 2+3?"], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]


def metric_values(job: JobDir) -> list[dict]:
    """Each step's logged values but its time."""
    return [{k: v for k, v in r["values"].items() if k != "step_time"} for r in read_metrics(job.metrics)]


def test_full_finetune_and_the_same_seed_gives_the_same_metrics(make_spec):
    # No gate: deployed whatever the score (the default gate keeps back a model no better than its start).
    code, result = run(make_spec("full", deploy={"name": "full-demo"}, evaluation={"holdout": 4, "gate": None}))
    assert code == 0
    assert result["status"] == "completed"
    job = JobDir(Path(result["output_dir"]))

    records = read_metrics(job.metrics)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert REQUIRED_METRICS <= r["values"].keys()
        assert "kl" not in r["values"]  # kl_coef = 0: no KL term, no reference model
        assert {"rewards/exact_answer/mean", "rewards/length_penalty/mean"} <= r["values"].keys()

    # The full fine-tune changed the weights and the result loads and generates.
    before = load_file(build_tiny() / "model.safetensors")
    after = load_file(job.merged / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert_generates(job.merged)
    assert json.loads(job.model_json.read_text())["artifact_type"] == "full"

    names = events(job)
    assert names[0] == "grpoflow.job.started" and names[-1] == "grpoflow.job.completed"
    assert names.index("grpoflow.dataset.ingested") < names.index("grpoflow.training.completed")
    assert "grpoflow.training.progress" in names
    evaluation = json.loads(job.evaluation.read_text())
    assert evaluation["metric"] == "exact_answer" and evaluation["n"] == 4
    assert 0.0 <= evaluation["before"] <= 1.0 and 0.0 <= evaluation["after"] <= 1.0
    report = job.report.read_text()
    assert "exact_answer" in report and (job.root / "reward.png").exists()
    # spec.deploy: registered from merged/ and ready after its smoke inference
    assert names.index("grpoflow.deployment.registered") < names.index("grpoflow.job.completed")
    deployment = json.loads((job.root.parent / "deployments" / "full-demo.json").read_text())
    assert deployment["status"] == "ready" and deployment["job_id"] == job.job_id

    # The same seed, data and hyperparameters (the job's name, gate and deployment aside, which training never
    # reads) train to the same values at every step.
    code, again = run(make_spec("seeded"))
    assert code == 0
    assert again["output_dir"] != result["output_dir"]
    assert metric_values(JobDir(Path(again["output_dir"]))) == metric_values(job)


def test_lora_with_kl(make_spec):
    spec = make_spec("lora", hyperparameters={"lora_rank": 4, "kl_coef": 0.05})
    code, result = run(spec)
    assert code == 0
    job = JobDir(Path(result["output_dir"]))
    records = read_metrics(job.metrics)
    assert all("kl" in r["values"] for r in records)  # kl_coef > 0: kl logged every step
    config = json.loads((job.adapter / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 4  # alpha defaults to rank
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    info = json.loads(job.model_json.read_text())
    assert info["artifact_type"] == "adapter" and "adapter_model.safetensors" in info["files"]
    assert "model.safetensors" in info["merged_files"]
    # The adapter trained: merging it changed the base weights.
    before = load_file(build_tiny() / "model.safetensors")
    after = load_file(job.merged / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if "proj" in k)
    assert_generates(job.merged)
    assert "grpoflow.adapter.merged" in events(job)


def test_qlora(make_spec):
    spec = make_spec("qlora", hyperparameters={"lora_rank": 4, "load_in_4bit": True})
    code, result = run(spec)
    assert code == 0
    job = JobDir(Path(result["output_dir"]))
    assert (job.adapter / "adapter_model.safetensors").exists()
    assert "loaded in 4-bit: True" in (job.logs / "train.log").read_text()
    merged = load_file(job.merged / "model.safetensors")
    assert all(t.dtype in (torch.float32, torch.bfloat16) for t in merged.values())  # merged is not 4-bit
    assert_generates(job.merged)


def test_sft_warmup(make_spec):
    spec = make_spec("sft", sft={"enabled": True, "max_steps": 5, "batch_size": 8})
    code, result = run(spec)
    assert code == 0
    job = JobDir(Path(result["output_dir"]))
    assert (job.sft / "model.safetensors").exists()
    names = events(job)
    assert names.index("grpoflow.sft.completed") < names.index("grpoflow.training.completed")
    # GRPO started from the SFT weights, not the base model.
    assert json.loads(job.training_result.read_text())["start_model"] == str(job.sft)

    # The report's times are the events' figures, and they add up to no more than the wall time waited.
    payloads = {r["event"]: r["payload"] for r in read_events(job.events)}
    trained, warmed = payloads["grpoflow.training.completed"], payloads["grpoflow.sft.completed"]
    report = job.report.read_text()
    times = dict(
        line.strip("| ").split(" | ") for line in report.split("## Time\n\n")[1].split("\n\n")[0].splitlines()[2:]
    )
    assert times["SFT warm-up (its child process)"] == f"{warmed['seconds']:.1f} s"
    assert times["GRPO: imports and model load"] == f"{trained['setup_seconds']:.1f} s"
    assert times["GRPO: training (TRL's train_runtime)"] == f"{trained['train_runtime']:.1f} s"
    assert times["GRPO: its whole child process"] == f"{trained['wall_seconds']:.1f} s"
    assert trained["setup_seconds"] + trained["train_runtime"] <= trained["wall_seconds"]
    waited = float(times["wall time until this report (since grpoflow run started)"].removesuffix(" s"))
    assert warmed["seconds"] + trained["wall_seconds"] <= waited


def test_what_the_prefect_ui_shows(make_spec, standin):
    """What the UI shows of a run (its name, final state, artifacts) is the flow's, not training's: the stand-in
    child trains (its merged/ is the start model, so the state says no checkpoint beat it)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from tests.integrations.test_artifacts import flow_run_artifacts

    ungated = {"holdout": 4, "gate": {"min_gain": None}}  # deployed whatever the score
    spec = make_spec("ui", hyperparameters={"max_steps": 2}, deploy={"name": "ui-demo"}, evaluation=ungated)
    code, result = run(spec)
    assert code == 0
    job = JobDir(Path(result["output_dir"]))
    with get_client(sync_client=True) as client:
        [flow_run] = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[job.job_id])))
    # The run is named after its job; its final state says the score and the verdict.
    evaluation = json.loads(job.evaluation.read_text())
    before, after = evaluation["before"], evaluation["after"]
    # The gain with its interval (evaluation.confidence's default 0.95), as core/scores.py says it.
    assert (
        evaluation["confidence"] == 0.95
        and evaluation["ci"]["gain"][0] <= after - before <= evaluation["ci"]["gain"][1]
    )
    summary = gain_line("exact_answer", before, after, evaluation["ci"]["gain"], 0.95)
    assert " -> " in summary and "95% CI " in summary
    if after <= before:  # the message says no checkpoint beat the start
        summary += f"; no checkpoint beat the starting model: the last, step 2, scored {number(after)} against"
        summary += f" the start's {number(before)}"
    assert flow_run.state.is_completed()
    assert flow_run.state.message == f"completed: {summary}; healthy"

    artifacts = flow_run_artifacts(flow_run.id)
    assert {"ui-report", "ui-evaluation", "ui-training-progress", "ui-deployment"} <= artifacts.keys()
    report = artifacts["ui-report"].data
    assert report.startswith(f"# GRPO job report: {job.job_id}") and "![reward](data:image/png;base64," in report
    [row] = json.loads(artifacts["ui-evaluation"].data)
    assert (row["metric"], row["prompts"], row["before"], row["after"]) == ("exact_answer", 4, before, after)
    assert artifacts["ui-training-progress"].data == 100
    registry = (job.root.parent / "deployments" / "ui-demo.json").resolve()
    assert artifacts["ui-deployment"].data.endswith(f"]({registry.as_uri()})")


def test_the_stage_table_takes_and_reads_only_earlier_stages():
    # The pipeline as data (flows/pipeline.py STAGES): the flow runs it in order, so a stage may take or read only
    # what an earlier one produced; the resumable ones carry the record their task declared.
    from grpoflow.flows.pipeline import STAGES

    names = [stage.name for stage in STAGES]
    assert names == [
        "ingest", "canary", "sft", "train", "merge", "evaluate", "gate", "approval", "publish", "register"
    ]  # fmt: skip
    for i, stage in enumerate(STAGES):
        assert {v for v in stage.takes.values() if isinstance(v, str)} <= set(names[:i]), stage.name
        if (record := stage.resumable()) is not None:
            assert record.name == stage.name and set(record.reads) <= set(names[:i]), stage.name
    assert [stage.name for stage in STAGES if stage.resumable()] == ["ingest", "sft", "train", "merge", "evaluate"]
