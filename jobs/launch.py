"""Training children: the SFT and GRPO stages each run as their own process, started, watched and stopped here.

`run_child("grpoflow.trainers.grpo", job, gpu_count, "train.log", poll)` starts `python -m grpoflow.trainers.grpo
JOB_DIR` (under `accelerate launch` when gpu_count > 1, with TRL's accelerate config for the spec's
`distributed.strategy`) in its own process group with its output in `logs/`, calls `poll()` every
half second while it runs (a reason it returns stops the child), and turns its exit code into the outcome: exit 2 is
a setup problem no retry can fix (`TrainingSetupError`; a full disk or read-only job folder too), exit 3 a reward
that failed during training (`RewardFailed`: the user's reward raised, hung or returned a bad value; a retry would
meet it again), exit 4 a run that diverged (NaN or inf loss, gradient or weights: `TrainingStopped`, as a health
monitor stop; a retry would resume into it), exit 0 without the child's result file a child ended early by something
inside it (`ChildEndedEarly`, e.g. a reward that ends the process with `os._exit`), any other failure a
`RuntimeError` that a retry may cure. No Prefect here: the tasks in `tasks/` wrap it.
"""

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpoflow.core.errors import (
    DIVERGED_EXIT,
    EXIT_RECORD,
    ON_PURPOSE_EXITS,
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    ChildEndedEarly,
    ChildFailed,
    RewardFailed,
    TrainingSetupError,
    TrainingStopped,
)
from grpoflow.core.jobdir import JobDir
from grpoflow.trainers.child import (
    free_port,
    start_child,
    stop_child,
    visible_gpus,
)

POLL_SECONDS = 0.5
STAGE_NAMES = {"grpoflow.trainers.sft": "SFT warm-up", "grpoflow.trainers.grpo": "training"}  # for messages
# The accelerate config TRL ships for each `distributed.strategy` (trl/accelerate_configs/); ddp needs none.
ACCELERATE_CONFIGS = {"fsdp2": "fsdp2.yaml", "zero2": "zero2.yaml", "zero3": "zero3.yaml"}
# A module to run in place of every child's (given the child's module as its first argument): the tests of what runs
# around the children set it to their stand-in (tests/standin_child.py). Unset, the children are grpoflow's own.
STANDIN_ENV = "GRPOFLOW_CHILD_STANDIN"


def accelerate_config(strategy: str) -> Path:
    """TRL's accelerate config file for `strategy`, found without importing TRL (and torch) in this process."""
    found = importlib.util.find_spec("trl")
    if found is None or found.origin is None:
        raise TrainingSetupError(f"distributed.strategy: {strategy} needs TRL's accelerate configs: pip install trl")
    return Path(found.origin).parent / "accelerate_configs" / ACCELERATE_CONFIGS[strategy]


def check_gpu_count(gpu_count: int, gpus: list[str]) -> None:
    """A machine with GPUs must have the gpu_count the job trains on: a launch on fewer would fail on every rank
    (and every retry) with an invalid device. A machine without any is a CPU run (several gloo processes)."""
    if gpus and len(gpus) < gpu_count:
        raise TrainingSetupError(
            f"grpoflow: gpu_count: the job trains on {gpu_count} GPUs but this machine shows {len(gpus)} "
            f"({', '.join(gpus)}); on Kubernetes, give the run the job variable gpu_count={gpu_count} (its pod "
            "requests that many), or lower gpu_count"
        )


@dataclass(frozen=True)
class Machines:
    """Where this machine stands in a run over several (`distributed.num_machines`): how many, its rank (0 is the
    main one), and the rank-0 machine's host and port, where the others meet it (accelerate's static rendezvous)."""

    num_machines: int
    machine_rank: int
    main_process_ip: str
    main_process_port: int = 29500

    def args(self) -> list[str]:
        return [
            "--num_machines",
            str(self.num_machines),
            "--machine_rank",
            str(self.machine_rank),
            "--main_process_ip",
            self.main_process_ip,
            "--main_process_port",
            str(self.main_process_port),
        ]


def accelerate_command() -> str:
    """`accelerate`, the console script of this interpreter's install (its scripts folder), as users run it."""
    return str(Path(sysconfig.get_path("scripts")) / "accelerate")


