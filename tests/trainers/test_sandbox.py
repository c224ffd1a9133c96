"""The python grader's sandbox (`grpoflow.trainers.graders.sandbox`, `trainers/graders/python.py`), tried as an
attacker whose only way in is a grader's source: each thing it reaches for is out of reach, with the message a user
reads; a grader that only computes scores as before. bwrap is installed by the project (`.ci/run`, the Dockerfile):
these tests run the real one, and fail where it is missing rather than skip."""

import http.server
import logging
import sys
import threading
from pathlib import Path

import pytest

from grpoflow.core.graders import grader_problems
from grpoflow.core.trust import SPEC_ORIGIN_ENV, command_line
from grpoflow.trainers.graders import sandbox
from grpoflow.trainers.graders.python import run_python_grader


def run(source: str, answers: list[str], **limits) -> list:
    """The grades of `grade` in `source`, one row per answer (its `item["what"]`)."""
    rows = [({"output_text": "4"}, {"what": a}) for a in answers]
    return run_python_grader(source, rows, **limits)


def test_the_sandbox_starts_here():
    assert sandbox.sandbox_problem() is None  # `.ci/run` installs bubblewrap: no test below may pass without it


def test_a_grader_reads_no_secret_and_no_folder_of_the_job(tmp_path, monkeypatch):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_TOKEN_ON_DISK")
    (tmp_path / "prefect").mkdir()
    (tmp_path / "prefect" / "prefect.db").write_text("SQLite format 3")
    (tmp_path / "runs" / "job").mkdir(parents=True)
    monkeypatch.setenv("HF_TOKEN", "hf_TOKEN_IN_ENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_IN_ENV")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    prefixes = [Path(p).resolve() for p in (sys.prefix, sys.base_prefix)]
    interpreter = {p.relative_to(Path.home()).parts[0] for p in prefixes if p.is_relative_to(Path.home())}
    source = f"""
import glob, os
def grade(sample, item):
    what = item["what"]
    if what == "environ":  # every process it can see, its own PID 1 included
        texts = []
        for path in glob.glob("/proc/*/environ"):
            try:
                texts.append(open(path).read())
            except OSError:
                pass
        texts.append(str(os.environ))
        return float(sum("SECRET" in t or "TOKEN" in t for t in texts))
    if what == "processes":  # the worker's processes are not there to read
        return float(len([p for p in os.listdir("/proc") if p.isdigit()]))
    if what == "home":  # nothing of the home folder but the way to the interpreter, where it lives there
        try:
            return float(bool(set(os.listdir("{Path.home()}")) - {interpreter!r}))
        except OSError:  # not there, or not readable by the sandbox's user
            return 0.0
    paths = {{"token": "{tmp_path}/hf/token", "db": "{tmp_path}/prefect/prefect.db", "job": "{tmp_path}/runs/job",
             "checkout": "{Path.cwd() / "pyproject.toml"}"}}
    return float(os.path.exists(paths[what]))
"""
    graded = run(source, ["environ", "token", "db", "job", "home", "checkout"])
    assert [g.score for g in graded] == [0.0] * 6, graded
    [processes] = run(source, ["processes"])
    assert processes.score is not None and processes.score <= 3  # bwrap's PID 1, the grader, maybe its init


def test_a_grader_reaches_no_service_of_the_machine():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        source = f"""
import socket
def grade(sample, item):
    socket.create_connection(("127.0.0.1", {server.server_port}), timeout=2)
    return 1.0
"""
        [graded] = run(source, ["loopback"])
    finally:
        server.shutdown()
    assert graded.score is None and "ConnectionRefusedError" in graded.error  # its own loopback, nobody there


