"""Benchmark 10: what the sandbox costs a python grader: one reward call in the sandbox and in a bare child process.

    python -m benchmarks.sandbox [--quick] [--json PATH] [--repeats 20]

Both sides are `run_python_grader` as training calls it (one process start per reward call, every completion of the
call graded in it), with a grader that only computes (a few string operations). `sandboxed`: bubblewrap, as
everywhere it can start; `bare`: the fallback a user's own command line gets where bwrap is missing (a bare child
process, no namespaces), forced here by a PATH without bwrap. Each side is timed for a call of 1 completion (the
per-call cost: process and sandbox start) and of 64 (a GRPO step's worth), alternating sides. Reported: median
milliseconds per call and per completion, and the sandbox's extra milliseconds per call. Never asserted; `--quick`
runs 3 repeats.
"""

import os
import statistics
import tempfile
import time

from benchmarks.common import alternate, finish, fmt, markdown_table, parser
from grpoflow.core.trust import command_line
from grpoflow.trainers.graders import sandbox
from grpoflow.trainers.graders.python import run_python_grader

SOURCE = """
def grade(sample, item):
    text = sample["output_text"].strip().lower()
    return float(text == item["answer"].lower()) + 0.1 * (len(text) < 40)
"""
SIZES = (1, 64)


def timed_call(rows: int) -> float:
    """Milliseconds of one `run_python_grader` call over `rows` completions."""
    batch = [({"output_text": f" Answer {i} "}, {"answer": f"answer {i}"}) for i in range(rows)]
    started = time.perf_counter()
    graded = run_python_grader(SOURCE, batch)
    elapsed = (time.perf_counter() - started) * 1000
    if any(g.score is None for g in graded):
        raise RuntimeError(f"the grader failed: {graded[0].error}")
    return elapsed


def bare(rows: int) -> float:
    """A call where no sandbox can start (PATH without bwrap), on the user's own command line."""
    saved = os.environ["PATH"]
    with tempfile.TemporaryDirectory() as empty, command_line():
        os.environ["PATH"] = empty
        sandbox.sandbox_problem.cache_clear()
        try:
            return timed_call(rows)
        finally:
            os.environ["PATH"] = saved
            sandbox.sandbox_problem.cache_clear()


def _side(side: str, rows: int) -> str:
    return f"{side}, {rows} completion{'s' * (rows > 1)}"


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--repeats", type=int, help="calls of each side and size (default 20; 3 with --quick)")
    args = p.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 20)
    if problem := sandbox.sandbox_problem():
        raise SystemExit(f"no sandbox here: {problem}")
    sides = {
        _side(side, rows): (lambda i, f=fn, n=rows: {"ms": f(n)})
        for rows in SIZES
        for side, fn in (("sandboxed", timed_call), ("bare", bare))
    }
    runs = alternate(sides, repeats)
    ms = {name: statistics.median(r["ms"] for r in results) for name, results in runs.items()}
    rows = [[name, fmt(v), fmt(v / int(name.split(", ")[1].split()[0]))] for name, v in ms.items()]
    extra = {n: ms[_side("sandboxed", n)] - ms[_side("bare", n)] for n in SIZES}
    table = markdown_table(["side, completions per call", "median ms per call", "ms per completion"], rows)
    table += "\n\n" + "; ".join(f"the sandbox adds {fmt(v)} ms to a call of {n}" for n, v in extra.items())
    return finish("sandbox", args, table, {"ms_per_call": ms, "sandbox_extra_ms": extra, "repeats": repeats})


if __name__ == "__main__":
    main()
