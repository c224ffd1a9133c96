"""A `python` grader's `grade(sample, item) -> float`, run in a process of its own.

The grader's `source` is code carried inside a spec, so it never runs in the trainer's process: each reward call
starts one child (`python -I -m grpoflow.trainers.graders.python`) that grades every completion of the call. The child
gets a bare environment (no variable of the job's: no keys, no tokens), an empty temporary working folder, a memory
cap (`memory_mb`, default 2048, as OpenAI's sandbox) and `timeout_s` seconds per completion; the whole call is killed
after `timeout_s` per completion plus a start-up allowance. What the grader prints goes to the child's stderr, which
the error message quotes. The network is not closed off here: run the work pool's containers under a network policy
for that. A grader that raises, times out, returns something other than a finite number, or takes its process down
scores None for those completions (TRL: "does not apply") with the error kept; the trainer goes on.

Where spec code may run at all is the trust rules' business (`grpoflow.trainers.trust`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

STARTUP_S = 10.0  # the child's interpreter start and the grader's imports (numpy, say), on top of the per-row time
MAX_STDERR_CHARS = 2000


@dataclass(frozen=True)
class Graded:
    """One completion's grade: its score, or None with the reason."""

    score: float | None
    error: str | None = None


def run_python_grader(
    source: str, rows: list[tuple[dict, dict]], timeout_s: float = 10.0, memory_mb: int = 2048
) -> list[Graded]:
    """Grades each (sample, item) with the `grade` function `source` defines, in a child process.

    Args:
        source (`str`): the grader's Python source; it must define `grade(sample, item)`.
        rows (`list[tuple[dict, dict]]`): one (sample, item) per completion.
        timeout_s (`float`, *optional*, defaults to `10.0`): seconds one `grade` call may take.
        memory_mb (`int`, *optional*, defaults to `2048`): the child's address-space cap.

    Returns:
        `list[Graded]`: one per row, in order.
    """
    if not rows:
        return []
    request = {"source": source, "rows": rows, "timeout_s": timeout_s, "memory_mb": memory_mb}
    with tempfile.TemporaryDirectory(prefix="grpoflow-grader-") as home:
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": home, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-m", "grpoflow.trainers.graders.python"],
                input=json.dumps(request, default=str),
                capture_output=True,
                text=True,
                env=env,
                cwd=home,
                timeout=STARTUP_S + timeout_s * len(rows),
            )
        except subprocess.TimeoutExpired:
            return [Graded(None, f"the grader's process did not finish within {timeout_s:g} s per completion")] * len(
                rows
            )
    try:
        graded = [Graded(score, error) for score, error in json.loads(done.stdout)]
    except (ValueError, TypeError):
        said = done.stderr.strip()[-MAX_STDERR_CHARS:] or "no output"
        return [Graded(None, f"the grader's process ended with exit code {done.returncode}: {said}")] * len(rows)
    return (
        graded
        if len(graded) == len(rows)
        else [Graded(None, "the grader's process answered for other rows")] * len(rows)
    )


# --- the child -------------------------------------------------------------------------------------------------------


def _limit_memory(memory_mb: int) -> None:
    import resource

    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _grade_all(request: dict) -> list[tuple[float | None, str | None]]:
    """The child's work: define `grade` from the source, then call it on every row, each under its own alarm."""
    import signal

    def alarm(signum, frame):
        raise TimeoutError(f"grade() did not return within {request['timeout_s']:g} s")

    signal.signal(signal.SIGALRM, alarm)
    namespace: dict = {"__name__": "grader"}
    try:
        exec(compile(request["source"], "<grader source>", "exec"), namespace)  # noqa: S102 (the point: in this child)
    except BaseException as exc:
        return [(None, f"the source does not run: {type(exc).__name__}: {exc}")] * len(request["rows"])
    grade = namespace.get("grade")
    if not callable(grade):
        return [(None, "the source defines no grade(sample, item) function")] * len(request["rows"])
    return [_grade_one(grade, sample, item, request["timeout_s"]) for sample, item in request["rows"]]


def _grade_one(grade, sample: dict, item: dict, timeout_s: float) -> tuple[float | None, str | None]:
    import signal

    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        value = grade(sample, item)
    except BaseException as exc:  # SystemExit too: one row's failure, not the child's
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"grade() returned {type(value).__name__} {value!r:.80}, expected a number"
    if not math.isfinite(value):
        return None, f"grade() returned {value}, expected a finite number"
    return float(value), None


def main() -> None:
    request = json.load(sys.stdin)
    _limit_memory(request["memory_mb"])
    # The answer goes out on a copy of fd 1; fd 1 itself (and sys.stdout) becomes stderr, so nothing the grader
    # writes, through print, os.write(1, ...) or a process it starts, can corrupt the answer.
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    results = _grade_all(request)
    answer.write(json.dumps(results))
    answer.flush()


if __name__ == "__main__":
    main()
