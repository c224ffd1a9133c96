"""Benchmark 8: held-out scores during training (`evaluation.every`), when the reward and the held-out metric disagree.

    python -m benchmarks.held_out [--quick] [--json PATH] [--seeds 1,2,3] [--kinds gamed,honest]

Two jobs per seed, each through the pipeline's own stages without Prefect (the ingested job folder, then the SFT and
GRPO children, as in benchmarks/learning.py):

- `gamed`: examples/held-out.yaml. GRPO is paid for the sentence form alone (`answer_format` with the pattern
  "The answer is N."), the held-out metric is `exact_answer` (the bare, right number), scored every 5 steps, and
  `select: best` keeps the best-scoring checkpoint, weighing the start (step 0) too. The table gives the held-out
  score of the start (before GRPO), of the kept model (never below the start's: step 0 when nothing beat it) and of
  the last step, the step kept, the alerts (`held_out_divergence` with its step; `no_improvement` where nothing beat
  the start) and whether the default promotion gate (`evaluation.gate.min_gain: 0`) withholds the publish.
- `honest`: the demo (examples/arithmetic.yaml) with `evaluation.every: 10` and `select: best`: the reward is the
  metric, so the alert should stay silent; and the cost of the evaluations: seconds per evaluation (greedy
  completions of the 40 held-out prompts and their scores, `eval/seconds` in metrics.jsonl) and their share of TRL's
  train_runtime.

The alerts are the health monitor's (`HealthMonitor.for_spec`) over each job's metrics.jsonl, as the training task
raises them live, and the evaluation's `no_improvement` (`no_improvement_alert`, as the evaluate task raises it); the
publish decision is the gate task's (`grpoflow.jobs.registry.gate_decision`, nothing deployed yet). Reported, never
asserted. The whole run (3 seeds) takes about 8 minutes on a 2-core CPU; `--quick`
runs one seed of each with 10 SFT and 4 GRPO steps on 8 held-out prompts: it checks the script.
"""

import json
import statistics
import time
from pathlib import Path

import yaml

from benchmarks.common import REPO_ROOT, finish, fmt, markdown_table, parser, seed_major, seeds_of
from benchmarks.learning import merged, prepare_job

SPECS = {"gamed": REPO_ROOT / "examples" / "held-out.yaml", "honest": REPO_ROOT / "examples" / "arithmetic.yaml"}
CHANGES = {"gamed": {}, "honest": {"evaluation": {"every": 10, "select": "best"}, "checkpoint_every": None}}
SEEDS = (1, 2, 3)
QUICK = {"sft": {"max_steps": 10}, "hyperparameters": {"max_steps": 4}, "evaluation": {"holdout": 8, "every": 2}}


def job_spec(kind: str, seed: int, root: Path, quick: bool) -> dict:
    """The kind's spec with its changes, the seed (which also draws the held-out prompts) and the output root."""
    base = yaml.safe_load(SPECS[kind].read_text())
    spec = merged(base, CHANGES[kind])
    spec = merged(spec, QUICK) if quick else spec
    spec = merged(spec, {"hyperparameters": {"seed": seed}, "output_uri": str(root)})
    spec["name"] = f"held-out-{kind}-{seed}"
    spec["dataset"]["uri"] = str(REPO_ROOT / base["dataset"]["uri"])
    return spec


def run_one(kind: str, seed: int, root: Path, quick: bool) -> dict:
    """One job: SFT and GRPO children (the GRPO child evaluates this full fine-tune itself), then `job_row`."""
    from grpoflow.jobs.launch import run_child

    spec, job = prepare_job(job_spec(kind, seed, root, quick), root)
    started = time.monotonic()
    run_child("grpoflow.trainers.sft", job, 1, "sft.log")
    run_child("grpoflow.trainers.grpo", job, 1, "grpo.log", result=job.training_result)
    return {"kind": kind, "seed": seed, **job_row(spec, job), "wall_s": time.monotonic() - started}


