"""Benchmark 2: skipping zero-variance groups (`hyperparameters.skip_zero_variance_groups: true`) against TRL.

    python -m benchmarks.skip_zero_variance [--quick] [--json PATH]

Three sides per workload, alternating, each training in this process (startup is benchmark 1's subject, not
this one's): the hand-written TRL script, grpoflow's training stage, and grpoflow's training stage with the skip on.
Workloads (see `benchmarks.workloads`): the `demo-shaped` and `long-prompt` shapes, each with half of its prompts
ungraded (a constant reward, so exactly half of the groups have zero variance over the one epoch run) and with none.

What skipping can buy is bounded: it removes the forward and backward pass and the optimizer step of the skipped
steps, never generation or scoring (they decide whether a step is skipped). With a share z of skipped steps and a
share f of a step's time spent in forward, backward and optimizer, the speed-up is at most 1 / (1 - z f). The table
reports f, measured as 1 - (step time with every step skipped) / (step time with none), on each shape.

The targets judge the skip itself: grpoflow with the skip on against grpoflow with it off (the same trainer
otherwise; grpoflow against TRL is benchmark 1's subject, reported here beside it). Where half the groups have zero
variance, the skip must buy at least three quarters of what its bound allows on that shape, 1 + 0.75 (bound - 1)
(about 1.4 on the long-prompt shape, 1.1 on the demo shape, where training is a fifth to a quarter of a step). Where
nothing is skippable, the skip must cost nothing: what it adds to a step is one check of the step's advantages (a
count of the non-zero ones, agreed by every process), and its share of `Trainer.train`'s CPU time, timed inside each
run, must stay under 1%; whole-run pairs, which scatter by 5-10% here, cannot resolve a cost that small (their ratio
is reported beside it).

Ratios are steps per CPU-second of `Trainer.train` (see `trainer_vs_trl.train_cpu_seconds`), with the wall-time
ratio beside them. Each run is 30 steps (at 10, the demo shape's runs were a second of training, and the pairs
scattered 0.91-1.0 around a skip that costs a tensor count per step), so its fixed costs (trainer setup, the
checkpoint Trainer writes at the end) weigh a little on both f and the ratios: a long run gains a little more.
"""

import tempfile
from pathlib import Path

from benchmarks.common import finish, markdown_table, paired_ratio, parser, pin_threads
from benchmarks.trainer_vs_trl import NO_CHECKPOINTS, compare, paired_range, shaped_workload, with_range

# Where at least half the groups have zero variance, grpoflow+skip vs grpoflow must reach this share of the gain the
# bound allows.
TARGET_SHARE_OF_BOUND = 0.75
TARGET_CHECK_SHARE = 0.01  # where nothing is skippable: the check's share of Trainer.train's CPU time, at most
# Checkpoints cost the same with or without skipping, and are benchmark 1's subject: none within these runs.
SKIP = {"extra_hyperparameters": {"skip_zero_variance_groups": True}, **NO_CHECKPOINTS}


def training_share(root: Path, shape: str, steps: int, repeats: int) -> float | None:
    """f: the share of a step's time in forward, backward and optimizer, from an all-skipped vs a no-skip run."""
    w = shaped_workload(f"{shape}-all-constant", shape, root, steps, zero_variance_share=1.0)
    sides = compare(w, root, repeats, variants={"grpoflow+skip": SKIP})["sides"]
    ratio = sides["grpoflow+skip"]["cpu_steps_per_s_ratio"]
    return 1 - 1 / ratio if ratio else None


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    pin_threads()
    steps, repeats = (2, 1) if args.quick else (30, 7)
    rows, workloads = [], {}
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-") as tmp:
        root = Path(tmp)
        for shape in ("long-prompt", "demo-shaped"):
            f = training_share(root, shape, steps, 1 if args.quick else 2)
            for share in (0.5, 0.0):
                name = f"{shape}-{int(share * 100)}pct-zero-variance"
                w = shaped_workload(name, shape, root, steps, zero_variance_share=share)
                result = compare(w, root, repeats, variants={"grpoflow": NO_CHECKPOINTS, "grpoflow+skip": SKIP})
                s = result["sides"]
                skip, plain = s["grpoflow+skip"], s["grpoflow"]
                # z: the share of steps actually skipped, measured (one prompt per step: the share of ungraded
                # prompts, when each of their groups really had zero variance).
                z = skip["skipped_share"] or 0.0
                bound = 1 / (1 - z * f) if f is not None else None
                runs = result["runs"]
                skip_vs_grpoflow = paired_ratio(
                    [r["cpu_steps_per_s"] for r in runs["grpoflow+skip"]],
                    [r["cpu_steps_per_s"] for r in runs["grpoflow"]],
                )
                check_share = skip["skip_check_share"]
                if share >= 0.5:
                    target = round(1 + TARGET_SHARE_OF_BOUND * (bound - 1), 3) if bound else 1.0
                    judged, met = f">= {target}", skip_vs_grpoflow >= target
                else:
                    target = TARGET_CHECK_SHARE
                    judged, met = f"check <= {target:.0%} of the step", check_share <= target
                workloads[name] = {
                    "shape": shape,
                    "zero_variance_share_of_prompts": share,
                    "training_share_f": f,
                    "speedup_bound": bound,
                    # CPU time is the figure judged (see trainer_vs_trl.train_cpu_seconds); wall time beside it.
                    "skip_vs_trl": skip["cpu_steps_per_s_ratio"],
                    "skip_vs_trl_wall": skip["steps_per_s_ratio"],
                    # The figure judged: the skip on against off, both grpoflow (the range of the pairs beside).
                    "skip_vs_grpoflow": skip_vs_grpoflow,
                    "skip_vs_grpoflow_range": paired_range(runs["grpoflow+skip"], runs["grpoflow"], "cpu_steps_per_s"),
                    "grpoflow_vs_trl": plain["cpu_steps_per_s_ratio"],
                    "skipped_share": skip["skipped_share"],
                    # The check's share of Trainer.train's CPU time in the skipping runs (median).
                    "skip_check_share": check_share,
                    # What is judged: skip_vs_grpoflow where half the groups can be skipped, else skip_check_share.
                    "judged": "skip_vs_grpoflow" if share >= 0.5 else "skip_check_share",
                    "target": target,
                    "target_met": met,
                    **result,
                }
                row = workloads[name]
                rows.append(
                    [
                        name,
                        row["skipped_share"],
                        with_range(row["skip_vs_grpoflow"], row["skip_vs_grpoflow_range"]),
                        check_share,
                        judged,
                        with_range(row["skip_vs_trl"], skip["cpu_steps_per_s_ratio_range"]),
                        with_range(row["skip_vs_trl_wall"], skip["steps_per_s_ratio_range"]),
                        row["grpoflow_vs_trl"],
                        f,
                        bound,
                    ]
                )
    table = markdown_table(
        [
            "workload",
            "steps skipped",
            "grpoflow+skip vs grpoflow (CPU) [range of pairs]",
            "the skip's check: share of Trainer.train (CPU)",
            "target",
            "grpoflow+skip vs TRL (CPU) [range of pairs]",
            "same, wall time",
            "grpoflow vs TRL (CPU)",
            "f: train share of a step",
            "bound 1/(1-z f)",
        ],
        rows,
    )
    return finish(
        "skip_zero_variance",
        args,
        table,
        {"steps": steps, "repeats": repeats, "workloads": workloads},
    )


if __name__ == "__main__":
    main()
