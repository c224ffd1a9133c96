"""A `python` grader's `grade(sample, item) -> float`, run in a sandbox of its own.

The grader's `source` is code carried inside a spec, so it never runs in the trainer's process: each reward call
starts one sandbox (`grpoflow.trainers.graders.sandbox`: bubblewrap, no network, no folder or variable of the job's,
bounded processes, disk, CPU and memory) that grades every completion of the call with `grader_child.py`. `memory_mb`
(default: the operator's `GRPOFLOW_SANDBOX_MEMORY_MB`, 2048, as OpenAI's sandbox) may only lower the operator's cap;
`timeout_s` bounds each completion, and the whole call is killed after `timeout_s` per completion plus a start-up
allowance. What the grader prints goes to the sandbox's stderr, whose last 64 KiB are kept and quoted by the error
message. A grader that raises, times out, returns something other than a finite number, or takes its process down
scores None for those completions (TRL: "does not apply") with the error kept; the trainer goes on.

The answer the child hands back (`[[score, error], ...]` on its stdout) is bounded (`answer_bytes`: 64 KiB and 8 KiB
a completion) and checked before use, since the grader's code runs in the same process and may write there itself:
one pair a completion, each score a finite number or null, each error a string or null; else the whole call scores
None, naming the first bad answer. So does a sandbox stopped whole (over its memory cap, where a cgroup holds one).

Where no sandbox can start (no bwrap, user namespaces refused), the grader runs in a bare child process only where
the trust rules allow it (`grpoflow.core.trust.unsandboxed_allowed`: the user's own command line, with one
warning, or the operator's `GRPOFLOW_ALLOW_SPEC_CODE=unsandboxed`); elsewhere each completion scores None, saying why.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from grpoflow.core.graders import operator_limits
from grpoflow.core.policy import PolicyError, load_policy, spec_code
from grpoflow.core.spec import JobSpec
from grpoflow.core.trust import unsandboxed_allowed, unsandboxed_refusal
from grpoflow.trainers.graders import sandbox

STARTUP_S = 10.0  # the sandbox's start and the grader's imports (numpy, say), on top of the per-row time
MAX_STDERR_CHARS = 2000
# The child cuts each error to 1,000 characters: a row's pair is at most ~6 KiB of JSON (\uXXXX escapes included).
ANSWER_BYTES = (64 * 1024, 8 * 1024)  # bytes of the child's answer accepted: for the call, and for each row
CHILD = Path(__file__).with_name("grader_child.py")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Graded:
    """One completion's grade: its score, or None with the reason."""

    score: float | None
    error: str | None = None


def sandbox_refusals(spec: JobSpec) -> list[str]:
    """Where a deployment's spec carries a python grader the policy allows, and no sandbox can start on this worker
    to run it (`grpoflow.core.policy` refuses one the policy turns off)."""
    places = spec_code(spec)
    try:
        if not places or load_policy().policy.from_deployments.python_graders == "off":
            return []
    except PolicyError:
        return []  # the policy's own refusal says what is wrong with it
    if problem := sandbox.sandbox_problem():
        return [
            f"{where}: a python grader runs only in the sandbox from a deployment, and it cannot start on this worker "
            f"({problem}); install bubblewrap where the job runs (docs/guides/security.md)"
            for where in places
        ]
    return []


def run_python_grader(
    source: str, rows: list[tuple[dict, dict]], timeout_s: float = 10.0, memory_mb: int | None = None
) -> list[Graded]:
    """Grades each (sample, item) with the `grade` function `source` defines, in a sandbox.

    Args:
        source (`str`): the grader's Python source; it must define `grade(sample, item)`.
        rows (`list[tuple[dict, dict]]`): one (sample, item) per completion.
        timeout_s (`float`, *optional*, defaults to `10.0`): seconds one `grade` call may take.
        memory_mb (`int` or `None`, *optional*, defaults to `None`): the sandbox's address-space cap, at most the
            operator's `GRPOFLOW_SANDBOX_MEMORY_MB` (`None`: that).

    Returns:
        `list[Graded]`: one per row, in order.
    """
    if not rows:
        return []

    limits = operator_limits()
    limits = replace(limits, memory_mb=min(memory_mb or limits.memory_mb, limits.memory_mb))
    request = {"source": source, "rows": rows, "timeout_s": timeout_s, "limits": vars(limits)}
    argv, timeout = [sys.executable, "-I", "-c", CHILD.read_text()], STARTUP_S + timeout_s * len(rows)
    try:
        done = _run(argv, json.dumps(request, default=str), timeout, limits, answer_bytes(len(rows)))
    except subprocess.TimeoutExpired:
        return [Graded(None, f"the grader's process did not finish within {timeout_s:g} s per completion")] * len(rows)
    except (PermissionError, sandbox.SandboxStopped) as exc:
        return [Graded(None, str(exc))] * len(rows)
    return _answers(done, len(rows))


