"""The inside of a `python` grader's sandbox: limits itself, defines `grade` from the source, grades every row.

`grpoflow.trainers.graders.python` runs this file's text with `python -I -c` inside the sandbox
(`grpoflow.trainers.graders.sandbox`), where grpoflow itself is not importable: it uses the standard library alone. It
reads one JSON request on stdin, `{"source", "rows", "timeout_s", "limits"}`, sets the limits on itself before the
source runs (a process cannot raise them again), and writes `[[score, error], ...]`, one pair per row, on a copy of fd
1, each error cut to 1,000 characters so that the answer stays within what the caller reads. The grader's code runs
in this process and could write on that copy itself: the caller checks the answer before using it.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys

MIB = 1024 * 1024
MAX_ERROR_CHARS = 1000


def limit(limits: dict) -> None:
    """Lowers this process's limits (and so its children's) to the sandbox's: memory, processes, file size, CPU."""
    for name, value in (
        (resource.RLIMIT_AS, limits["memory_mb"] * MIB),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
        (resource.RLIMIT_FSIZE, limits["disk_mb"] * MIB),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(name, (value, value))
    # SIGXCPU at the soft limit says which limit it was; SIGKILL a second later if it is caught
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))


def grade_all(request: dict) -> list[tuple[float | None, str | None]]:
    """Defines `grade` from the source, then calls it on every row, each under its own alarm."""

    def alarm(signum, frame):
        raise TimeoutError(f"grade() did not return within {request['timeout_s']:g} s")

    signal.signal(signal.SIGALRM, alarm)
    namespace: dict = {"__name__": "grader"}
    try:
        exec(compile(request["source"], "<grader source>", "exec"), namespace)  # noqa: S102 (the point: in the sandbox)
    except BaseException as exc:
        return [(None, f"the source does not run: {type(exc).__name__}: {exc}")] * len(request["rows"])
    grade = namespace.get("grade")
    if not callable(grade):
        return [(None, "the source defines no grade(sample, item) function")] * len(request["rows"])
    return [grade_one(grade, sample, item, request["timeout_s"]) for sample, item in request["rows"]]


def grade_one(grade, sample: dict, item: dict, timeout_s: float) -> tuple[float | None, str | None]:
    """One row's (score, error): the number `grade` returned, or None and why."""
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
    limit(request["limits"])
    # The answer goes out on a copy of fd 1; fd 1 itself (and sys.stdout) becomes stderr, so nothing the grader
    # writes, through print, os.write(1, ...) or a process it starts, can corrupt the answer.
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    results = [(score, error and error[:MAX_ERROR_CHARS]) for score, error in grade_all(request)]
    answer.write(json.dumps(results))
    answer.flush()


if __name__ == "__main__":
    main()
