"""Benchmark: what keeping every step's rollouts (`rollouts.every: 1`, the default) costs training, against none
(`rollouts.every: 0`).

    python -m benchmarks.rollouts [--quick] [--json PATH]

Two sides per workload, alternating, each grpoflow's training stage in this process on builtin:tiny (startup is not
this benchmark's subject): `every: 1` and `every: 0`. Both log `completions/degenerate_ratio` (the health alert needs
it whatever `every` says), so the difference is the rollouts file: copying TRL's logged generation, building the
columns and queueing them in the training loop, and writing the Parquet file in a background thread.

Three figures per workload, the first the one to judge (aim: below 2% of a step):

- **in-loop share**: the seconds the training loop spent in the rollouts callback (everything it does on the main
  thread, the waits for the writer before each checkpoint included), as a share of `train_runtime`. Measured inside
  one run, so the machine's noise barely moves it.
- **writer share**: the background thread's seconds writing files, as a share of `train_runtime`. On a GPU it
  overlaps with the GPU's work; on a CPU-only machine with few cores it competes with training for them.
- **step time ratio**: the paired median of (CPU and wall) steps/s, `every: 1` over `every: 0`. On the tiny model a
  step takes tens of milliseconds, so this ratio shows the whole cost at its largest; on a shared machine it is only
  as precise as the range printed beside it.

The `long-completions` workload (16 completions of up to 256 tokens per step, a third of the steps) has rows about ten
times the demo's. Checkpoints are the spec's default (every max_steps / 10 steps): before each, the step's file is
written in the loop, so that a checkpoint never precedes a kept step's file (crash safety).
"""

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from benchmarks.common import alternate, finish, fmt, markdown_table, median, paired_ratio, parser, pin_threads
from benchmarks.trainer_vs_trl import Workload, prepare_job, run_project, shaped_workload, with_range

TARGET_SHARE = 0.02


def template(w: Workload, root: Path, every: int):
    """A job folder ready to train, its spec's `rollouts.every` set to `every`."""
    from grpoflow.core.jobdir import write_text_atomic
    from grpoflow.core.spec import load_spec, to_yaml

    job = prepare_job(replace(w, name=f"{w.name}-every-{every}"), root)
    spec, _ = load_spec(job.spec, [f"rollouts.every={every}"])
    write_text_atomic(job.spec, to_yaml(spec))
    return job


def run(job, root: Path, tag: str) -> dict:
    """One training run on a fresh copy of `job`: `run_project`'s figures and what the rollouts callback reported."""
    result = run_project(job, root, tag, None)
    training = json.loads((root / tag / "training.json").read_text())
    rollouts = training["rollouts"]
    runtime = result["train_runtime_s"]
    return {
        **result,
        "steps_per_s": result["steps"] / runtime,
        "cpu_steps_per_s": result["steps"] / result["train_cpu_s"],
        "files": rollouts["files"],
        "in_loop_share": rollouts["loop_seconds"] / runtime,
        "writer_share": rollouts["write_seconds"] / runtime,
        "in_loop_ms_per_step": 1000 * rollouts["loop_seconds"] / result["steps"],
        "writer_ms_per_file": 1000 * rollouts["write_seconds"] / rollouts["files"] if rollouts["files"] else None,
        "step_ms": 1000 * runtime / result["steps"],
    }


def measure(w: Workload, root: Path, repeats: int) -> dict:
    """Both sides of workload `w`, alternating: medians and paired ratios."""
    every1, every0 = template(w, root, 1), template(w, root, 0)
    runs = alternate(
        {
            "every 1": lambda i: run(every1, root, f"{w.name}-1-{i}"),
            "every 0": lambda i: run(every0, root, f"{w.name}-0-{i}"),
        },
        repeats,
    )
    kept, none = runs["every 1"], runs["every 0"]
    keys = ("in_loop_share", "writer_share", "in_loop_ms_per_step", "writer_ms_per_file", "step_ms", "files")
    ratios = {}
    for key in ("cpu_steps_per_s", "steps_per_s"):
        pairs = [a[key] / b[key] for a, b in zip(kept, none, strict=True)]
        ratios[key] = {
            "ratio": paired_ratio([r[key] for r in kept], [r[key] for r in none]),
            "range": [min(pairs), max(pairs)],
        }
    return {
        "every_1": {k: median(r[k] for r in kept) for k in keys},
        "every_0": {k: median(r[k] for r in none) for k in ("in_loop_share", "step_ms", "files")},
        "ratios": ratios,
        "target_met": median(r["in_loop_share"] for r in kept) < TARGET_SHARE,
        "runs": runs,
    }


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    pin_threads()
    steps, repeats = (3, 1) if args.quick else (30, 5)
    workloads, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-rollouts-") as tmp:
        root = Path(tmp)
        demo = shaped_workload("demo-shaped", "demo-shaped", root, steps, zero_variance_share=0.0)
        # A third of the steps: each takes about ten times the demo's.
        long = replace(demo, name="long-completions", rollouts_per_prompt=16, max_response_length=256)
        long = replace(long, max_steps=max(3, steps // 3))
        for w in (demo, long):
            run(template(replace(w, name=f"{w.name}-warm-up", max_steps=1), root, 1), root, f"{w.name}-warm-up")
            result = workloads[w.name] = measure(w, root, repeats)
            kept, ratios = result["every_1"], result["ratios"]
            rows.append(
                [
                    w.name,
                    f"{fmt(100 * kept['in_loop_share'])}% ({fmt(kept['in_loop_ms_per_step'])} ms/step)",
                    f"< {100 * TARGET_SHARE:g}%",
                    f"{fmt(100 * kept['writer_share'])}% ({fmt(kept['writer_ms_per_file'])} ms/file)",
                    with_range(ratios["cpu_steps_per_s"]["ratio"], ratios["cpu_steps_per_s"]["range"]),
                    with_range(ratios["steps_per_s"]["ratio"], ratios["steps_per_s"]["range"]),
                    f"{fmt(kept['step_ms'])} / {fmt(result['every_0']['step_ms'])}",
                ]
            )
    table = markdown_table(
        [
            "workload",
            "in-loop share of a step (every: 1)",
            "target",
            "writer thread share",
            "steps/s every 1 vs 0 (CPU) [range]",
            "same, wall",
            "ms per step, every 1 / 0",
        ],
        rows,
    )
    return finish("rollouts", args, table, {"steps": steps, "repeats": repeats, "workloads": workloads})


if __name__ == "__main__":
    main()