def child_command(
    module: str, job: JobDir, gpu_count: int = 1, strategy: str = "ddp", machines: Machines | None = None
) -> list[str]:
    """The command line of a training child; `accelerate launch` spreads it over several GPUs, with plain data
    parallelism (ddp) or TRL's config for a sharded strategy (fsdp2, zero2, zero3), and with `machines` over several
    machines: `gpu_count` processes on each, `num_machines * gpu_count` in all."""
    target = [os.environ[STANDIN_ENV], module] if os.environ.get(STANDIN_ENV) else [module]
    if gpu_count == 1 and strategy == "ddp" and machines is None:
        return [sys.executable, "-m", *target, str(job.root)]
    launch = [accelerate_command(), "launch"]
    if strategy == "ddp":
        # --multi_gpu: one process per GPU even where fewer are visible (an error then, not a silent single
        # process), and the only launcher that starts several processes on a CPU machine.
        launch.append("--multi_gpu")
    else:
        if strategy.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
            # accelerate's launcher would fail on it before the child could say so (and its exit 1 reads as a crash).
            raise TrainingSetupError(
                f"grpoflow: distributed.strategy: {strategy} needs the deepspeed package: pip install "
                "'grpoflow[deepspeed]'"
            )
        # The config's own mixed_precision (bf16) would otherwise win over the trainer's `bf16`, which follows the
        # machine (grpoflow.trainers.model.load.use_bf16), as it does with ddp.
        launch += ["--config_file", str(accelerate_config(strategy)), "--mixed_precision", "no"]
    if machines is not None:
        launch += machines.args()
        gpu_count *= machines.num_machines  # accelerate's --num_processes counts every machine's
    else:
        # The processes of one machine meet on a port of their own: with accelerate's fixed default (29500) two
        # jobs on one machine (two 2-GPU jobs on a 4-GPU node) would meet each other's, and the second fail.
        launch += ["--main_process_port", str(free_port())]
    return [*launch, "--num_processes", str(gpu_count), "-m", *target, str(job.root)]


def _recorded_exit(job: JobDir) -> dict | None:
    try:
        record = json.loads((job.root / EXIT_RECORD).read_text())
    except (OSError, ValueError):
        return None
    stopped_on_purpose = isinstance(record, dict) and record.get("code") in ON_PURPOSE_EXITS
    return record if stopped_on_purpose else None


def recorded_divergence(job: JobDir) -> str | None:
    """The message of a child that stopped itself on NaN or inf (its exit record says `DIVERGED_EXIT`), else None."""
    record = _recorded_exit(job)
    return record["message"] if record and record["code"] == DIVERGED_EXIT else None


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


# Log lines that say nothing about why a child ended: TRL's metric dicts, progress bars, warnings and the line below.
_NOISE = re.compile(r"^\s*(\{['\"]|warnings\.warn|.*\d+%\|)|Warning: |^\s*$")
LAST_LINES_CHARS = 600  # of the log, in a failed attempt's message


def last_lines(path: Path, lines: int = 4) -> str:
    """The last `lines` telling lines of a child's log on one line (' | ' between them, at most `LAST_LINES_CHARS`):
    what a failed attempt's message quotes, read in a log viewer where a newline would print as `\\n`."""
    if not path.exists():
        return "(no log)"
    telling = [" ".join(line.split()) for line in path.read_text(errors="replace").splitlines()[-200:]]
    text = " | ".join([line for line in telling if not _NOISE.search(line)][-lines:]) or "(nothing but metrics)"
    return text if len(text) <= LAST_LINES_CHARS else "..." + text[-LAST_LINES_CHARS:]


def oom_kills() -> tuple[Path, int] | None:
    """Where the kernel counts the processes its OOM killer ended, and the count now: this process's cgroup (v2
    `memory.events`, v1 `memory.oom_control`; a child stays in its parent's), else the machine's `/proc/vmstat`; None
    where none can be read."""
    try:
        own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
    except (OSError, ValueError):
        own = {}
    cgroups = Path("/sys/fs/cgroup")
    for path in (
        cgroups / own.get("", "/").lstrip("/") / "memory.events",
        cgroups / "memory" / own.get("memory", "/").lstrip("/") / "memory.oom_control",
        Path("/proc/vmstat"),
    ):
        with contextlib.suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return path, int(line.split()[1])
    return None


