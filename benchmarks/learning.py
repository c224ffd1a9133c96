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
variant's mean, standard deviation and range over the seeds. It is a benchmark, not a test: the figures are reported,
never asserted.

The whole benchmark (4 variants x 3 seeds, the demo's 600 SFT and 300 GRPO steps each) takes about half an hour on a
2-core CPU. `--quick` runs one seed of 20 SFT steps and 3 GRPO steps on 8 held-out prompts: it checks the script.
"""

import json
import statistics
import time
from pathlib import Path

import yaml

from benchmarks.common import REPO_ROOT, finish, fmt, markdown_table, parser, seed_major, seeds_of

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
    from grpoflow.trainers.dataset import ingest_dataset
    from grpoflow.trainers.jobdir import JobDir, write_text_atomic
    from grpoflow.trainers.spec import load_spec, to_yaml

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
        "sft_s": sft_s,
        "grpo_s": grpo_s,
        "wall_s": time.monotonic() - started,
    }


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
        rows.append(
            [variant, len(s["seeds"]), mean_sd(s["before"]), mean_sd(s["after"]), mean_sd(g),
             f"{fmt(g['min'])} to {fmt(g['max'])}", gains]
        )  # fmt: skip
    metric = runs[0]["metric"] if runs else "score"
    headers = ["variant", "seeds", f"held-out {metric} before (mean ± sd)", "after", "gain", "gain range", "per seed"]
    return markdown_table(headers, rows)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--seeds", help="comma-separated seeds (default 42,43,44; 42 with --quick)")
    args = p.parse_args(argv)
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
