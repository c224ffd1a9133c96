"""Benchmark 7: what helps the demo learn. Held-out gain of the demo job (examples/arithmetic.yaml) for each of TRL's
`loss_type` grpo, dr_grpo and dapo (TRL's default), and for dapo without the SFT warm-up, over several seeds.

    python -m benchmarks.learning [--quick] [--json PATH] [--seeds 42,43,44] [--variants grpo,dr_grpo,dapo,dapo-no-sft]

Each run is the demo's spec with the variant's change (`trl.loss_type`, `sft.enabled`) and the seed
(`hyperparameters.seed`, which also draws the held-out prompts, as in `grpoflow run --set hyperparameters.seed=N`),
run through the pipeline's own stages without Prefect: the job folder as the ingest stage leaves it (resolved
spec.yaml, the dataset with its held-out split), then `grpoflow.trainers.sft` (when the warm-up is on) and
`grpoflow.trainers.grpo` as child processes started by `grpoflow.jobs.launch.run_child`, as the pipeline's tasks
start them. The held-out figures are the training child's own evaluation (`evaluation.json`'s): `before` is the model
GRPO started from (after SFT when it ran), `after` the GRPO result, the gain after - before. The table gives each
variant's mean, standard deviation and range over the seeds, and the gain's 95% interval: a paired bootstrap over the
held-out prompts of its seeds pooled (`grpoflow.core.scores.intervals`, the one a job's evaluation.json gives, on each
prompt's score before and after as `evaluation/step-N.parquet` holds it; each run keeps them, `scores`). It is a
benchmark, not a test: the figures are reported, never asserted. A result written before runs kept their prompts'
scores shows "-" for the interval.

The whole benchmark (4 variants x 3 seeds, the demo's 600 SFT and 300 GRPO steps each) takes about half an hour on a
2-core CPU. `--quick` runs one seed of 20 SFT steps and 3 GRPO steps on 8 held-out prompts: it checks the script.

    python -m benchmarks.learning --real [--quick] [--json PATH] [--seeds 42,43,44]

`--real` runs the real-model job instead: examples/smollm2.yaml (SmolLM2-135M-Instruct from its GGUF file, LoRA, no
SFT; `make demo-real` puts the file in models/) at each seed, through the same stages (the GRPO child, then the merge
and the held-out evaluation, as a LoRA job's tasks run them). Its table gives, per seed and as mean ± sd with the
range, the held-out metric before GRPO, after it (the last step), and of the checkpoint `select: best` kept (the
start model, step 0, when none beat it), the step kept, the gain of the kept model with its 95% interval (per seed over
its held-out prompts; the mean's over the seeds' prompts pooled) and the wall time (GRPO, merge,
evaluation): about 17 minutes a seed on 2 shared, busy cores. `--real --quick`
runs 2 GRPO steps on 4 held-out prompts.
"""

import json
import statistics
import time
from pathlib import Path

import yaml

from benchmarks.common import REPO_ROOT, finish, fmt, markdown_table, parser, seed_major, seeds_of

CONFIDENCE = 0.95

DEMO_SPEC = REPO_ROOT / "examples" / "arithmetic.yaml"
# variant: the changes to the demo's spec
VARIANTS = {
    "grpo": {"trl": {"loss_type": "grpo"}},
    "dr_grpo": {"trl": {"loss_type": "dr_grpo"}},
    "dapo": {"trl": {"loss_type": "dapo"}},
    "dapo-no-sft": {"trl": {"loss_type": "dapo"}, "sft": {"enabled": False}},
}
SEEDS = (42, 43, 44)
QUICK = {"sft": {"max_steps": 20}, "hyperparameters": {"max_steps": 3}, "evaluation": {"holdout": 8}}
REAL_SPEC = REPO_ROOT / "examples" / "smollm2.yaml"
REAL_QUICK = {"hyperparameters": {"max_steps": 2}, "evaluation": {"holdout": 4, "every": 1}}


def merged(base: dict, changes: dict) -> dict:
    """`base` with `changes` laid over it, section by section."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(base.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def variant_spec(variant: str, seed: int, output_root: Path, quick: bool) -> dict:
    """The demo's spec with the variant's changes and the seed (the dataset path made absolute)."""
    demo = yaml.safe_load(DEMO_SPEC.read_text())
    changes = merged(VARIANTS[variant], {"hyperparameters": {"seed": seed}, "output_uri": str(output_root)})
    spec = merged(merged(demo, QUICK) if quick else demo, changes)
    spec["name"] = f"learning-{variant.replace('_', '-')}-{seed}"
    spec["dataset"]["uri"] = str(REPO_ROOT / demo["dataset"]["uri"])
    return spec


def prepare_job(data: dict, root: Path):
    """A job folder as the pipeline's ingest stage leaves it: the resolved spec.yaml and the ingested dataset (the
    demo's, whose columns the rewards and SFT need are known to be there: no reward dry run)."""
    from grpoflow.core.jobdir import JobDir, write_text_atomic
    from grpoflow.core.spec import load_spec, to_yaml
    from grpoflow.trainers.dataset import ingest_dataset

    spec, _ = load_spec(data)
    job = JobDir(root / spec.name)
    job.root.mkdir(parents=True)
    write_text_atomic(job.spec, to_yaml(spec))
    ingest_dataset(
        spec.dataset.uri,
        job.dataset,
        prompt_column=spec.dataset.prompt_column,
        holdout=spec.evaluation.holdout,
        seed=spec.hyperparameters.seed,
    )
    return spec, job


