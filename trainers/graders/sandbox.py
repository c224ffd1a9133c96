"""The sandbox that code carried inside a spec runs in (a `python` grader's source): bubblewrap (`bwrap`).

Each call starts one sandbox and nothing of it outlives the call:

- new PID, network (no interface but a loopback of its own), IPC and UTS namespaces, and a new user namespace in
  which the sandboxed process is an unprivileged user with no capabilities. Where the worker runs as root, root's
  bwrap lays the sandbox out (it reads folders that user may not, a pyenv under /root say), the process drops to a
  user of its own (a uid no system assigns, since the kernel does not hold root, even a namespace's root, to a
  process limit), and a second bwrap, as that user, makes the user namespace;
- no user namespace of its own inside: bwrap's `--disable-userns` (bwrap >= 0.8; where it cannot hold, the seccomp
  filter alone keeps them out);
- a seccomp filter (`seccomp_filter`, classic BPF assembled here, for x86_64 and aarch64): ptrace, the mount calls,
  unshare, setns, clone with a namespace flag, the key calls, bpf, perf_event_open, userfaultfd and
  process_vm_readv/writev fail with EPERM; clone3 with ENOSYS (its flags are out of a filter's reach; the C library
  then falls back to clone); a syscall of another ABI (x32, i386) kills the process;
- a root folder of its own: the interpreter and its site-packages bound read-only, `/usr` (the system's libraries)
  read-only, a private `/proc` (its own processes only), a minimal `/dev`, and a private tmpfs of bounded size as
  working folder, `/tmp` and home. No home folder, no job folder, no Hugging Face or Prefect folders, no environment
  variable of the worker's;
- `--die-with-parent`: when the call ends, or the worker dies, the sandbox's PID 1 goes and with it every process
  inside (a double-forked survivor included);
- limits set by the sandboxed process on itself before any spec code runs, from the operator's settings (a spec may
  only lower them): processes, file size, CPU seconds and memory (address space, of each process);
- one memory cap for the sandbox as a whole where a cgroup memory controller is writable (`memory_cap`): a cgroup of
  its own per call (under the worker's own cgroup v2, v2's root, or the worker's own cgroup v1 memory hierarchy)
  holding `memory_mb`, removed after the call; a sandbox that goes over it is stopped whole. Elsewhere only the cap
  of each process holds, so a sandbox of many processes may take `memory_mb` x `max_processes`;
- its output read as it comes (`run_bounded`): the last 64 KiB of its stderr kept, and of its stdout (the answer) no
  more than the caller's bound, past which it is stopped; at the call's timeout the whole sandbox is killed.

The operator's settings (the work pool's environment):

| setting | default | what |
| --- | --- | --- |
| `GRPOFLOW_SANDBOX_MEMORY_MB` | 2048 | MiB of each process, and of the sandbox in all where a cgroup holds it |
| `GRPOFLOW_SANDBOX_MAX_PROCESSES` | 16 | processes and threads the sandbox may hold at once |
| `GRPOFLOW_SANDBOX_DISK_MB` | 256 | size of the private tmpfs, and the largest file it may write (MiB) |
| `GRPOFLOW_SANDBOX_CPU_SECONDS` | 600 | CPU seconds of each sandboxed process |

A grader's `memory_mb` may lower the memory cap, never raise it.

`sandbox_problem()` says why a sandbox cannot start here (bwrap missing, user namespaces refused), tried once per
process; where it cannot, who may still run spec code is the trust rules' business (`grpoflow.core.trust`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import platform
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from grpoflow.core.graders import Limits, operator_limits

# Where the worker runs as root, each sandbox's process runs as a user of its own, drawn from a range no system
# assigns: the kernel counts the process limit per user, so sandboxes running at once (a multi grader's python
# sub-graders, several ranks) do not share one budget, as they would all as `nobody`.
SANDBOX_UIDS = (1 << 30, 1 << 20)  # first uid, how many
# What a merged-/usr system links from the root (Debian 12, Ubuntu, Fedora): linked likewise, else bound read-only.
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64")
MIB = 1024 * 1024
STDERR_TAIL = 64 * 1024  # bytes of a sandbox's stderr kept: its last ones, where the error is
DEFAULT_MAX_STDOUT = 4 * MIB
# bwrap's own environment is bare too: its PID 1 inside the sandbox keeps the environment it was started with.
_BARE_ENV = {"PATH": os.defpath, "LANG": "C.UTF-8"}
POLL_S = 0.1  # how often a running sandbox's cgroup is asked whether it went over its memory cap
logger = logging.getLogger(__name__)


class SandboxStopped(RuntimeError):
    """The sandbox was stopped before its end: it went over its memory cap, or its answer over its bound."""


# --- seccomp: a classic BPF program, as the kernel reads it (struct sock_filter, seccomp_data) -----------------------

AUDIT_ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # platform.machine() -> AUDIT_ARCH_*
DENIED_SYSCALLS = {  # name -> number on x86_64, on aarch64 (asm-generic); each fails with EPERM
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
}
CLONE, CLONE3 = (56, 220), (435, 435)
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (CLONE_NEWTIME is clone3's and unshare's only)
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same arch in seccomp_data, the number with this bit set
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The seccomp program (classic BPF, as bwrap's `--seccomp FD` reads it) that denies the sandbox the syscalls of
    `DENIED_SYSCALLS` (EPERM), clone with a namespace flag (EPERM) and clone3 (ENOSYS), and allows the rest.

    Args:
        machine (`str` or `None`, *optional*, defaults to `None`): `platform.machine()` of the host (`None`: this one).

    Returns:
        `bytes` or `None`: the program, or None on a machine whose syscall numbers are not known here (the sandbox
        then runs without a filter).
    """
    machine = machine or platform.machine()
    if machine not in AUDIT_ARCHES:
        return None
    column = list(AUDIT_ARCHES).index(machine)
    deny = _op(RET, RET_ERRNO | errno.EPERM)
    # seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low half first on a little-endian machine)
    program = [_op(LD_ABS, 4), _op(JEQ, AUDIT_ARCHES[machine], jt=1), _op(RET, RET_KILL_PROCESS), _op(LD_ABS, 0)]
    if machine == "x86_64":  # an x32 syscall would be a way around every number below
        program += [_op(JGE, X32_SYSCALL_BIT, jf=1), deny]
    for numbers in DENIED_SYSCALLS.values():
        program += [_op(JEQ, numbers[column], jf=1), deny]
    program += [_op(JEQ, CLONE3[column], jf=1), _op(RET, RET_ERRNO | errno.ENOSYS)]
    flags_at = 16 if sys.byteorder == "little" else 20
    program += [_op(JEQ, CLONE[column], jf=3), _op(LD_ABS, flags_at), _op(JSET, CLONE_NAMESPACES, jf=1), deny]
    return b"".join([*program, _op(RET, RET_ALLOW)])


