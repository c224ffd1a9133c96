"""Benchmark: the canary's projection of the training time against the real run's, and what the canary costs a job.

    python -m benchmarks.canary [--quick] [--steps N] [--repeats N] [--json PATH]
    python -m benchmarks.canary --gpu-specs DIR        # benchmarks.gpu's configurations as specs (gpu_check.sh)

On a few job shapes of builtin:tiny (different `max_response_length`, `rollouts_per_prompt`, `prompts_per_step`,
LoRA or full), each on the shipped arithmetic dataset: the canary (`grpoflow.jobs.canary.run_canary`, the code
`grpoflow canary` and the pipeline's stage run: its own GRPO child, one step forced to `max_response_length` on the
longest prompts) and then the real training child of the same spec (`grpoflow.trainers.grpo`, as the training stage
starts it: no checkpoints within the run, no held-out evaluation), alternating the order. It reports:

- the projection (`projected_training_hours`, in seconds: the canary's step, TRL's `step_time`, times the job's
  steps, plus once what `trainer.train()` spent around it) against the `train_runtime` (TRL's figure for its
  `trainer.train()`) of the run it projects: the same spec with every completion at `max_response_length`
  (generation's `min_new_tokens`, as the canary's step has it), the median ratio of `--repeats` canary-and-run pairs
  (the target's figure: one step against ten, each on a machine shared with other work, swung a single pair's
  ratio from 0.99 to 1.44 between two runs of this benchmark);
- the same projection against one run of the spec as it is, whose completions may end early: the canary's figure is
  then an upper bound, by as much as the run's mean length falls short of the maximum (reported, no target);
- why they differ: the canary's step against the run's median step (the machine's noise between two runs), the run's
  slowest step against its fastest (the noise within one run: the steps do the same work), and the run's mean
  completion length as a share of `max_response_length` (the canary's step is forced to the maximum: the worst
  step, so the projection is of a run whose every step is as long as the longest can be);
- the canary's cost: the wall seconds it adds to a job (`canary_seconds`: its child's start, model load and the step,
  with the stack check), beside the training child's own wall seconds.

No Prefect here: the stage's task only wraps `run_canary`. Absolute seconds on a shared machine mean little; the
ratios are the figures.
"""

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import REPO_ROOT, RESULTS_DIR, finish, fmt, markdown_table, median, parser

DATASET = REPO_ROOT / "examples" / "data" / "arithmetic.jsonl"
STEPS = 10
REPEATS = 3  # canary-and-run pairs per shape (odd: the median is one pair's)
# shape name: hyperparameters over the base ones
SHAPES = {
    "K4 L16 full": {"rollouts_per_prompt": 4, "max_response_length": 16},
    "K8 L16 full": {"rollouts_per_prompt": 8, "max_response_length": 16},
    "K4x2 L32 full": {"rollouts_per_prompt": 4, "prompts_per_step": 2, "max_response_length": 32},
    "K4 L16 LoRA": {"rollouts_per_prompt": 4, "max_response_length": 16, "lora_rank": 8},
}
TARGET = 0.25  # the projection within 25% of the real training time


def spec_dict(name: str, shape: dict, steps: int, output: Path, full_length: bool = False) -> dict:
    """The job of `shape`; with `full_length`, every completion generated to max_response_length (the run the
    canary's projection projects)."""
    trl = {"generation_kwargs": {"min_new_tokens": shape["max_response_length"]}} if full_length else {}
    return {
        "name": name,
        "base_model": "builtin:tiny",
        "dataset": {"uri": str(DATASET)},
        "rewards": [{"name": "exact_answer"}, {"name": "length_penalty", "kwargs": {"max_chars": 8}}],
        "hyperparameters": {"max_steps": steps, "learning_rate": 1e-3, **shape},
        "evaluation": {"holdout": 0, "every": 0},
        "checkpoint_every": 10**9,  # none within the run: the canary's projection is of training steps
        "canary": {"enabled": True},
        "output_uri": str(output),
        **({"trl": trl} if trl else {}),
    }


