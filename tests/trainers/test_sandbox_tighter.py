"""The python grader's sandbox, tighter (`grpoflow.trainers.graders.sandbox`): no user namespace inside, a seccomp
filter, one memory cap for the sandbox as a whole, its output read within bounds, its answers checked before use.
Each test attacks as a hostile grader would, through `run_python_grader`, and fails where the protection is
removed: each syscall is called so that it succeeds, or fails with another errno than EPERM, without the filter."""

import errno
import platform
import time
import tracemalloc
from pathlib import Path

import pytest

from grpoflow.trainers.graders import python, sandbox
from grpoflow.trainers.graders.python import run_python_grader

MIB = 1024 * 1024


def run(source: str, answers: list[str], **kwargs) -> list:
    """The grades of `grade` in `source`, one row per answer (its `item["what"]`)."""
    return run_python_grader(source, [({"output_text": "4"}, {"what": a}) for a in answers], **kwargs)


# --- 1. no user namespace inside ------------------------------------------------------------------------------------

UNSHARE_USERNS = """
import ctypes, os
def grade(sample, item):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER: a namespace where it is root, the kernel's to attack
        return 0.0
    return float(ctypes.get_errno())
"""


def test_a_grader_makes_no_user_namespace(monkeypatch):
    [filtered] = run(UNSHARE_USERNS, ["x"])
    assert filtered.score == errno.EPERM, filtered  # the seccomp filter
    monkeypatch.setattr(sandbox, "seccomp_filter", lambda machine=None: None)
    [unfiltered] = run(UNSHARE_USERNS, ["x"])
    assert unfiltered.score not in (None, 0.0), unfiltered  # bwrap's --disable-userns alone (ENOSPC)


# --- 2. the seccomp filter ------------------------------------------------------------------------------------------

NUMBERS = {  # syscalls libc has no wrapper for, as the kernel numbers them (asm/unistd_64.h, asm-generic/unistd.h)
    "x86_64": {"keyctl": 250, "add_key": 248, "perf_event_open": 298, "clone": 56, "clone3": 435, "unshare": 272},
    "aarch64": {"keyctl": 219, "add_key": 217, "perf_event_open": 241, "clone": 220, "clone3": 435, "unshare": 97},
}
SYSCALLS = f"""
import ctypes, os, subprocess
NR = {NUMBERS.get(platform.machine())!r}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
BAD = ctypes.c_void_p(1)  # a pointer the kernel cannot read: EFAULT, where nothing refuses the call before


def attempt(what):
    if what == "ptrace":  # attach to a child of its own: allowed, without the filter
        child = subprocess.Popen(["sleep", "5"])
        try:
            return libc.ptrace(16, child.pid, None, None)  # PTRACE_ATTACH
        finally:
            child.kill()
            child.wait()
    if what == "mount":
        return libc.mount(BAD, BAD, BAD, 0, None)
    if what == "keyctl":  # KEYCTL_GET_KEYRING_ID of its session keyring
        return libc.syscall(NR["keyctl"], 0, -3, 0)
    if what == "add_key":
        return libc.syscall(NR["add_key"], b"user", b"grader", b"secret", 6, -3)
    if what == "perf_event_open":
        return libc.syscall(NR["perf_event_open"], BAD, 0, -1, -1, 0)
    if what == "setns":  # EBADF, without the filter
        return libc.setns(-1, 0)
    if what == "unshare":  # a no-op that succeeds, without the filter
        return libc.unshare(0)
    if what == "x32 unshare":  # the x32 ABI's number of the same call (ENOSYS where the kernel has no x32)
        return libc.syscall(0x40000000 | NR["unshare"], 0)
    if what == "clone":  # a process in a user namespace of its own
        pid = libc.syscall(NR["clone"], 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
        if pid == 0:
            os._exit(0)
        if pid > 0:
            os.waitpid(pid, 0)
        return pid
    if what == "clone3":  # EINVAL for a null argument, without the filter
        return libc.syscall(NR["clone3"], None, 0)


def grade(sample, item):
    done = attempt(item["what"])
    return float(ctypes.get_errno()) if done == -1 else -1.0
"""
DENIED = ["ptrace", "mount", "keyctl", "add_key", "perf_event_open", "setns", "unshare", "clone"]