def exit_reason(code: int, oom_before: tuple[Path, int] | None = None) -> str:
    """The exit code in words: a negative one is the signal that ended the child. For SIGKILL, whether the kernel's
    OOM killer sent it, as its count (`oom_kills()`, `oom_before` read when the child started) says."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "a signal"
    reason = f"exited with code {code}, killed by {name} (signal {-code})"
    return reason + (_oom_cause(oom_before) if -code == signal.SIGKILL else "")


def _oom_cause(before: tuple[Path, int] | None) -> str:
    after = oom_kills()
    if before is None or after is None or after[0] != before[0]:
        return ": by whom is not known"
    if after[1] > before[1]:
        return (
            f", most likely by the kernel's OOM killer: out of memory (oom_kill in {after[0]} rose from {before[1]} "
            f"to {after[1]} during the run)"
        )
    return f": not by the kernel's OOM killer (oom_kill in {after[0]} unchanged during the run); by whom is not known"


def check_exit(
    proc: subprocess.Popen,
    stage: str,
    log_path: Path,
    job: JobDir | None = None,
    oom_before: tuple[Path, int] | None = None,
) -> None:
    """Turns the child's exit code into the outcome, with the end of its log in the message. Under `accelerate
    launch` a rank's exit 2, 3 or 4 reaches here as 1: the child's exit record in `job` (`record_exit`) says which.
    `oom_before` is the OOM kill count (`oom_kills()`) when the child started: a SIGKILL is put down to memory only
    when it rose."""
    if proc.returncode == 0:
        return
    tail = _tail(log_path)
    record = _recorded_exit(job) if job is not None else None
    code = record["code"] if record else proc.returncode
    if code == SETUP_ERROR_EXIT:
        if record:
            raise TrainingSetupError(f"grpoflow: {record['message']}")
        raise TrainingSetupError(tail.splitlines()[-1] if tail else f"{stage} could not start")
    if code == REWARD_FAILED_EXIT:
        # The child's last "grpoflow: " line is the one-line reason; the traceback above it stays in the log.
        reasons = [line.removeprefix("grpoflow: ") for line in tail.splitlines() if line.startswith("grpoflow: ")]
        reason = record["message"] if record else reasons[-1] if reasons else f"a reward failed in {stage}"
        raise RewardFailed(f"{reason} (traceback in {log_path})")
    if code == DIVERGED_EXIT:
        reason = record["message"] if record else f"{stage} diverged (NaN or inf)"
        raise TrainingStopped(f"stopped by the health monitor: {reason} (log: {log_path})")
    ended = f"{stage} child {exit_reason(proc.returncode, oom_before)}. Last lines of its log: {last_lines(log_path)}"
    raise ChildFailed(
        f"{ended}. The stage is retried while its retries last (GRPO resumes from its newest checkpoint); the whole "
        f"log is {log_path}.",
        ended,
    )


def run_child(
    module: str,
    job: JobDir,
    gpu_count: int,
    log_name: str,
    poll: Callable[[], str | None] | None = None,
    result: Path | None = None,
    strategy: str = "ddp",
    env: dict | None = None,
    machines: Machines | None = None,
) -> float:
    """Runs `python -m module JOB_DIR` to its end and returns its wall time in seconds.

    Args:
        module (`str`): the trainer module, `"grpoflow.trainers.sft"` or `"grpoflow.trainers.grpo"`.
        job (`JobDir`): the job folder, the child's only argument.
        gpu_count (`int`): processes to launch (one per GPU).
        log_name (`str`): the child's output file under `logs/`.
        poll (`Callable`, *optional*): called every `POLL_SECONDS` while the child runs and once after it exits; a
            string it returns stops the child and raises `TrainingStopped` with that reason.
        result (`Path`, *optional*): the file the child writes last; missing after exit 0 raises `ChildEndedEarly`.
        strategy (`str`, *optional*): the spec's `distributed.strategy` (ddp, fsdp2, zero2, zero3).
        env (`dict`, *optional*): variables added to the child's environment.
        machines (`Machines`, *optional*): this machine's part in a run over several (`grpoflow.cluster.node`).

    Raises:
        `TrainingSetupError`: the child exited 2 (a setup problem). `RewardFailed`: it exited 3 (a reward failed).
        `TrainingStopped`: it exited 4 (training diverged). `ChildEndedEarly`: it exited 0 without `result`.
        `RuntimeError`: any other failure.
    """
    log_path = job.logs / log_name
    started = time.monotonic()
    (job.root / EXIT_RECORD).unlink(missing_ok=True)  # an earlier attempt's
    given = (env or {}).get("CUDA_VISIBLE_DEVICES")
    check_gpu_count(gpu_count, [g for g in given.split(",") if g] if given is not None else visible_gpus())
    oom_before = oom_kills()
    proc = start_child(child_command(module, job, gpu_count, strategy, machines), log_path, env)
    try:
        while proc.poll() is None:
            if poll and (reason := poll()):
                raise TrainingStopped(reason)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(POLL_SECONDS)  # returns as soon as the child exits
        if poll and (reason := poll()):
            raise TrainingStopped(reason)
    finally:
        stop_child(proc)
    check_exit(proc, STAGE_NAMES.get(module, module), log_path, job, oom_before)
    if result is not None and not result.exists():
        raise ChildEndedEarly(
            f"the {STAGE_NAMES.get(module, module)} child exited 0 without writing {result.name}: something in it "
            f"ended the process early (a reward or callback calling os._exit or exit?). Last lines of {log_path}: "
            f"{last_lines(log_path)}"
        )
    return round(time.monotonic() - started, 3)
