"""Rollout engines side by side on this machine: `generation.engine` transformers (padded `generate`) vs paged
(transformers' continuous batching, TRL's `use_transformers_continuous_batching`), same job, same seed.

    python -m benchmarks.generation [--quick]

Each side is grpoflow's training child (`python -m grpoflow.trainers.grpo`) on a fresh copy of one job folder (the
demo's arithmetic prompts, no SFT warm-up, 8 rollouts of up to 24 tokens per step), the sides alternating. The figure
is the median seconds per step after the first (TRL's own `step_time`; the first step pays one-off costs) and the
completion tokens per second. The faster engine is the one a CPU job should default to: the spec's default
(`generation.engine` in core/spec/models.py) is checked against it.
"""

import json
import shutil
from pathlib import Path

from benchmarks.common import alternate, finish, markdown_table, median, paired_ratio, parser, run_child

ENGINES = ("transformers", "paged")
SPEC = Path(__file__).resolve().parent.parent / "examples" / "arithmetic.yaml"


def prepare_job(root: Path, steps: int):
    """A job folder as the pipeline leaves it before training, its engine set per run."""
    import yaml

    from grpoflow.core.jobdir import JobDir, write_text_atomic
    from grpoflow.core.spec import load_spec, to_yaml
    from grpoflow.trainers.dataset import ingest_dataset

    data = yaml.safe_load(SPEC.read_text())
    data["dataset"]["uri"] = str(SPEC.parent / "data" / "arithmetic.jsonl")
    data["sft"] = {"enabled": False}
    data["evaluation"] = {"holdout": 0}
    data["hyperparameters"].update(max_steps=steps, rollouts_per_prompt=8, max_response_length=24)
    data["checkpoint_every"] = steps  # one save, at the end, alike for both sides
    data["output_uri"] = str(root)
    spec, _ = load_spec(data)
    job = JobDir(root / "template")
    job.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(job.spec, to_yaml(spec))
    ingest_dataset(spec.dataset.uri, job.dataset, holdout=0)
    return job, data


def run_engine(template, data: dict, engine: str, tag: str) -> dict:
    import sys

    from grpoflow.core.jobdir import JobDir, write_text_atomic
    from grpoflow.core.spec import load_spec, to_yaml
    from grpoflow.trainers.metrics import read_metrics

    job = JobDir(template.root.parent / tag)
    shutil.rmtree(job.root, ignore_errors=True)
    shutil.copytree(template.root, job.root)
    spec, _ = load_spec({**data, "generation": {"engine": engine}})
    write_text_atomic(job.spec, to_yaml(spec))
    child = run_child([sys.executable, "-m", "grpoflow.trainers.grpo", str(job.root)], job.root / "child.log")
    records = read_metrics(job.metrics)
    later = records[1:] or records
    step_s = median(r["values"].get("step_time") for r in later)
    tokens = sum(r["values"].get("completions/mean_length", 0) * 8 for r in later)
    seconds = sum(r["values"].get("step_time", 0) for r in later)
    return {
        **child,
        "step_time_s": step_s,
        "completion_tokens_per_s": tokens / seconds if seconds else None,
        "train_runtime_s": json.loads(job.training_result.read_text())["train_runtime"],
    }


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    from grpoflow.core.spec import JobSpec

    steps, repeats = (2, 1) if args.quick else (6, 3)  # quick: one step timed after the first, a check it runs
    root = Path(__import__("tempfile").mkdtemp(prefix="bench-generation-"))
    try:
        template, data = prepare_job(root, steps)
        results = alternate(
            {engine: (lambda i, e=engine: run_engine(template, data, e, f"{e}-{i}")) for engine in ENGINES}, repeats
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sides = {
        engine: {
            "step_time_s": median(r["step_time_s"] for r in runs),
            "completion_tokens_per_s": median(r["completion_tokens_per_s"] for r in runs),
            "runs": runs,
        }
        for engine, runs in results.items()
    }
    paged_vs_transformers = paired_ratio(
        [r["step_time_s"] for r in results["transformers"]], [r["step_time_s"] for r in results["paged"]]
    )  # > 1: paged is faster
    faster = "paged" if paged_vs_transformers and paged_vs_transformers > 1 else "transformers"
    default = JobSpec.model_fields["generation"].default.engine
    rows = [[engine, s["step_time_s"], s["completion_tokens_per_s"]] for engine, s in sides.items()]
    rows.append(["paged speed vs transformers (x)", paged_vs_transformers, None])
    table = markdown_table(["engine", "s/step (median, after step 1)", "completion tokens/s"], rows)
    table += f"\n\nFaster here: {faster}; the spec's default engine: {default}."
    return finish(
        "generation",
        args,
        table,
        {
            "steps": steps,
            "repeats": repeats,
            "sides": sides,
            "paged_speed_vs_transformers": paged_vs_transformers,
            "faster": faster,
            "default_engine": default,
            "target_met": faster == default,
        },
    )


if __name__ == "__main__":
    main()