# --- one memory cap for the sandbox as a whole: a cgroup of its own per call ----------------------------------------


@dataclass(frozen=True)
class _Controller:
    """A cgroup folder under which each call's cgroup is made: cgroup v2's, or v1's memory hierarchy's."""

    version: int
    parent: Path

    @property
    def limit_file(self) -> str:
        return "memory.max" if self.version == 2 else "memory.limit_in_bytes"

    @property
    def events_file(self) -> str:
        return "memory.events" if self.version == 2 else "memory.oom_control"


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """The cgroup file systems mounted here: (root inside the hierarchy, mount point, type, super options)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields, _, tail = line.partition(" - ")
            kind, _, options = (tail.split() + ["", "", ""])[:3]
            if kind in ("cgroup", "cgroup2"):
                parts = fields.split()
                found.append((parts[3], Path(parts[4]), kind, set(options.split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup in each hierarchy: "" for v2, else the v1 controller's name ("memory")."""
    own = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    return own


def _candidates() -> list[_Controller]:
    """Where a call's cgroup may go, best first: under the worker's own v2 cgroup, under v2's root as mounted here,
    under the worker's own v1 memory cgroup (v1 has no rule against a cgroup holding processes and children)."""
    own, found = _own_cgroups(), []
    for root, point, kind, options in _mounts():
        key = "" if kind == "cgroup2" else "memory" if "memory" in options else None
        if key is None or key not in own or not Path(own[key]).is_relative_to(root):
            continue
        version = 2 if kind == "cgroup2" else 1
        found.append(_Controller(version, point / Path(own[key]).relative_to(root)))
        if version == 2:
            found.append(_Controller(2, point))
    return sorted(dict.fromkeys(found), key=lambda c: -c.version)