def answer_bytes(rows: int) -> int:
    """The most bytes of answer the grader's process may write for a call of `rows` completions."""
    return ANSWER_BYTES[0] + ANSWER_BYTES[1] * rows


def _run(argv: list[str], stdin: str, timeout: float, limits, max_stdout: int) -> subprocess.CompletedProcess:
    """`argv` in a sandbox; where none can start, in a bare child process if the trust rules allow it. Either way
    its output is read as it comes: `max_stdout` bytes of answer at most, the tail of its stderr.

    Raises:
        PermissionError: no sandbox here, and this run may not go without one (the message says what to do).
        sandbox.SandboxStopped: it went over its memory cap or wrote more than `max_stdout` bytes of answer.
        subprocess.TimeoutExpired: it ran past `timeout` (and was killed).
    """
    if (problem := sandbox.sandbox_problem()) is None:
        return sandbox.run(argv, stdin, timeout, limits, max_stdout)
    if not unsandboxed_allowed():
        raise PermissionError(unsandboxed_refusal(problem))
    _warn_once(problem)
    with tempfile.TemporaryDirectory(prefix="grpoflow-grader-") as home:
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": home, "PYTHONDONTWRITEBYTECODE": "1"}
        return sandbox.run_bounded(argv, stdin, timeout, max_stdout, env=env, cwd=home)


_warned: set[str] = set()


def _warn_once(problem: str) -> None:
    if problem not in _warned:
        _warned.add(problem)
        logger.warning(
            "python graders run WITHOUT a sandbox: %s. Their source can read this machine's files and environment "
            "and reach its network; install bubblewrap to sandbox them",
            problem,
        )


def _ended(code: int) -> str:
    """How the sandboxed process ended, in words: its exit code, or the signal (and the limit that sent it). bwrap
    exits 128 + N for a process killed by signal N; a bare child's code is -N."""
    number = -code if code < 0 else code - 128 if code > 128 else None
    if number is None:
        return f"ended with exit code {code}"
    if number == signal.SIGXCPU:
        return "was stopped by the sandbox's CPU limit (SIGXCPU; the operator's GRPOFLOW_SANDBOX_CPU_SECONDS)"
    try:
        return f"was killed by {signal.Signals(number).name}"
    except ValueError:
        return f"was killed by signal {number}"


def _answers(done: subprocess.CompletedProcess, count: int) -> list[Graded]:
    """The grades the child wrote, or every row's failure when it wrote none, or an answer that does not hold."""
    said = done.stderr.strip()[-MAX_STDERR_CHARS:] or "no output"
    if not done.stdout.strip():
        return [Graded(None, f"the grader's process {_ended(done.returncode)}: {said}")] * count
    try:
        answer = json.loads(done.stdout)  # NaN and Infinity parse, as floats: refused below, naming the row
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested past the parser's depth
        problem = f"not JSON ({type(exc).__name__}: {str(exc)[:200]}); the process {_ended(done.returncode)}: {said}"
        return [Graded(None, f"the grader's process handed back a malformed answer: {problem}")] * count
    if problem := _answer_problem(answer, count):
        return [Graded(None, f"the grader's process handed back a malformed answer: {problem}")] * count
    return [Graded(None if s is None else float(s), None if e is None else e[:MAX_STDERR_CHARS]) for s, e in answer]


def _answer_problem(answer, count: int) -> str | None:
    """What is wrong with the child's answer, first thing first, or None: it must be `count` [score, error] pairs,
    each score a finite number or null, each error a string or null (JSON's true and false are not numbers)."""
    if not isinstance(answer, list):
        return f"{_shown(answer)}, expected a list of [score, error] pairs"
    if len(answer) != count:
        return f"{len(answer)} answers for {count} completions"
    for index, pair in enumerate(answer):
        if not (isinstance(pair, list) and len(pair) == 2):
            return f"answer {index} is {_shown(pair)}, expected a [score, error] pair"
        score, error = pair
        if not _finite_or_none(score):
            return f"answer {index}'s score is {_shown(score)}, expected a finite number or null"
        if not (error is None or isinstance(error, str)):
            return f"answer {index}'s error is {_shown(error)}, expected a string or null"
    return None


def _finite_or_none(value) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        return False


def _shown(value) -> str:
    """A value of the answer as the message names it: its type, and its start."""
    return f"{type(value).__name__} {value!r:.60}"
