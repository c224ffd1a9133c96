"""Runs every benchmark (`make bench`), one after the other, and prints a summary table against the targets.

    python -m benchmarks.run [--quick] [--only trainer_vs_trl,ingest_scale,...] [--from-results]

Each benchmark runs as its own child process (`python -m benchmarks.<name>`), never beside another, and writes
benchmarks/results/<name>.json; this script adds benchmarks/results/summary.json. The GPU benchmark runs only where
CUDA is available. No figure here is an absolute time that could be compared across machines: each is a ratio
against a baseline measured in the same script, or a difference within one run.
"""

import json
import subprocess
import sys

from benchmarks.common import REPO_ROOT, RESULTS_DIR, bench_env, fmt, markdown_table, parser
from benchmarks.real_vs_trl import GGUF
from benchmarks.trainer_vs_trl import where_time_goes, with_range

BENCHMARKS = [
    "trainer_vs_trl",
    "real_vs_trl",
    "skip_zero_variance",
    "pipeline_overhead",
    "ingest_scale",
    "cost_growth",
    "generation",
    "graders",
    "sandbox",
    "rollouts",
    "canary",
    "gpu",
]


def ranged(side: dict) -> str:
    """A side's CPU-time ratio with the range of its alternating pairs: `0.921 [0.86-1.04]`."""
    low, high = side["cpu_steps_per_s_ratio_range"]
    return f"{fmt(side['cpu_steps_per_s_ratio'])} [{fmt(low)}-{fmt(high)}]"


def trainer_vs_trl_rows(name: str, r: dict) -> list[list]:
    """trainer_vs_trl's figures: the pairs' ratios (reported) and the ratios the within-run time shares imply
    (judged, like for like; see benchmarks.trainer_vs_trl). Results before 2026-12-06 judged the pairs."""
    target = f">= {r['target_ratio']}"
    by_shares = r.get("judged_by") == "where_time_goes"
    sides = r["in_process"]["sides"]
    rows = []
    for side, s in sides.items():
        if side.startswith("trl"):
            continue
        judged = not by_shares and side in r["target_met"]
        rows.append([name, f"steps/s vs TRL (CPU time, pairs), {side}", ranged(s),
                     *([target, r["target_met"][side]] if judged else ["report", ""])])  # fmt: skip
        if "vs_trl_same_checkpoints" in s:
            same, label = s["vs_trl_same_checkpoints"], f"{side} vs TRL with the same checkpoint schedule"
            met = same["cpu_steps_per_s_ratio"] >= r["target_ratio"]
            rows.append([name, f"steps/s (CPU time, pairs), {label}", ranged(same),
                         *(["report", ""] if by_shares else [target, met])])  # fmt: skip
    for side, v in r.get("where_time_goes", {}).items():
        if side.startswith("trl"):
            continue
        baseline = v.get("baseline") or "trl"
        key = side if baseline == "trl" else f"{side} vs {baseline}"
        label = f"steps/s implied by time shares in the run, {side} vs {baseline}"
        rows.append([name, label, v["implied"], *([target, r["target_met"][key]] if by_shares else ["", ""])])
    return [*rows, [name, "startup vs TRL (child processes, wall)", r["startup"]["ratio"], "", ""]]