@pytest.mark.skipif(platform.machine() not in NUMBERS, reason="the filter knows x86_64's and aarch64's numbers")
def test_the_seccomp_filter_denies_what_a_grader_could_attack_the_kernel_with():
    x32 = ["x32 unshare"] if platform.machine() == "x86_64" else []
    graded = run(SYSCALLS, [*DENIED, *x32, "clone3"])
    errnos = dict(zip([*DENIED, *x32, "clone3"], [g.score for g in graded], strict=True))
    assert errnos == {**dict.fromkeys([*DENIED, *x32], errno.EPERM), "clone3": errno.ENOSYS}, graded


def test_a_grader_using_threads_and_processes_works_as_before():
    source = """
import subprocess, sys, threading
from concurrent.futures import ThreadPoolExecutor
def grade(sample, item):
    with ThreadPoolExecutor(4) as pool:  # threads: clone3 refused with ENOSYS, the C library falls back to clone
        squares = sum(pool.map(lambda n: n * n, range(4)))
    out = subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True, text=True).stdout
    return float(squares + int(out))
"""
    assert [g.score for g in run(source, ["x", "y"])] == [16.0, 16.0]


def test_the_filter_kills_a_syscall_of_another_architecture_and_is_none_for_an_unknown_machine():
    program = sandbox.seccomp_filter("x86_64")
    assert len(program) % 8 == 0 and program[8:16] == sandbox._op(sandbox.JEQ, 0xC000003E, jt=1)
    assert sandbox.seccomp_filter("riscv64") is None


# --- 3. one memory cap for the sandbox as a whole -------------------------------------------------------------------

MEMORY_HOGS = """
import subprocess, sys
HOG = "import time; block = bytearray(b'x') * (1536 * 1024 * 1024); time.sleep(600)"  # 1.5 GiB, each page written
def grade(sample, item):
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3)]
    return float(sum(hog.wait() == 0 for hog in hogs))
"""


def test_the_sandbox_as_a_whole_is_held_to_its_memory_cap(monkeypatch):
    monkeypatch.setenv("GRPOFLOW_SANDBOX_MEMORY_MB", "2048")  # each hog is within it, the three are not
    cap = sandbox.memory_cap()
    if cap["mode"] != "cgroup":  # no writable cgroup here: the cap of each process, and what it adds up to, said
        limits = sandbox.operator_limits()
        assert cap["total_mb"] == 2048 * limits.max_processes and cap["per_process_mb"] == 2048, cap
        pytest.skip(f"no sandbox-wide cap here: {cap['why']}")
    assert cap["total_mb"] == cap["per_process_mb"] == 2048, cap
    started = time.monotonic()
    [graded] = run(MEMORY_HOGS, ["x"], timeout_s=900)
    assert graded.score is None and "memory cap, 2048 MiB for all its processes" in graded.error, graded
    assert time.monotonic() - started < 300  # stopped whole at once, not left to sleep out (600 s) or time out
    left = list(Path(cap["why"].rsplit(" at ", 1)[1]).glob("grpoflow-sandbox-*"))
    assert left == []  # its cgroup is removed after the call


def test_without_a_cgroup_the_cap_is_each_process_s_and_says_the_total(monkeypatch):
    monkeypatch.setattr(sandbox, "_memory_controller", lambda: (None, "no writable cgroup memory controller here"))
    monkeypatch.setenv("GRPOFLOW_SANDBOX_MEMORY_MB", "1024")
    monkeypatch.setenv("GRPOFLOW_SANDBOX_MAX_PROCESSES", "8")
    cap = sandbox.memory_cap()
    assert cap == {"mode": "per_process", "total_mb": 8192, "per_process_mb": 1024, "why": cap["why"]}
    assert "no writable cgroup" in cap["why"]
    assert [g.score for g in run("def grade(sample, item):\n    return 1.0\n", ["x"])] == [1.0]


# --- 4. its output read within bounds -------------------------------------------------------------------------------

STDERR_FLOOD = """
import os
def grade(sample, item):
    chunk = b"e" * (1024 * 1024)
    for _ in range(1024):  # 1 GiB on stderr
        os.write(2, chunk)
    os.write(2, b"the last words")
    os._exit(3)
"""
# The answer pipe, as a grader finds it: the one pipe of its descriptors that is not stdin's or stderr's.
ANSWER_FD = """
import os
def answer_fd():
    theirs = {os.readlink(f"/proc/self/fd/{n}") for n in (0, 1, 2)}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("pipe:") and link not in theirs:
            return int(name)
"""