def prompt_scores(job, evaluation: dict) -> dict[str, list]:
    """Each held-out prompt's score before GRPO and of the kept model, in held-out order, as the evaluation kept them
    (`evaluation/step-0.parquet` and the selected step's; a prompt's score the mean of its completions')."""
    from grpoflow.trainers.rollouts import read_rows, step_file

    def scores(step: int) -> list:
        each: dict[int, list] = {}
        for row in read_rows(step_file(job.evaluation_rollouts, step)):
            each.setdefault(row["row"], []).append(row["score"])
        return [_mean(v) for _, v in sorted(each.items())]

    return {"before": scores(0), "after": scores(evaluation["selected_step"] or 0)}


def _mean(values: list) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def gain_interval(runs: list[dict]) -> str:
    """The 95% interval of the runs' mean held-out gain: a paired bootstrap over their prompts pooled; "-" when a run
    kept no prompt scores (a result from before they were kept)."""
    from grpoflow.core.scores import intervals

    if not runs or any(not r.get("scores") for r in runs):
        return "-"
    before = [v for r in runs for v in r["scores"]["before"]]
    after = [v for r in runs for v in r["scores"]["after"]]
    low, high = intervals(before, after, CONFIDENCE)["gain"]
    return f"{fmt(low)} to {fmt(high)}"


def run_one(variant: str, seed: int, root: Path, quick: bool) -> dict:
    """One job: SFT (when on) and GRPO children; returns its held-out figures and stage times."""
    from grpoflow.jobs.launch import run_child

    spec, job = prepare_job(variant_spec(variant, seed, root, quick), root)
    started = time.monotonic()
    sft_s = run_child("grpoflow.trainers.sft", job, 1, "sft.log") if spec.sft.enabled else None
    grpo_s = run_child("grpoflow.trainers.grpo", job, 1, "grpo.log", result=job.training_result)
    evaluation = json.loads(job.training_result.read_text())["evaluation"]
    return {
        "variant": variant,
        "seed": seed,
        "loss_type": spec.trl.get("loss_type"),
        "sft": spec.sft.enabled,
        "metric": evaluation["metric"],
        "n": evaluation["n"],
        "before": evaluation["before"],
        "after": evaluation["after"],
        "gain": evaluation["after"] - evaluation["before"],
        "scores": prompt_scores(job, evaluation),
        "sft_s": sft_s,
        "grpo_s": grpo_s,
        "wall_s": time.monotonic() - started,
    }


def real_spec(seed: int, output_root: Path, quick: bool) -> dict:
    """The real-model example's spec at `seed` (its dataset and GGUF paths made absolute)."""
    spec = yaml.safe_load(REAL_SPEC.read_text())
    spec = merged(merged(spec, REAL_QUICK) if quick else spec, {"hyperparameters": {"seed": seed}})
    spec |= {"name": f"learning-smollm2-{seed}", "output_uri": str(output_root)}
    spec["dataset"]["uri"] = str(REPO_ROOT / spec["dataset"]["uri"])
    spec["base_model"] = str(REPO_ROOT / spec["base_model"])
    return spec


def merge_and_evaluate(job, spec) -> dict:
    """The merge and evaluate stages of a LoRA job, as their tasks run them (a LoRA job's training child leaves the
    held-out evaluation to them): the adapter merged into merged/, then scored against the start model."""
    from grpoflow.trainers.evaluate import evaluate
    from grpoflow.trainers.model.load import start_model
    from grpoflow.trainers.model.merge import merge_adapter, write_model_json

    merge_adapter(job.adapter, job.merged)
    write_model_json(job)
    return evaluate(job, spec, start_model(spec, job))


def run_real(kind: str, seed: int, root: Path, quick: bool) -> dict:
    """One real-model job (GRPO child, merge, evaluation): held-out before, at the last step and of the kept
    checkpoint."""
    from grpoflow.jobs.launch import run_child

    spec, job = prepare_job(real_spec(seed, root, quick), root)
    started = time.monotonic()
    grpo_s = run_child("grpoflow.trainers.grpo", job, 1, "grpo.log", result=job.training_result)
    evaluation = merge_and_evaluate(job, spec)
    return {
        "variant": kind,
        "seed": seed,
        "metric": evaluation["metric"],
        "n": evaluation["n"],
        "before": evaluation["before"],
        "last": evaluation["series"][-1]["score"],
        "kept": evaluation["after"],  # select: best's checkpoint, or the start model when none beat it
        "kept_step": evaluation["selected_step"],
        "gain": evaluation["after"] - evaluation["before"],
        "series": evaluation["series"],
        "scores": prompt_scores(job, evaluation),
        "grpo_s": grpo_s,
        "wall_s": time.monotonic() - started,
    }


