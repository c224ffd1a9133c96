"""The sandbox that code carried inside a spec runs in (a `python` grader's source): bubblewrap (`bwrap`).

Each call starts one sandbox and nothing of it outlives the call:

- new PID, network (no interface but a loopback of its own), IPC and UTS namespaces, and a new user namespace where
  the worker runs unprivileged; where it runs as root, the sandboxed process is an unprivileged user of its own
  instead (a uid no system assigns), with no capabilities, since the kernel does not hold root, even a namespace's
  root, to a process limit;
- a root folder of its own: the interpreter and its site-packages bound read-only, `/usr` (the system's libraries)
  read-only, a private `/proc` (its own processes only), a minimal `/dev`, and a private tmpfs of bounded size as
  working folder, `/tmp` and home. No home folder, no job folder, no Hugging Face or Prefect folders, no environment
  variable of the worker's;
- `--die-with-parent`: when the call ends, or the worker dies, the sandbox's PID 1 goes and with it every process
  inside (a double-forked survivor included);
- limits set by the sandboxed process on itself before any spec code runs, from the operator's settings (a spec may
  only lower them): processes, file size, CPU seconds and memory (address space).

The operator's settings (the work pool's environment):

| setting | default | what |
| --- | --- | --- |
| `GRPOFLOW_SANDBOX_MEMORY_MB` | 2048 | address space of each process (MiB); a grader's `memory_mb` may lower it |
| `GRPOFLOW_SANDBOX_MAX_PROCESSES` | 16 | processes and threads the sandbox may hold at once |
| `GRPOFLOW_SANDBOX_DISK_MB` | 256 | size of the private tmpfs, and the largest file it may write (MiB) |
| `GRPOFLOW_SANDBOX_CPU_SECONDS` | 600 | CPU seconds of each sandboxed process |

`sandbox_problem()` says why a sandbox cannot start here (bwrap missing, user namespaces refused), tried once per
process; where it cannot, who may still run spec code is the trust rules' business (`grpoflow.trainers.trust`).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Where the worker runs as root, each sandbox's process runs as a user of its own, drawn from a range no system
# assigns: the kernel counts the process limit per user, so sandboxes running at once (a multi grader's python
# sub-graders, several ranks) do not share one budget, as they would all as `nobody`.
SANDBOX_UIDS = (1 << 30, 1 << 20)  # first uid, how many
LIMIT_SETTINGS = {  # field -> (variable, default)
    "memory_mb": ("GRPOFLOW_SANDBOX_MEMORY_MB", 2048),
    "max_processes": ("GRPOFLOW_SANDBOX_MAX_PROCESSES", 16),
    "disk_mb": ("GRPOFLOW_SANDBOX_DISK_MB", 256),
    "cpu_seconds": ("GRPOFLOW_SANDBOX_CPU_SECONDS", 600),
}
# What a merged-/usr system links from the root (Debian 12, Ubuntu, Fedora): linked likewise, else bound read-only.
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64")


@dataclass(frozen=True)
class Limits:
    """What one sandboxed process may take: MiB of memory, processes, MiB of disk, CPU seconds."""

    memory_mb: int
    max_processes: int
    disk_mb: int
    cpu_seconds: int


class SandboxSettingError(ValueError):
    """A `GRPOFLOW_SANDBOX_*` setting is not a positive integer."""


def operator_limits() -> Limits:
    """The limits the operator set (`GRPOFLOW_SANDBOX_*`), or their defaults.

    Raises:
        SandboxSettingError: a setting that is not a positive integer, named.
    """
    values = {}
    for field, (variable, default) in LIMIT_SETTINGS.items():
        text = os.environ.get(variable, "").strip() or str(default)
        if not text.isdigit() or int(text) < 1:
            raise SandboxSettingError(f"{variable}={text!r}: must be a positive integer (default {default})")
        values[field] = int(text)
    return Limits(**values)


def _binds() -> list[str]:
    """bwrap's arguments that lay out the root folder: /usr and the interpreter's folders read-only, the rest new."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ROOT_LINKS:
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    for folder in sorted({sys.base_prefix, sys.prefix, sys.exec_prefix}):
        if not Path(folder).resolve().is_relative_to("/usr"):
            args += ["--ro-bind", folder, folder]
    return args


def command(argv: list[str], limits: Limits) -> list[str]:
    """The bwrap command that runs `argv` in a new sandbox."""
    as_root = os.geteuid() == 0
    uid = SANDBOX_UIDS[0] + secrets.randbelow(SANDBOX_UIDS[1])
    isolation = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if not as_root:
        isolation.append("--unshare-user")
    tmp = ["--perms", "1777", "--size", str(limits.disk_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    env = [
        "--clearenv",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
    ]
    drop = (
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
        + ["--bounding-set=-all", "--inh-caps=-all"]
        if as_root
        else []
    )
    # The tmpfs first: an interpreter or venv that lives under /tmp is bound on top of it, not hidden by it.
    layout = [*tmp, *_binds(), "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp"]
    return [_bwrap(), *isolation, "--die-with-parent", "--new-session", *layout, *env, *drop, *argv]


def _bwrap() -> str:
    return shutil.which("bwrap") or "bwrap"


def run(argv: list[str], stdin: str, timeout: float, limits: Limits) -> subprocess.CompletedProcess:
    """Runs `argv` in a new sandbox with `stdin`, to its end or `timeout` seconds (then the whole sandbox is killed).

    Raises:
        subprocess.TimeoutExpired: the call took longer than `timeout`.
    """
    # bwrap's own environment is bare too: its PID 1 inside the sandbox keeps the environment it was started with.
    bare = {"PATH": os.defpath, "LANG": "C.UTF-8"}
    return subprocess.run(
        command(argv, limits), input=stdin, capture_output=True, text=True, env=bare, timeout=timeout, cwd="/"
    )


@functools.cache
def sandbox_problem() -> str | None:
    """Why no sandbox can start on this machine (bwrap missing or refused), or None when one can; tried once."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        done = run([sys.executable, "-I", "-c", "pass"], "", 30.0, operator_limits())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not start: {exc}"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return f"bwrap cannot start a sandbox here: {said[0]}"
    return None