def test_a_grader_flooding_stderr_costs_its_caller_no_memory():
    tracemalloc.start()
    try:
        [graded] = run(STDERR_FLOOD, ["x"], timeout_s=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * MIB, peak / MIB  # all of it, held, would be 1 GiB (3 GiB as text)
    assert graded.score is None and "exit code 3" in graded.error and graded.error.endswith("the last words")


def test_an_answer_past_its_bound_is_refused_naming_it():
    source = ANSWER_FD + "\ndef grade(sample, item):\n    os.write(answer_fd(), b'[' * (64 * 1024 * 1024))\n"
    [graded] = run(source, ["x"], timeout_s=30)
    limit = python.answer_bytes(1)
    assert graded.score is None and f"more than {limit} bytes of answer" in graded.error, graded


def test_a_grader_that_blocks_its_alarm_is_killed_whole_at_the_call_s_timeout(monkeypatch):
    monkeypatch.setattr(python, "STARTUP_S", 1.0)
    source = """
import os, signal, subprocess
def grade(sample, item):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # grade()'s own alarm never comes
    subprocess.Popen(["sleep", "4712"])
    while True:
        os.write(2, b"still here\\n")
"""
    started = time.monotonic()
    [graded] = run(source, ["x"], timeout_s=1)
    assert graded.score is None and "did not finish within 1 s" in graded.error, graded
    assert time.monotonic() - started < 60  # killed at its 1 s (its loop never ends by itself)
    time.sleep(0.2)  # the sandbox's PID 1 takes its processes with it
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"4712" in _read(p)]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# --- 5. its answers checked before use ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, message",
    [
        ("[[NaN, null], [1.0, null]]", "answer 0's score is float nan, expected a finite number or null"),
        ("[[1.0, null], [Infinity, null]]", "answer 1's score is float inf"),
        ("[[-Infinity, null], [1.0, null]]", "answer 0's score is float -inf"),
        ("[[1e999, null], [1.0, null]]", "answer 0's score is float inf"),
        ('[["high", null], [1.0, null]]', "answer 0's score is str 'high'"),
        ('[[{"score": 1}, null], [1.0, null]]', "answer 0's score is dict {'score': 1}"),
        ("[[[1.0], null], [1.0, null]]", "answer 0's score is list [1.0]"),
        ("[[true, null], [1.0, null]]", "answer 0's score is bool True"),
        ("[[1" + "0" * 400 + ", null], [1.0, null]]", "answer 0's score is int 1000"),
        ('[[1.0, {"no": "string"}], [1.0, null]]', "answer 0's error is dict"),
        ("[[1.0, null]]", "1 answers for 2 completions"),
        ("[[1.0, null], [1.0, null], [1.0, null]]", "3 answers for 2 completions"),
        ("[1.0, 1.0]", "answer 0 is float 1.0, expected a [score, error] pair"),
        ("[[1.0, null, 2], [1.0, null]]", "answer 0 is list [1.0, None, 2], expected a [score, error] pair"),
        ('{"0": 1.0}', "dict {'0': 1.0}, expected a list of [score, error] pairs"),
        ("1.0", "float 1.0, expected a list"),
        ("[" * 30000 + "]" * 30000, "not JSON"),  # nested past the parser's depth
        ("[[1.0, null]][[1.0, null]]", "not JSON"),
    ],
)
def test_an_answer_the_grader_wrote_itself_is_checked_before_use(answer, message):
    source = f"{ANSWER_FD}\ndef grade(sample, item):\n    os.write(answer_fd(), {answer.encode()!r})\n"
    source += "    os._exit(0)\n"
    graded = run(source, ["x", "y"])
    assert [g.score for g in graded] == [None, None] and message in graded[0].error, graded


def test_a_well_formed_answer_the_grader_wrote_itself_is_taken():
    source = f"{ANSWER_FD}\ndef grade(sample, item):\n    os.write(answer_fd(), b'[[0.5, null], [null, \"no\"]]')\n"
    source += "    os._exit(0)\n"
    assert [(g.score, g.error) for g in run(source, ["x", "y"])] == [(0.5, None), (None, "no")]


def test_the_child_cuts_long_errors_so_its_answer_stays_within_bounds():
    source = "def grade(sample, item):\n    raise ValueError('\\u00e9' * 100_000)\n"
    graded = run(source, ["x"] * 200)
    assert all(g.score is None and len(g.error) <= 1000 for g in graded), graded[0]