def _unusable(controller: _Controller) -> str | None:
    """Why a call's cgroup cannot be made under `controller` with a memory cap, or None when it can (tried)."""
    parent = controller.parent
    try:
        if controller.version == 2:
            if "memory" not in (parent / "cgroup.controllers").read_text().split():
                return f"cgroup v2 at {parent} has no memory controller"
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                # refused where the cgroup holds processes of its own (cgroup v2's no-internal-process rule)
                (parent / "cgroup.subtree_control").write_text("+memory")
        probe = parent / f"grpoflow-sandbox-probe-{os.getpid()}-{secrets.token_hex(4)}"
        probe.mkdir()
        try:
            (probe / controller.limit_file).write_text(str(64 * MIB))
        finally:
            probe.rmdir()
    except OSError as exc:
        return f"cgroup v{controller.version} at {parent}: {exc.strerror or exc}"
    return None


@functools.cache
def _memory_controller() -> tuple[_Controller | None, str]:
    """The cgroup folder each call's cgroup goes under, and in words why (or why none), tried once per process."""
    reasons = []
    for controller in _candidates():
        if (why := _unusable(controller)) is None:
            _sweep(controller)
            return controller, f"cgroup v{controller.version} memory controller at {controller.parent}"
        reasons.append(why)
    return None, "no writable cgroup memory controller here: " + ("; ".join(reasons) or "no cgroup file system")


def _sweep(controller: _Controller) -> None:
    """Removes the empty cgroups that calls of a worker since gone left behind (it was killed during a call): of a
    process id no longer here, made over a minute ago (not one a worker of another PID namespace has just made)."""
    for left in controller.parent.glob("grpoflow-sandbox-*"):
        owner = left.name.split("-")[-2]
        with contextlib.suppress(OSError):
            if owner.isdigit() and not Path(f"/proc/{owner}").exists() and time.time() - left.stat().st_mtime > 60:
                left.rmdir()  # refused where a process is still in it


def memory_cap(limits: Limits | None = None) -> dict:
    """How much memory a sandbox may take here, and why: one cap for the sandbox as a whole where a cgroup memory
    controller is writable, else the cap of each process (so a sandbox of many processes may take their product).

    Args:
        limits (`Limits` or `None`, *optional*, defaults to `None`): the limits of a call (`None`: the operator's).

    Returns:
        `dict`: `mode` (`"cgroup"` or `"per_process"`), `total_mb` (what a sandbox may take in all), `per_process_mb`
        (what one of its processes may take: its address space), `why` (the cgroup used, or why none is).

    Raises:
        SandboxSettingError: a `GRPOFLOW_SANDBOX_*` setting that is not a positive integer, named.
    """
    limits = limits or operator_limits()
    controller, why = _memory_controller()
    total = limits.memory_mb if controller else limits.memory_mb * limits.max_processes
    mode = "cgroup" if controller else "per_process"
    return {"mode": mode, "total_mb": total, "per_process_mb": limits.memory_mb, "why": why}


@dataclass(frozen=True)
class _Group:
    """One call's cgroup: its folder, and the memory cap it holds."""

    controller: _Controller
    path: Path
    memory_mb: int

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started by a shell that first moves itself into the cgroup: bwrap and all it starts are in it
        from their first instruction (a move after the start would miss what bwrap forked meanwhile)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def overran(self) -> str | None:
        """Why the sandbox was stopped, once the kernel killed one of its processes for the cgroup's cap."""
        try:
            counts = dict(line.split() for line in (self.path / self.controller.events_file).read_text().splitlines())
        except (OSError, ValueError):
            return None
        if int(counts.get("oom_kill", counts.get("oom", 0))) == 0:
            return None
        return (
            f"the sandbox went over its memory cap, {self.memory_mb} MiB for all its processes together (the "
            "operator's GRPOFLOW_SANDBOX_MEMORY_MB, or the grader's memory_mb), and was stopped"
        )