def job_row(spec, job) -> dict:
    """A trained job folder's figures: its held-out series, start and kept scores, the step kept, the alerts, the
    gate's decision and the evaluations' cost."""
    from grpoflow.core.scores import EVAL_SECONDS
    from grpoflow.jobs.registry import gate_decision
    from grpoflow.trainers.evaluate import no_improvement_alert
    from grpoflow.trainers.health import HealthMonitor
    from grpoflow.trainers.metrics import read_metrics

    training = json.loads(job.training_result.read_text())
    evaluation = training["evaluation"]
    records = read_metrics(job.metrics)
    alerts = HealthMonitor.for_spec(spec).check(records)
    alerts += [alert] if (alert := no_improvement_alert(evaluation)) else []
    divergence = next((a.step for a in alerts if a.kind == "held_out_divergence"), None)
    gate = gate_decision(evaluation, spec.evaluation.gate, None)
    eval_seconds = [r["values"][EVAL_SECONDS] for r in records if EVAL_SECONDS in r["values"]]
    return {
        "metric": evaluation["metric"],
        "n": evaluation["n"],
        "before": evaluation["before"],
        "kept": evaluation["after"],
        "kept_step": evaluation["selected_step"],
        "trained": evaluation.get("trained"),  # the best checkpoint's step and score, where the start was kept
        "last": evaluation["series"][-1]["score"],
        "series": evaluation["series"],
        "divergence_step": divergence,
        "alerts": [a.kind for a in alerts],
        "note": evaluation.get("note"),
        "publish_withheld": not gate["promote"],
        "gate": gate["reason"],
        "evaluations": len(eval_seconds),
        "eval_s_each": statistics.mean(eval_seconds) if eval_seconds else None,
        "eval_share_of_train_runtime": sum(eval_seconds) / training["train_runtime"] if eval_seconds else None,
    }


def mean(runs: list[dict], key: str) -> float | None:
    """The mean of `key` over the runs that have it."""
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.mean(values) if values else None


def alerts_cell(run: dict) -> str:
    """The run's alerts, once each, the divergence alert with its step."""
    kinds = list(dict.fromkeys(run["alerts"]))
    return ", ".join(f"{k} (step {run['divergence_step']})" if k == "held_out_divergence" else k for k in kinds) or "—"


def table(runs: list[dict]) -> str:
    rows = [
        [r["kind"], r["seed"], fmt(r["before"]), fmt(r["kept"]), r["kept_step"],
         fmt(r["trained"]["score"]) if r.get("trained") else "—", fmt(r["last"]), alerts_cell(r),
         "withheld" if r["publish_withheld"] else "published", r["evaluations"], fmt(r["eval_s_each"]),
         fmt(r["eval_share_of_train_runtime"])]
        for r in runs
    ]  # fmt: skip
    metric = runs[0]["metric"] if runs else "score"
    headers = [
        "job", "seed", f"held-out {metric}: start", "kept", "step kept", "best checkpoint (start kept)", "last step",
        "alerts", "publish (default gate)", "evaluations", "s each", "share of train_runtime",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--seeds", help="comma-separated seeds (default 1,2,3; 1 with --quick)")
    p.add_argument("--kinds", default=",".join(SPECS), help="comma-separated jobs to run (default gamed,honest)")
    args = p.parse_args(argv)
    seeds, kinds = seeds_of(args, SEEDS), args.kinds.split(",")
    if unknown := set(kinds) - set(SPECS):
        p.error(f"--kinds: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SPECS)}")
    runs = seed_major("held-out", seeds, kinds, run_one, args.quick)
    gamed = [r for r in runs if r["kind"] == "gamed"]
    honest = [r for r in runs if r["kind"] == "honest"]
    summary = {
        "gamed_kept_mean": mean(gamed, "kept"),
        "gamed_last_mean": mean(gamed, "last"),
        "gamed_alerted": sum(r["divergence_step"] is not None for r in gamed),
        "kept_below_start": sum(r["kept"] < r["before"] for r in runs if None not in (r["kept"], r["before"])),
        "start_kept": sum(r["kept_step"] == 0 for r in runs),
        "start_kept_alerted": sum(r["kept_step"] == 0 and "no_improvement" in r["alerts"] for r in runs),
        "publish_withheld": sum(r["publish_withheld"] for r in runs),
        "honest_alerted": sum(r["divergence_step"] is not None for r in honest),
        "eval_s_each": mean(honest, "eval_s_each"),
        "eval_share_of_train_runtime": mean(honest, "eval_share_of_train_runtime"),
    }
    return finish(
        "held_out",
        args,
        table(runs),
        {"specs": {k: str(SPECS[k].relative_to(REPO_ROOT)) for k in kinds}, "changes": CHANGES, "seeds": seeds,
         "summary": summary, "runs": runs},
    )  # fmt: skip


if __name__ == "__main__":
    main()
