"""`gpu_count > 1`: the training child runs under `accelerate launch --multi_gpu --num_processes gpu_count`. On a CPU
machine accelerate starts that many gloo processes, so the real launch path runs here with 2 processes."""

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from grpoflow.core.errors import ChildFailed, TrainingSetupError, TrainingStopped
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.jobs.launch import accelerate_command, check_exit, child_command
from grpoflow.trainers.child import start_child, stop_child
from grpoflow.trainers.dataset import ingest_dataset
from grpoflow.trainers.metrics import read_metrics


def test_child_command():
    job = JobDir(Path("/runs/j"))
    assert child_command("grpoflow.trainers.grpo", job, 1) == [
        sys.executable,
        "-m",
        "grpoflow.trainers.grpo",
        "/runs/j",
    ]
    command = child_command("grpoflow.trainers.grpo", job, 4)
    launch = [accelerate_command(), "launch", "--multi_gpu", "--main_process_port", command[4], "--num_processes", "4"]
    assert Path(launch[0]).is_file() and os.access(launch[0], os.X_OK)  # this interpreter's `accelerate` script
    assert command == [*launch, "-m", "grpoflow.trainers.grpo", "/runs/j"]
    # Each launch's processes meet on a free port of their own, not accelerate's fixed 29500.
    ports = {child_command("grpoflow.trainers.grpo", job, 2)[4] for _ in range(3)} | {command[4]}
    assert "29500" not in ports and len(ports) > 1


def training_processes(proc) -> int:
    """The launcher's descendants that run the trainer (the launcher's own command line names it too)."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    count = 0
    for child in children:
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        count += "grpoflow.trainers.grpo" in cmdline and "accelerate" not in cmdline
    return count


@pytest.mark.slow
def test_grpo_on_two_processes(make_spec, tmp_path):
    spec, _ = load_spec(make_spec("two", gpu_count=2, hyperparameters={"max_steps": 2, "rollouts_per_prompt": 2}))
    job = JobDir(tmp_path / "runs" / "two")
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset)

    proc = start_child(child_command("grpoflow.trainers.grpo", job, spec.gpu_count), job.logs / "train.log")
    most = 0
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            most = max(most, training_processes(proc))
            time.sleep(0.2)
    finally:
        stop_child(proc)
    check_exit(proc, "training", job.logs / "train.log")

    assert most == 2  # two ranks trained, one group of 2 rollouts split between them
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2]  # logged once, by the main process
    assert (job.merged / "model.safetensors").exists()
    assert yaml.safe_load(job.spec.read_text())["gpu_count"] == 2


# --- run_child: a child's exit code becomes the stage's outcome ------------------------------------------------------

FAKE_CHILD = """
import sys, time
from pathlib import Path
job = Path(sys.argv[1])
print("fake child started", flush=True)
behaviour = (job / "behaviour").read_text()
if behaviour == "setup":
    print("grpoflow: hyperparameters.use_liger: needs a CUDA GPU", file=sys.stderr)
    sys.exit(2)
if behaviour == "crash":
    raise RuntimeError("out of memory")
if behaviour == "nan":  # as grpoflow.trainers.grpo's cli on TrainingDiverged: the exit record, then exit 4
    message = "hyperparameters.learning_rate: training diverged at step 1: the weights became NaN or inf"
    (job / "logs" / "child_exit.json").write_text('{"code": 4, "message": "%s"}' % message)
    sys.exit(4)
if behaviour == "slow":
    time.sleep(60)
if behaviour == "sigkill":  # as a reward, grader or person killing it: not the kernel's OOM killer
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def fake_child(tmp_path, monkeypatch):
    """`python -m fake_child JOB_DIR`: a stand-in trainer whose behaviour the job folder's `behaviour` file says."""
    from grpoflow.jobs import launch

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fake_child.py").write_text(FAKE_CHILD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mods"))
    monkeypatch.setattr(launch, "POLL_SECONDS", 0.05)
    job = JobDir(tmp_path / "job")
    job.root.mkdir()

    def run(behaviour, poll=None):
        (job.root / "behaviour").write_text(behaviour)
        return launch.run_child("fake_child", job, 1, "fake.log", poll=poll)

    return job, run