@contextlib.contextmanager
def _memory_group(limits: Limits) -> Iterator[_Group | None]:
    """A cgroup of its own for one call, capped at `limits.memory_mb` (None where no cgroup is writable here);
    whatever is left in it is killed and it is removed after the call.

    Raises:
        SandboxStopped: the cgroup could not be made (the cap `memory_cap` promised would not hold).
    """
    controller, _ = _memory_controller()
    if controller is None:
        yield None
        return
    path = controller.parent / f"grpoflow-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        path.mkdir()
        _cap(controller, path, limits.memory_mb * MIB)
    except OSError as exc:
        _remove(path)
        raise SandboxStopped(f"the sandbox's memory cgroup could not be made at {path}: {exc}") from exc
    try:
        yield _Group(controller, path, limits.memory_mb)
    finally:
        _remove(path)


def _cap(controller: _Controller, path: Path, size: int) -> None:
    """Writes the memory cap: no swap beyond it, and (v2) the OOM killer takes the whole group at once."""
    (path / controller.limit_file).write_text(str(size))
    extras = {"memory.swap.max": "0", "memory.oom.group": "1"} if controller.version == 2 else {}
    extras = extras or {"memory.memsw.limit_in_bytes": str(size)}
    for name, value in extras.items():
        with contextlib.suppress(OSError):  # absent without swap accounting, or on an older kernel
            (path / name).write_text(value)


def _remove(path: Path) -> None:
    """Kills what is left in the cgroup at `path` and removes it (its processes take a moment to be gone)."""
    for _ in range(400):  # 2 s at most
        try:
            pids = (path / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.005)
    logger.warning("the sandbox's cgroup %s could not be removed", path)


# --- the sandbox's command and its run -------------------------------------------------------------------------------


def _binds() -> list[str]:
    """bwrap's arguments that lay out the root folder: /usr and the interpreter's folders read-only, the rest new."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ROOT_LINKS:
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    folders = [f for f in sorted({sys.base_prefix, sys.prefix, sys.exec_prefix}) if not _under_usr(f)]
    # The folders above them made readable first: bwrap makes a bind's missing parents 0700 root's, which the
    # sandbox's user could not cross (a pyenv under /root would then run with no stdlib or venv of its own).
    above = sorted({str(p) for f in folders for p in Path(f).parents} - {"/", "/tmp"})
    for parent in above:
        args += ["--perms", "0755", "--dir", parent]
    for folder in folders:
        args += ["--ro-bind", folder, folder]
    return args


def _under_usr(folder: str) -> bool:
    return Path(folder).resolve().is_relative_to("/usr")


def _drop(uid: int) -> list[str]:
    """setpriv's command that runs what follows as `uid`, with no capability and no way to gain one."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"] + [
        "--bounding-set=-all",
        "--inh-caps=-all",
    ]


def command(argv: list[str], limits: Limits, seccomp_fd: int | None = None) -> list[str]:
    """The bwrap command that runs `argv` in a new sandbox, with the seccomp program read from `seccomp_fd`."""
    as_root = os.geteuid() == 0
    return _command(argv, limits, seccomp_fd, as_root, _userns_disabled(_bwrap(), as_root))


