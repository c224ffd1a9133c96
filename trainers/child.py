"""A training child's side of its supervision, and the process plumbing both sides share: the phase lines it prints
(`say_phase`), the record of why it stopped on purpose (`record_exit`), and starting, stopping and placing a child
process (`start_child`, `stop_child`, `free_port`, `visible_gpus`). The job service that runs the children is
`grpoflow.jobs.launch`; the vLLM server a GRPO child starts uses the same plumbing.
"""

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from grpoflow.core.errors import EXIT_RECORD
from grpoflow.core.jobdir import JobDir
from grpoflow.core.trust import origin_env


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (else nvidia-smi's indices); found without
    torch. Empty on a machine without NVIDIA GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip() and gpu.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


PHASE_MARK = "grpoflow: phase: "  # how a child's phase line starts in its log; the stage's watcher shows it


def say_phase(text: str, after_step: int | None = None) -> None:
    """Prints what a training child starts doing outside its steps (its main process only), e.g. "loading the model
    X (1.2 GB in 1 file)": the stage's watcher (`grpoflow.integrations.heartbeat.ChildPhases`) shows it, after the
    line of step `after_step` when given (the final save follows the last step)."""
    if os.environ.get("RANK", "0") == "0":
        print(PHASE_MARK + (f"(after step {after_step}) " if after_step else "") + text, flush=True)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_exit(job: JobDir, code: int, message: str) -> int:
    """Called by a child that stops on purpose: writes why (every rank writes the same), returns `code`."""
    path = job.root / EXIT_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"code": code, "message": message}))
    os.replace(tmp, path)
    return code


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if the task's process dies (killed worker, cancelled flow run), so no training
    # process outlives its task and holds the GPU.
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# A child's output is a log file: the libraries' progress bars ("Loading weights", "Writing model shards", dataset
# maps) would fill it with carriage-return updates. transformers reads huggingface_hub's switch at import.
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def start_child(command: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """Starts the child in its own process group, output to `log_path`, so it can be stopped as a whole; `env` adds
    to (or overrides) this process's environment."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **QUIET_ENV,
        **origin_env(),
        **(env or {}),
    }
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop_child(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the child's process group, SIGKILL after `grace` seconds; a no-op once it exited."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# The URL of the vLLM server the training task started (grpoflow.jobs.vllm_server), for the GRPO child.
VLLM_SERVER_URL_ENV = "GRPOFLOW_VLLM_SERVER_URL"

# Set by the canary (grpoflow.jobs.canary) for its GRPO child: one step, measured, nothing saved or evaluated.
CANARY_ENV = "GRPOFLOW_CANARY"


def peak_memory_gb() -> float:
    """This process's peak memory in GB: the CUDA allocator's largest peak over its devices where it used CUDA,
    else its peak resident set (`ru_maxrss`, KiB on Linux)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return round(max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())) / 1e9, 3)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 3)