def summary_rows(name: str, r: dict) -> list[list]:
    """The headline figures of one benchmark's JSON: [benchmark, figure, value, target, met]."""
    if name == "trainer_vs_trl":
        return trainer_vs_trl_rows(name, r)
    if name == "held_out":
        s = r["summary"]
        return [
            [name, "held-out score of the kept (best) checkpoint, gamed reward (mean)", s["gamed_kept_mean"], "", ""],
            [name, "held-out score of the last step, gamed reward (mean)", s["gamed_last_mean"], "", ""],
            [name, "divergence alerts, gamed / honest reward (jobs)", f"{s['gamed_alerted']} / {s['honest_alerted']}",
             "", ""],
            [name, "seconds per held-out evaluation (demo)", s["eval_s_each"], "report", ""],
        ]  # fmt: skip
    if name == "graders":
        s, seconds, difference = (
            r["summary"],
            r["summary"]["seconds"]["graders run"],
            r["summary"]["max_score_difference"],
        )
        return [
            [
                name,
                f"graders run: seconds, {s['rows']:,} rows x {s['graders']} graders",
                seconds,
                "< 60",
                seconds < 60,
            ],
            [name, "graders run vs the libraries called directly (x, wall)", s["vs_libraries"], "report", ""],
            [name, "largest score difference vs the libraries", difference, "0", difference == 0],
        ]
    if name == "sandbox":
        return [
            [name, f"python grader: ms the sandbox adds to a call of {n}", ms, "report", ""]
            for n, ms in r["sandbox_extra_ms"].items()
        ]
    if name == "rollouts":
        return [
            [name, f"in-loop share of a step (every 1) {w}", s["every_1"]["in_loop_share"], "< 0.02", s["target_met"]]
            for w, s in r["workloads"].items()
        ]  # fmt: skip
    if name == "canary":
        rows = []
        for shape, s in r["shapes"].items():
            if "projection_ratios" not in s:  # results before 2026-12-06: one pair, against the run as it was
                rows.append([name, f"canary's projection / the run's train_runtime, {shape}", s["projection_ratio"],
                             "0.75-1.25", abs(s["projection_ratio"] - 1) <= r["target"]])  # fmt: skip
                continue
            rows += [
                [name, f"canary's projection / a full-length run's train_runtime (median of {s['repeats']} pairs), "
                 f"{shape}", s["projection_ratio"], "0.75-1.25", abs(s["projection_ratio"] - 1) <= r["target"]],
                [name, f"canary's projection / the run as is (upper bound; mean length {fmt(s['mean_length_share'])} "
                 f"of max), {shape}", s["as_is_projection_ratio"], "report", ""],
            ]  # fmt: skip
        cost = r["median_canary_seconds"]
        return [*rows, [name, "seconds the canary adds to a job (median, tiny model)", cost, "report", ""]]
    if name == "real_vs_trl":
        sides = r["in_process"]["sides"]
        label = f"steps/s vs TRL (CPU time), SmolLM2-135M-Instruct LoRA, {r['steps']} steps x {r['repeats']} pairs"
        implied = where_time_goes(sides, {"grpoflow": "trl"})["grpoflow"]["implied"]
        return [
            [name, label, ranged(sides["grpoflow"]), f">= {r['target_ratio']}", r["target_met"]],
            [name, "steps/s vs TRL implied by time shares in the run, SmolLM2-135M-Instruct LoRA", implied, "", ""],
        ]
    if name == "skip_zero_variance":
        rows = []
        for w, s in r["workloads"].items():
            ratio = with_range(s["skip_vs_grpoflow"], s["skip_vs_grpoflow_range"])
            if s["judged"] == "skip_vs_grpoflow":
                rows.append(
                    [name, f"steps/s, skip on vs off (CPU time), {w}", ratio, f">= {s['target']}", s["target_met"]]
                )
            else:  # nothing to skip: the check's own share of the step is judged, the pairs' ratio reported
                rows += [
                    [name, f"the skip's check, share of Trainer.train (CPU), {w}", s["skip_check_share"],
                     f"<= {s['target']}", s["target_met"]],
                    [name, f"steps/s, skip on vs off (CPU time), {w}", ratio, "report", ""],
                ]  # fmt: skip
        return rows
    if name == "pipeline_overhead":
        return [
            [name, f"overhead s, {mode}", s["overhead_s"], f"<= {s['target_overhead_s']}", s["target_met"]]
            for mode, s in r["sides"].items()
        ]
    if name == "ingest_scale":
        rows, t = [], r["targets"]
        for f, s in r["formats"].items():
            g = s["grpoflow"]
            rows += [
                [name, f"{f}: rows/s", g["rows_per_s"], f">= {t['rows_per_s']:,}", s["target_met"]["rows_per_s"]],
                [
                    name,
                    f"{f}: peak RSS MB",
                    g["peak_rss_mb"],
                    f"<= {t['peak_rss_mb']}",
                    s["target_met"]["peak_rss_mb"],
                ],
                [
                    name,
                    f"{f}: rows/s vs pandas",
                    s["vs_pandas"],
                    f">= {vs_pandas(t, f)}",
                    s["target_met"]["vs_pandas"],
                ],
            ]
        return rows
    if name == "cost_growth":
        return [
            [name, "R^2 of step time ~ K x L", r["fit_K_x_L"]["r2"], "report", ""],
            [name, "R^2 of step time ~ L + K x L", r["fit_L_and_K_x_L"]["r2"], "report", ""],
        ]
    if name == "generation":
        faster, default = r["faster"], r["default_engine"]
        return [
            [name, "paged speed vs transformers (x, s/step)", r["paged_speed_vs_transformers"], "report", ""],
            [name, f"default engine ({default}) is the faster here ({faster})", None, "yes", r["target_met"]],
        ]
    if name == "gpu":
        return [
            [name, f"steps/s vs TRL, {mode}", m["sides"]["grpoflow"]["steps_per_s_ratio"], ">= 0.97", ""]
            for mode, m in r["modes"].items()
        ]
    return []