def test_a_grader_writes_nothing_outside_and_nothing_big(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOFLOW_SANDBOX_DISK_MB", "8")
    source = f"""
def grade(sample, item):
    if item["what"] == "outside":
        open("{tmp_path}/marker", "w").write("x")
    else:
        open("/tmp/big", "wb").write(b"x" * 20 * 1024 * 1024)
    return 1.0
"""
    outside, big = run(source, ["outside", "big"])
    assert outside.score is None and "FileNotFoundError" in outside.error and not (tmp_path / "marker").exists()
    assert big.score is None and "File too large" in big.error


def test_nothing_of_a_grader_survives_the_call():
    source = """
import subprocess
def grade(sample, item):
    # a double-forked process in a session of its own, left running
    subprocess.Popen(["sh", "-c", "(setsid sleep 4711 &) ; exit 0"]).wait()
    return 1.0
"""
    assert [g.score for g in run(source, ["fork"])] == [1.0]
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            alive += [cmdline] if b"4711" in cmdline.read_bytes() else []
        except OSError:
            pass
    assert alive == []


def test_processes_memory_and_cpu_are_bounded(monkeypatch):
    monkeypatch.setenv("GRPOFLOW_SANDBOX_MAX_PROCESSES", "8")
    monkeypatch.setenv("GRPOFLOW_SANDBOX_CPU_SECONDS", "1")
    source = """
import subprocess
def grade(sample, item):
    if item["what"] == "fork":
        children = [subprocess.Popen(["sleep", "5"]) for _ in range(50)]
    if item["what"] == "memory":
        block = bytearray(600 * 1024 * 1024)
    while item["what"] == "cpu":
        pass
    return 1.0
"""
    fork, memory = run(source, ["fork", "memory"], memory_mb=256)
    assert fork.score is None and "Resource temporarily unavailable" in fork.error
    assert memory.score is None and "MemoryError" in memory.error
    [cpu] = run(source, ["cpu"], timeout_s=20)
    assert cpu.score is None and "CPU limit" in cpu.error and "GRPOFLOW_SANDBOX_CPU_SECONDS" in cpu.error


def test_a_spec_may_only_lower_the_memory_cap(monkeypatch):
    grader = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1.0\n"}
    assert grader_problems(grader, {"memory_mb": 1024}) == []
    [(field, message)] = grader_problems(grader, {"memory_mb": 10_000_000})
    assert field == "kwargs.memory_mb" and "GRPOFLOW_SANDBOX_MEMORY_MB" in message
    monkeypatch.setenv("GRPOFLOW_SANDBOX_MEMORY_MB", "512")
    assert grader_problems(grader, {"memory_mb": 1024}) != []


def test_a_grader_that_only_computes_scores_as_before():
    source = "import math\ndef grade(sample, item):\n    return math.sqrt(len(sample['output_text']) * 4)\n"
    assert [g.score for g in run(source, ["a", "b"])] == [2.0, 2.0]


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """A machine where bwrap is not installed: a PATH without it."""
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox.sandbox_problem.cache_clear()
    yield
    sandbox.sandbox_problem.cache_clear()


SCORES_ONE = "def grade(sample, item):\n    return 1.0\n"


@pytest.mark.usefixtures("no_bwrap")
def test_without_bwrap_only_the_command_line_runs_spec_code(monkeypatch, caplog):
    assert "bwrap is not installed" in sandbox.sandbox_problem()
    monkeypatch.setenv(SPEC_ORIGIN_ENV, "deployment")  # the training child of a run launched from a deployment
    [refused] = run(SCORES_ONE, ["x"])
    assert refused.score is None and "runs only in the sandbox" in refused.error
    with command_line(), caplog.at_level(logging.WARNING):
        assert [g.score for g in run(SCORES_ONE, ["x", "y"]) + run(SCORES_ONE, ["z"])] == [1.0] * 3
    warnings = [r.getMessage() for r in caplog.records if "WITHOUT a sandbox" in r.getMessage()]
    assert len(warnings) == 1 and "bwrap is not installed" in warnings[0]  # once, not per call
    monkeypatch.setenv(
        "GRPOFLOW_ALLOW_SPEC_CODE", "unsandboxed"
    )  # the old switch, which a run's job variables could set
    [refused] = run(SCORES_ONE, ["x"])
    assert refused.score is None and "runs only in the sandbox" in refused.error