def prepared(name: str, shape: dict, steps: int, root: Path, full_length: bool = False):
    """The spec (validated) and a job folder as create-job and ingest leave it."""
    from grpoflow.core.jobdir import JobDir
    from grpoflow.core.spec import load_spec, to_yaml
    from grpoflow.trainers.dataset import ingest_dataset

    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec_dict(name, shape, steps, root / "runs", full_length)))
    spec, _ = load_spec(path)
    job = JobDir(root / "runs" / name)
    job.root.mkdir(parents=True)
    job.spec.write_text(to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset, prompt_column=spec.dataset.prompt_column, holdout=0)
    return spec, job


def run_training(spec, job) -> dict:
    """The real run: the training stage's child on the job folder; its training.json and wall seconds."""
    from grpoflow.jobs.launch import run_child
    from grpoflow.trainers.metrics import read_metrics

    wall = run_child(
        "grpoflow.trainers.grpo", job, spec.gpu_count, "train.log",
        result=job.training_result, strategy=spec.distributed.strategy,
    )  # fmt: skip
    steps = [r["values"] for r in read_metrics(job.metrics)]
    times = [v["step_time"] for v in steps if v.get("step_time")]
    lengths = [v["completions/mean_length"] for v in steps if v.get("completions/mean_length") is not None]
    return json.loads(job.training_result.read_text()) | {
        "wall_s": wall,
        "step_times_s": [round(t, 3) for t in times],
        "mean_length_share": round(statistics.mean(lengths) / spec.hyperparameters.max_response_length, 3),
    }


def one_pair(name: str, shape: dict, steps: int, root: Path, canary_first: bool, full_length: bool) -> dict:
    """The canary of a spec and the training run of the same spec (with `full_length`, at full length), in that
    order or the other; the job folder is removed after."""
    from grpoflow.jobs.canary import run_canary

    spec, job = prepared(name, shape, steps, root, full_length)
    runs = {}
    for side in ("canary", "run") if canary_first else ("run", "canary"):
        print(f"--- {name}: {side}", file=sys.stderr, flush=True)
        runs[side] = run_canary(spec, job.dataset) if side == "canary" else run_training(spec, job)
    if runs["canary"]["status"] != "passed":
        raise RuntimeError(f"the canary of {name} failed: {runs['canary']['reason']}")
    shutil.rmtree(job.root)
    projected_s = runs["canary"]["projected_training_hours"] * 3600
    return runs | {"projected_s": projected_s, "ratio": projected_s / runs["run"]["train_runtime"]}