def vs_pandas(targets: dict, fmt: str) -> float:
    """ingest_scale's target against pandas for one source format (one figure for both before 2026-12-06)."""
    t = targets["vs_pandas"]
    return t[fmt] if isinstance(t, dict) else t


def summary_table(results: dict[str, dict], skipped: list[list] = ()) -> str:
    """The summary table of every benchmark's JSON in `results` (by name, in `BENCHMARKS`' order), then the rows of
    those that did not run (`skipped`)."""
    rows = [row for name in BENCHMARKS if name in results for row in summary_rows(name, results[name])]
    return markdown_table(["benchmark", "figure", "value", "target", "met"], [*rows, *skipped])


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--only", help="comma-separated benchmark names (default: all)")
    p.add_argument("--from-results", action="store_true", help="run nothing: summarize benchmarks/results/*.json")
    args = p.parse_args(argv)
    names = [n for n in (args.only.split(",") if args.only else BENCHMARKS) if n]
    import torch

    results, skipped, failed = {}, [], []
    for name in names:
        if name == "real_vs_trl" and not GGUF.is_file():
            gguf = GGUF.relative_to(REPO_ROOT)
            skipped.append([name, f"skipped: no {gguf} (`make {gguf}` downloads it)", None, "", ""])
            continue
        if name == "gpu" and not torch.cuda.is_available():
            skipped.append([name, "skipped: no CUDA GPU here (run `python -m benchmarks.gpu` on one)", None, "", ""])
            continue
        if (code := run_one(name, args)) != 0:
            failed.append(name)
            skipped.append([name, f"FAILED (exit code {code})", None, "", ""])
            continue
        results[name] = json.loads((RESULTS_DIR / f"{name}.json").read_text())
    table = summary_table(results, skipped)
    print(f"\n## Summary{' (quick)' if args.quick else ''}\n\n{table}\n")
    for name, r in results.items():
        print(f"### {name}\n\n{r['table']}\n")
    summary = {"quick": args.quick, "benchmarks": list(results), "skipped": skipped, "table": table, "failed": failed}
    (RESULTS_DIR / "summary.json").write_text(json.dumps(summary, indent=2))
    return 1 if failed else 0


def run_one(name: str, args) -> int:
    """Runs benchmark `name` in a child process into benchmarks/results/NAME.json (with --from-results: only looks
    for that file); returns its exit code."""
    path = RESULTS_DIR / f"{name}.json"
    if args.from_results:
        return 0 if path.exists() else 1
    command = [sys.executable, "-m", f"benchmarks.{name}", "--json", str(path), *(["--quick"] if args.quick else [])]
    print(f"--- {' '.join(command[1:])}", flush=True)
    return subprocess.run(command, cwd=REPO_ROOT, env=bench_env()).returncode


if __name__ == "__main__":
    sys.exit(main())
