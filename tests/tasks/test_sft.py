"""The SFT task: the warm-up child writes sft/ and the task announces it, showing its progress as it goes (a line per
logged step, a progress artifact); a crash of the child is retried, a setup problem is not. Child starts are counted
from logs/sft.log, which every start appends to."""

import re
import shutil

import pytest
import torch
from prefect import flow
from transformers import AutoModelForCausalLM

from grpoflow.core.errors import TrainingSetupError
from grpoflow.tasks.sft import sft_task
from grpoflow.trainers.metrics import read_events
from tests.integrations.test_artifacts import flow_run_artifacts, flow_run_logs

pytestmark = pytest.mark.usefixtures("prefect_server")

WARM_UP = {"enabled": True, "max_steps": 2, "learning_rate": 3e-3, "batch_size": 4}


def test_the_warm_up_writes_sft_and_announces_it(make_job):
    job, spec = make_job("sft", sft=WARM_UP)
    summary = flow(lambda: sft_task(job, spec))()
    assert AutoModelForCausalLM.from_pretrained(job.sft).config.model_type == "qwen2"
    [event] = read_events(job.events)
    assert event["event"] == "grpoflow.sft.completed" and event["payload"] == summary
    assert summary["steps"] == 2 and summary["model_dir"] == "sft" and isinstance(summary["final_loss"], float)


def test_the_warm_up_shows_its_progress(make_job, standin, monkeypatch):
    # The task's lines from the child's sft_metrics.jsonl: the stand-in child writes it (the real one: the test above).
    # A beat every 0.3 s without a line, 2.5 s between the last step and the save (the task polls every 0.5 s).
    from grpoflow.integrations import heartbeat

    monkeypatch.setattr(heartbeat, "EVERY_S", 0.3)
    standin(sft={"save_seconds": 2.5})
    job, spec = make_job("warm", sft={**WARM_UP, "max_steps": 4}, evaluation={"holdout": 0})
    state = flow(lambda: sft_task(job, spec))(return_state=True)
    assert state.is_completed()

    # One line per logged step (each of 4 steps: SFT logs every max_steps // 50), in order, in the fixed format.
    lines = [m for m in flow_run_logs(state.state_details.flow_run_id) if m.startswith("sft step")]
    assert [int(re.match(r"sft step +(\d+)/4 ", m).group(1)) for m in lines] == [1, 2, 3, 4]
    assert all(re.fullmatch(r"sft step \d/4  loss \d+\.\d{4}  lr \S+  \S+ s/step  ETA \S+", m) for m in lines)
    # After the last step the phase before the first is over: a beat counts from the step, then the save's line.
    told = [m for m in flow_run_logs(state.state_details.flow_run_id) if m.startswith(("SFT warm-up: ", "sft step"))]
    after = told[told.index(lines[-1]) + 1 :]
    save = after.index("SFT warm-up: saving the warmed-up weights to sft/")
    assert save and all(re.fullmatch(r"SFT warm-up: after step 4/4: \d+ s so far", m) for m in after[:save]), told

    progress = flow_run_artifacts(state.state_details.flow_run_id)["warm-sft-progress"]
    assert progress.type == "progress" and progress.data == 100
    assert progress.description.startswith("sft step 4/4")


def test_a_crashed_child_is_retried(make_job):
    job, spec = make_job("crash", sft=WARM_UP)
    # The child cannot read its dataset: a traceback, exit 1. (A spec.yaml it cannot read is a setup problem now,
    # exit 2: no retry reads it otherwise.)
    shutil.rmtree(job.dataset)

    @flow
    def warm_up():
        # The task's own retry count and condition (the wait between attempts is GRPOFLOW_RETRY_DELAY_S: 0 here).
        with pytest.raises(RuntimeError, match="SFT warm-up child exited with code 1"):
            sft_task(job, spec)

    warm_up()
    assert (job.logs / "sft.log").read_text().count("Traceback (most recent call last)") == 2  # 1 try + 1 retry
    assert not job.sft.exists() and not job.events.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="use_liger can run where CUDA is")
def test_a_setup_problem_ends_the_warm_up_before_it_trains(make_job):
    job, spec = make_job("liger", sft={**WARM_UP, "max_steps": 1}, hyperparameters={"use_liger": True})

    @flow
    def warm_up():
        with pytest.raises(TrainingSetupError, match="use_liger=true needs a CUDA GPU"):
            sft_task(job, spec)

    warm_up()
    assert (job.logs / "sft.log").read_text().count("use_liger=true needs a CUDA GPU") == 1  # no retry
    assert not job.sft.exists()