def _command(argv: list[str], limits: Limits, seccomp_fd: int | None, as_root: bool, no_userns: bool) -> list[str]:
    """`command`, where `no_userns` says whether bwrap's `--disable-userns` can hold here (`_userns_disabled`).

    Not root: one bwrap, in a user namespace of its own. Root: root's bwrap lays out the sandbox (it reads folders
    the sandbox's user may not, such as a pyenv under /root), the process drops to that user, and where
    `--disable-userns` holds, a second bwrap as that user makes the user namespace, the same root folder bound.
    """
    isolation = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    no_more = ["--disable-userns"] if no_userns else []
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    tmp = ["--perms", "1777", "--size", str(limits.disk_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    env = ["--clearenv", "--setenv", "HOME", "/tmp", "--setenv", "PATH", "/usr/bin:/bin"]
    env += ["--setenv", "LANG", "C.UTF-8"]
    # The tmpfs first: an interpreter or venv that lives under /tmp is bound on top of it, not hidden by it.
    layout = [*tmp, *_binds(), "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp"]
    common = ["--die-with-parent", "--new-session", *layout, *env]
    if not as_root:
        return [_bwrap(), *isolation, "--unshare-user", *no_more, *seccomp, *common, *argv]
    drop = _drop(SANDBOX_UIDS[0] + secrets.randbelow(SANDBOX_UIDS[1]))
    if not no_userns:  # the seccomp filter alone keeps user namespaces out
        return [_bwrap(), *isolation, *seccomp, *common, *drop, *argv]
    inner = [_bwrap(), "--unshare-user", *no_more, *seccomp, "--bind", "/", "/", "--die-with-parent", "--"]
    return [_bwrap(), *isolation, *common, *drop, *inner, *argv]


@functools.cache
def _userns_disabled(bwrap: str, as_root: bool) -> bool:
    """Whether bwrap's `--disable-userns` holds here (bwrap >= 0.8, and the sandbox's user may make the user
    namespace it needs), tried once: a sandbox that only runs `true`."""
    probe = _command(["true"], Limits(256, 16, 16, 10), None, as_root, no_userns=True)
    try:
        return subprocess.run(probe, capture_output=True, timeout=30, env=_BARE_ENV, cwd="/").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _bwrap() -> str:
    return shutil.which("bwrap") or "bwrap"


def run(
    argv: list[str], stdin: str, timeout: float, limits: Limits, max_stdout: int = DEFAULT_MAX_STDOUT
) -> subprocess.CompletedProcess:
    """Runs `argv` in a new sandbox with `stdin`, to its end or `timeout` seconds (then the whole sandbox is killed).

    Args:
        argv (`list[str]`): the command to run inside.
        stdin (`str`): what it reads on its stdin.
        timeout (`float`): seconds the call may take.
        limits (`Limits`): what the sandbox may take.
        max_stdout (`int`, *optional*, defaults to `DEFAULT_MAX_STDOUT`): bytes of stdout accepted; past them the
            sandbox is stopped.

    Returns:
        `subprocess.CompletedProcess`: its exit code, stdout, and the last 64 KiB of its stderr, as text.

    Raises:
        subprocess.TimeoutExpired: the call took longer than `timeout`.
        SandboxStopped: it went over its memory cap (where a cgroup holds one) or wrote more than `max_stdout`.
    """
    program = seccomp_filter()
    with _memory_group(limits) as group, _readable(program) as seccomp_fd:
        argv = command(argv, limits, seccomp_fd)
        overran = group.overran if group else None
        argv = group.wrap(argv) if group else argv
        fds = () if seccomp_fd is None else (seccomp_fd,)
        done = run_bounded(argv, stdin, timeout, max_stdout, pass_fds=fds, overran=overran)
        if group and (why := group.overran()):  # killed just before its end: the call fails all the same
            raise SandboxStopped(why)
    return done


@contextlib.contextmanager
def _readable(data: bytes | None) -> Iterator[int | None]:
    """A pipe's read end holding `data` (a seccomp program: far less than a pipe holds), closed after the call."""
    if data is None:
        yield None
        return
    read, write = os.pipe()
    try:
        os.write(write, data)
        os.close(write)
        yield read
    finally:
        os.close(read)


def run_bounded(
    argv: list[str],
    stdin: str,
    timeout: float,
    max_stdout: int,
    env: dict[str, str] | None = None,
    cwd: str = "/",
    pass_fds: tuple[int, ...] = (),
    overran: Callable[[], str | None] | None = None,
) -> subprocess.CompletedProcess:
    """Runs `argv` with `stdin`, keeping at most `max_stdout` bytes of its stdout and the last 64 KiB of its stderr,
    so that a process writing gigabytes costs its caller no memory; killed (its process group) at `timeout`.

    Args:
        argv (`list[str]`): the command.
        stdin (`str`): what it reads on its stdin.
        timeout (`float`): seconds it may take.
        max_stdout (`int`): bytes of stdout accepted; past them it is killed.
        env (`dict[str, str]` or `None`, *optional*, defaults to `None`): its environment (`None`: a bare one).
        cwd (`str`, *optional*, defaults to `"/"`): its working folder.
        pass_fds (`tuple[int, ...]`, *optional*, defaults to `()`): descriptors it inherits (the seccomp program's).
        overran (`Callable` or `None`, *optional*, defaults to `None`): asked every 0.1 s while it runs; a reason
            it returns stops it.

    Returns:
        `subprocess.CompletedProcess`: its exit code, stdout, and the tail of its stderr, as text.

    Raises:
        subprocess.TimeoutExpired: it took longer than `timeout`.
        SandboxStopped: it wrote more than `max_stdout` bytes on stdout, or `overran` gave a reason.
    """
    process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env or _BARE_ENV,
        cwd=cwd,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    try:
        stdout, stderr = _collect(process, stdin.encode(), time.monotonic() + timeout, max_stdout, overran)
    except subprocess.TimeoutExpired as exc:
        raise subprocess.TimeoutExpired(argv, timeout) from exc
    finally:
        _kill(process)
    text = [bytes(b).decode("utf-8", errors="replace") for b in (stdout, stderr)]
    return subprocess.CompletedProcess(argv, process.returncode, *text)


def _collect(process, stdin: bytes, deadline: float, max_stdout: int, overran) -> tuple[bytearray, bytearray]:
    """Feeds `stdin` and reads stdout and stderr as they come, to the process's end, its bound or `deadline`."""
    stdout, stderr, pending = bytearray(), bytearray(), memoryview(stdin)
    asked = 0.0
    with selectors.DefaultSelector() as selector:
        os.set_blocking(process.stdin.fileno(), False)
        selector.register(process.stdin, selectors.EVENT_WRITE)
        selector.register(process.stdout, selectors.EVENT_READ, stdout)
        selector.register(process.stderr, selectors.EVENT_READ, stderr)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(process.args, 0)
            if overran and time.monotonic() - asked >= POLL_S:
                asked = time.monotonic()
                if why := overran():
                    raise SandboxStopped(why)
            for key, _ in selector.select(min(left, POLL_S)):
                if key.fileobj is process.stdin:
                    pending = _feed(selector, process.stdin, pending)
                else:
                    _read(selector, key, max_stdout if key.data is stdout else None)
    process.wait(max(deadline - time.monotonic(), 0.001))
    return stdout, stderr[-STDERR_TAIL:]


def _feed(selector, pipe, pending: memoryview) -> memoryview:
    """Writes what the pipe takes of `pending`; closes it when all is written, or when the process stopped reading."""
    try:
        pending = pending[os.write(pipe.fileno(), pending[: 64 * 1024]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        pending = pending[:0]
    if not pending:
        selector.unregister(pipe)
        pipe.close()
    return pending


def _read(selector, key, bound: int | None) -> None:
    """Reads what is there into the key's buffer: all of it up to `bound`, else its last `STDERR_TAIL` bytes."""
    chunk = os.read(key.fd, MIB)
    if not chunk:
        selector.unregister(key.fileobj)
        return
    buffer = key.data
    buffer += chunk
    if bound is not None and len(buffer) > bound:
        raise SandboxStopped(f"the process wrote more than {bound} bytes of answer (its stdout), and was stopped")
    if bound is None and len(buffer) > 2 * STDERR_TAIL:
        del buffer[:-STDERR_TAIL]


def _kill(process: subprocess.Popen) -> None:
    """Kills the process's group (bwrap's, whose PID 1 inside dies with it) if it is still there, and reaps it."""
    if process.returncode is None:  # not reaped yet: its group id is still its own, no other process's
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe and not pipe.closed:
            pipe.close()


@functools.cache
def sandbox_problem() -> str | None:
    """Why no sandbox can start on this machine (bwrap missing or refused), or None when one can; tried once."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        done = run([sys.executable, "-I", "-c", "pass"], "", 30.0, operator_limits())
    except (OSError, subprocess.TimeoutExpired, SandboxStopped) as exc:
        return f"bwrap did not start: {exc}"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return f"bwrap cannot start a sandbox here: {said[0]}"
    return None