def one_shape(name: str, shape: dict, steps: int, root: Path, repeats: int, first: int) -> dict:
    """`repeats` pairs of the canary and a full-length run, alternating their order from `first`, then one pair of the
    canary and the run of the spec as it is; the figures of the median pair (by ratio)."""
    slug = name.replace(" ", "-").lower()
    pairs = [
        one_pair(f"{slug}-{i}", shape, steps, root, canary_first=(first + i) % 2 == 0, full_length=True)
        for i in range(repeats)
    ]
    natural = one_pair(f"{slug}-as-is", shape, steps, root, canary_first=(first + repeats) % 2 == 0, full_length=False)
    pair = sorted(pairs, key=lambda p: p["ratio"])[len(pairs) // 2]
    canary, run, times = pair["canary"], pair["run"], pair["run"]["step_times_s"]
    return {
        "shape": shape,
        "steps": steps,
        "repeats": repeats,
        "canary": canary,
        "train_runtime_s": run["train_runtime"],
        "train_wall_s": run["wall_s"],
        "projected_s": round(pair["projected_s"], 4),  # unrounded enough to recompute the ratio (quick: under 1 s)
        "projection_ratio": round(pair["ratio"], 3),  # the median pair's: the target's figure
        "projection_ratios": [round(p["ratio"], 3) for p in pairs],
        "full_length_share": run["mean_length_share"],  # 1.0: the run at full length, as the canary's step
        # Against the spec as it is: an upper bound, by as much as its completions end before max_response_length.
        "as_is_projection_ratio": round(natural["ratio"], 3),
        "mean_length_share": natural["run"]["mean_length_share"],
        # Why they differ: the canary's step against the run's median step (the machine's noise), the run's steps'
        # spread (slowest / fastest: identical work on a shared machine).
        "run_median_step_s": median(times),
        "canary_step_vs_run_median": round(canary["step_seconds"] / median(times), 3) if times else None,
        "run_step_spread": round(max(times) / min(times), 2) if times else None,
        "canary_seconds": canary["canary_seconds"],
        "canary_cost_share": round(canary["canary_seconds"] / run["wall_s"], 3),
    }


def table_of(shapes: dict) -> str:
    rows = [
        [
            name,
            r["steps"],
            r["canary"]["step_seconds"],
            r["projected_s"],
            r["train_runtime_s"],
            r["projection_ratio"],
            abs(r["projection_ratio"] - 1) <= TARGET,
            ", ".join(fmt(x) for x in r["projection_ratios"]),
            r["canary_step_vs_run_median"],
            r["run_step_spread"],
            r["as_is_projection_ratio"],
            r["mean_length_share"],
            r["canary_seconds"],
            r["train_wall_s"],
        ]
        for name, r in shapes.items()
    ]
    headers = [
        "shape (K rollouts x prompts, L tokens)",
        "steps",
        "canary step s",
        "projected s",
        "full-length run's train_runtime s",
        "projected / real (median pair)",
        "within 25%",
        "each pair",
        "canary step / run's median step",
        "run's slowest / fastest step",
        "projected / the run as is (upper bound)",
        "that run's mean length / max",
        "canary adds s",
        "run's child wall s",
    ]
    return markdown_table(headers, rows)


def write_gpu_specs(folder: Path) -> list[Path]:
    """benchmarks.gpu's configurations (full, LoRA, QLoRA of its Qwen2-0.5B-shaped model, K=8, 64 tokens; on a CPU
    its tiny-width check) as spec files, for `grpoflow canary` before the benchmark (scripts/gpu_check.sh); a
    configuration this machine cannot run (QLoRA without CUDA) is left out, and said."""
    import torch

    from benchmarks.gpu import COMPLETION_LENGTH, MODES, build_model, mode_workload, model_shape, unavailable
    from benchmarks.trainer_vs_trl import project_spec

    cpu = not torch.cuda.is_available()
    model = build_model(folder / "model", model_shape(2 if cpu else 24, cpu), cpu)
    paths = []
    for mode in MODES:
        if why := unavailable(mode):
            print(f"{mode}: left out ({why})", file=sys.stderr)
            continue
        w = mode_workload(mode, folder, model, 8, 8 if cpu else COMPLETION_LENGTH, name=f"canary-{mode}")
        paths.append(folder / f"{mode}.yaml")
        paths[-1].write_text(yaml.safe_dump(project_spec(w, folder / "runs"), sort_keys=False))
    return paths


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, help=f"training steps of each real run (default {STEPS}; 3 with --quick)")
    p.add_argument("--repeats", type=int, help=f"canary-and-run pairs per shape (default {REPEATS}; 1 with --quick)")
    p.add_argument("--gpu-specs", type=Path, metavar="DIR", help="only write benchmarks.gpu's configurations as "
                   "spec files into DIR (with their model and data) and print their paths")  # fmt: skip
    args = p.parse_args(argv)
    if args.gpu_specs:
        args.gpu_specs.mkdir(parents=True, exist_ok=True)
        print("\n".join(str(path) for path in write_gpu_specs(args.gpu_specs)))
        return {}
    steps = args.steps or (3 if args.quick else STEPS)
    repeats = args.repeats or (1 if args.quick else REPEATS)
    names = list(SHAPES)[:1] if args.quick else list(SHAPES)
    started, shapes = time.monotonic(), {}
    path = args.json or RESULTS_DIR / "canary.json"
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-canary-") as tmp:
        for i, name in enumerate(names):
            shapes[name] = one_shape(name, SHAPES[name], steps, Path(tmp), repeats, first=i)
            write_partial(path, summary(shapes, steps, started))
    return finish("canary", args, table_of(shapes), summary(shapes, steps, started))


def summary(shapes: dict, steps: int, started: float) -> dict:
    ratios = [r["projection_ratio"] for r in shapes.values()]
    return {
        "steps": steps,
        "shapes": shapes,
        "target": TARGET,
        "median_projection_ratio": median(ratios),
        "target_met": all(abs(r - 1) <= TARGET for r in ratios),
        "median_canary_seconds": median([r["canary_seconds"] for r in shapes.values()]),
        "benchmark_seconds": round(time.monotonic() - started, 1),
    }


def write_partial(path: Path, data: dict) -> None:
    """What was measured so far, in case the run is stopped before `finish` writes the whole JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "canary", "partial": True, **data, "table": table_of(data["shapes"])}))


if __name__ == "__main__":
    main()