def real_table(runs: list[dict]) -> str:
    """One row per seed, then the mean ± sd and the range of each figure over the seeds."""
    keys = ("before", "last", "kept", "gain", "wall_s")
    rows = [
        [
            r["seed"],
            *(fmt(r[k]) for k in keys[:3]),
            r["kept_step"],
            fmt(r["gain"]),
            gain_interval([r]),
            fmt(r["wall_s"]),
        ]
        for r in runs
    ]
    stats = {k: spread([r[k] for r in runs]) for k in keys}
    mean_sd = [fmt(s["mean"]) if s["sd"] is None else f"{fmt(s['mean'])} ± {fmt(s['sd'])}" for s in stats.values()]
    ranges = [f"{fmt(s['min'])} to {fmt(s['max'])}" for s in stats.values()]
    steps = ", ".join(str(r["kept_step"]) for r in runs)
    rows += [
        ["mean ± sd", *mean_sd[:3], steps, mean_sd[3], gain_interval(runs), mean_sd[4]],
        ["range", *ranges[:3], "", ranges[3], "", ranges[4]],
    ]
    metric = runs[0]["metric"] if runs else "score"
    headers = [
        "seed", f"held-out {metric} before", "after (last step)", "kept (select: best)", "step kept",
        "gain (kept - before)", f"gain {CONFIDENCE:.0%} CI", "wall s (GRPO, merge, evaluation)",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def real_main(p, args) -> dict:
    """`--real`: the real-model job over the seeds, its table and JSON."""
    spec = yaml.safe_load(REAL_SPEC.read_text())
    gguf = REPO_ROOT / spec["base_model"]
    if not gguf.is_file():
        p.error(f"--real needs {gguf.relative_to(REPO_ROOT)}: `make demo-real` fetches it (or put the file there)")
    seeds = seeds_of(args, SEEDS)
    runs = seed_major("learning-real", seeds, ["smollm2"], run_real, args.quick)
    steps = merged(spec, REAL_QUICK) if args.quick else spec
    details = {k: steps["hyperparameters"][k] for k in ("max_steps", "learning_rate", "lora_rank", "temperature")}
    return finish(
        "learning-real",
        args,
        real_table(runs),
        {"spec": str(REAL_SPEC.relative_to(REPO_ROOT)), **details, "evaluation": steps["evaluation"], "seeds": seeds,
         "runs": runs},
    )  # fmt: skip


def spread(values: list[float]) -> dict:
    return {
        "mean": statistics.mean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values),
        "max": max(values),
    }


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Each variant's mean, standard deviation and range of before, after and gain over its seeds."""
    out = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == variant]
        out[variant] = {
            "seeds": [r["seed"] for r in mine],
            **{key: spread([r[key] for r in mine]) for key in ("before", "after", "gain")},
        }
    return out


def table(summary: dict[str, dict], runs: list[dict]) -> str:
    def mean_sd(s: dict) -> str:
        return fmt(s["mean"]) if s["sd"] is None else f"{fmt(s['mean'])} ± {fmt(s['sd'])}"

    rows = []
    for variant, s in summary.items():
        gains = ", ".join(fmt(r["gain"]) for r in runs if r["variant"] == variant)
        g = s["gain"]
        mine = [r for r in runs if r["variant"] == variant]
        rows.append(
            [variant, len(s["seeds"]), mean_sd(s["before"]), mean_sd(s["after"]), mean_sd(g), gain_interval(mine),
             f"{fmt(g['min'])} to {fmt(g['max'])}", gains]
        )  # fmt: skip
    metric = runs[0]["metric"] if runs else "score"
    headers = [
        "variant", "seeds", f"held-out {metric} before (mean ± sd)", "after", "gain", f"gain {CONFIDENCE:.0%} CI",
        "gain range", "per seed",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--seeds", help="comma-separated seeds (default 42,43,44; 42 with --quick)")
    p.add_argument("--real", action="store_true", help=f"the real-model job ({REAL_SPEC.name}), not the variants")
    args = p.parse_args(argv)
    if args.real:
        return real_main(p, args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    seeds = seeds_of(args, SEEDS)
    runs = seed_major("learning", seeds, variants, run_one, args.quick)
    summary = summarize(runs)
    demo = yaml.safe_load(DEMO_SPEC.read_text())
    steps = merged(demo, QUICK) if args.quick else demo
    return finish(
        "learning",
        args,
        table(summary, runs),
        {
            "spec": str(DEMO_SPEC.relative_to(REPO_ROOT)),
            "sft_steps": steps["sft"]["max_steps"],
            "grpo_steps": steps["hyperparameters"]["max_steps"],
            "holdout": steps["evaluation"]["holdout"],
            "variants": {v: VARIANTS[v] for v in variants},
            "seeds": seeds,
            "summary": summary,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