def test_run_child_ok(fake_child):
    job, run = fake_child
    assert run("ok") >= 0
    assert (job.logs / "fake.log").read_text() == "fake child started\n"


@pytest.mark.parametrize(
    ("behaviour", "error", "message"),
    [
        # exit 2: a setup problem, its last log line as the message (not retried: see grpoflow.integrations.stages)
        ("setup", TrainingSetupError, "grpoflow: hyperparameters.use_liger: needs a CUDA GPU"),
        # any other failure: a ChildFailed (a RuntimeError) with the exit code and the end of the log (retried)
        ("crash", ChildFailed, "fake_child child exited with code 1"),
        # exit 4: the run diverged (NaN or inf), stopped as the health monitor stops one (not retried)
        ("nan", TrainingStopped, "stopped by the health monitor: hyperparameters.learning_rate: training diverged"),
    ],
)
def test_run_child_failures(fake_child, behaviour, error, message):
    job, run = fake_child
    with pytest.raises(RuntimeError) as caught:
        run(behaviour)
    assert type(caught.value) is error
    assert message in str(caught.value)
    if behaviour == "crash":
        assert "RuntimeError: out of memory" in str(caught.value)  # the log's tail comes with it
        # One paragraph however the log reads: Prefect logs the message's repr, where a newline shows as `\n`.
        assert "\n" not in str(caught.value) and "resumes from its newest checkpoint" in str(caught.value)


def test_a_failed_attempts_message_leaves_out_metrics_bars_and_warnings(tmp_path):
    log = tmp_path / "train.log"
    noise = [
        "{'loss': 0.1, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'rewards/exact_answer/mean': 0.25}",
        "/site-packages/trl/trainer/grpo_trainer.py:12: UserWarning: something was deprecated",
        "  warnings.warn(",
        " 40%|####      | 4/10 [00:01<00:02,  2.3it/s]",
    ]
    log.write_text("\n".join([*noise * 50, "Traceback (most recent call last):", '  File "x.py", line 3',
                              "RuntimeError: CUDA out of memory", *noise]) + "\n")  # fmt: skip
    from grpoflow.jobs import launch

    text = launch.last_lines(log)
    assert text == 'Traceback (most recent call last): | File "x.py", line 3 | RuntimeError: CUDA out of memory'
    log.write_text("x" * 5000 + "\n")
    assert len(launch.last_lines(log)) <= launch.LAST_LINES_CHARS + 3
    assert launch.exit_reason(-9).startswith("exited with code -9, killed by SIGKILL")


def test_a_sigkill_is_put_down_to_memory_only_when_the_kernel_counted_an_oom_kill(fake_child):
    from grpoflow.jobs import launch

    with pytest.raises(ChildFailed) as caught:
        fake_child[1]("sigkill")
    message = str(caught.value)
    assert message.startswith("fake_child child exited with code -9, killed by SIGKILL (signal 9): ")
    assert "out of memory" not in message  # was: "(the kernel's OOM killer sends it: out of memory?)" for any SIGKILL
    counter = launch.oom_kills()  # this machine's cgroup memory.events / memory.oom_control, or /proc/vmstat
    if counter is None:
        assert ": by whom is not known. Last lines" in message
        return
    path, count = counter
    assert f": not by the kernel's OOM killer (oom_kill in {path} unchanged during the run); by whom is not known" in (
        message
    )
    # The count rose while the child ran: the OOM killer most likely sent it.
    assert launch.exit_reason(-9, (path, count - 1)) == (
        "exited with code -9, killed by SIGKILL (signal 9), most likely by the kernel's OOM killer: out of memory "
        f"(oom_kill in {path} rose from {count - 1} to {count} during the run)"
    )


def test_run_child_stopped_by_poll(fake_child):
    job, run = fake_child
    polls = []

    def poll():
        polls.append(1)
        return "stopped by the health monitor: collapse" if len(polls) >= 3 else None

    with pytest.raises(TrainingStopped, match="collapse"):
        run("slow", poll=poll)
    assert len(polls) == 3  # stopped at the poll that asked, not after the child's 60 s
