"""Benchmark 4: the ingest stage on a million rows (JSONL and Parquet) against pandas, rows/s and peak RSS.

    python -m benchmarks.ingest_scale [--quick] [--json PATH]

Each run is its own child process, so its peak RSS (`ru_maxrss`) is its own; the sides alternate. grpoflow's side is
the whole stage, `grpoflow.trainers.dataset.ingest_dataset`: load through `datasets`, validate with Arrow compute
(prompt column present, no null or empty prompt, `answer` present without nulls, full UTF-8 validation), save with
`save_to_disk`. pandas' side is the closest equivalent: `read_json(lines=True)` (or `read_parquet`), the same null
and empty checks, `to_parquet`. Both go from file to file, with no holdout split. Time and RSS are the stage's
own (imports excluded from the time; RSS after imports is reported beside the peak). Rows per CPU-second is
reported beside rows/s: on a machine shared with other work the wall time stretches, the CPU time much less.
"""

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import alternate, bench_env, finish, markdown_table, median, paired_ratio, parser, run_child

TARGET_ROWS_PER_S = 500_000
TARGET_PEAK_RSS_MB = 600
# rows/s against pandas, by source. JSONL: pandas' `read_json` parses in Python-heavy code, Arrow's JSON reader does
# not. Parquet: `pandas.read_parquet` *is* Arrow's reader (the one grpoflow's ingest uses for such a file), so the
# most an ingest that reads, checks and saves the same rows can be is about as fast: 1.0, not the 2.5 of JSONL (the
# target both formats had until 2026-12-06, which no Parquet ingest could meet).
TARGET_VS_PANDAS = {"jsonl": 2.5, "parquet": 1.0}


def write_sources(root: Path, rows: int) -> dict[str, Path]:
    """`rows` short arithmetic prompts with their answers, as JSONL and as Parquet."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    jsonl = root / f"prompts-{rows}.jsonl"
    with jsonl.open("w") as f:
        for start in range(0, rows, 100_000):
            f.write(
                "".join(
                    f'{{"prompt": "What is {i % 997}+{i % 89}? Answer with the number only.", '
                    f'"answer": "{i % 997 + i % 89}"}}\n'
                    for i in range(start, min(rows, start + 100_000))
                )
            )
    parquet = root / f"prompts-{rows}.parquet"
    pq.write_table(pj.read_json(jsonl), parquet)
    return {"jsonl": jsonl, "parquet": parquet}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(side: str, source: str, dest: str, result: str) -> None:
    """One side's run, in its own process: imports, then the timed stage, then its figures to `result`."""
    if side == "grpoflow":
        from grpoflow.trainers.dataset import ingest_dataset

        def stage():
            return ingest_dataset(source, Path(dest), required_columns={"answer": "reward 'exact_answer'"}).num_train
    else:
        import pandas as pd

        def stage():
            df = pd.read_parquet(source) if source.endswith(".parquet") else pd.read_json(source, lines=True)
            if df["prompt"].isna().any() or (df["prompt"].str.len() == 0).any() or df["answer"].isna().any():
                raise ValueError("null or empty prompts, or null answers")
            df.to_parquet(dest)
            return len(df)

    rss_after_import = _rss_mb()
    started, cpu_started = time.perf_counter(), time.process_time()
    rows = stage()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(result).write_text(
        json.dumps(
            {
                "rows": rows,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss_mb": peak,
                "import_rss_mb": rss_after_import,
            }
        )
    )


def run_side(side: str, source: Path, root: Path, tag: str) -> dict:
    out = root / tag
    out.mkdir()
    command = [sys.executable, "-m", "benchmarks.ingest_scale", "--child", side, str(source), str(out / "dest")]
    run_child([*command, str(out / "result.json")], out / "child.log", env=bench_env())
    r = json.loads((out / "result.json").read_text())
    return {**r, "rows_per_s": r["rows"] / r["seconds"], "rows_per_cpu_s": r["rows"] / r["cpu_seconds"]}


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--child", nargs=4, metavar=("SIDE", "SOURCE", "DEST", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    rows, repeats = (20_000, 1) if args.quick else (1_000_000, 3)
    results, table_rows = {}, []
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-") as tmp:
        root = Path(tmp)
        for fmt, source in write_sources(root, rows).items():
            runs = alternate(
                {
                    "grpoflow": lambda i, s=source, f=fmt: run_side("grpoflow", s, root, f"grpoflow-{f}-{i}"),
                    "pandas": lambda i, s=source, f=fmt: run_side("pandas", s, root, f"pandas-{f}-{i}"),
                },
                repeats,
            )
            g, pd_ = runs["grpoflow"], runs["pandas"]
            summary = {
                side: {
                    k: median(r[k] for r in runs[side])
                    for k in ("rows_per_s", "rows_per_cpu_s", "seconds", "cpu_seconds", "peak_rss_mb", "import_rss_mb")
                }
                for side in runs
            }
            ratio = paired_ratio([r["rows_per_s"] for r in g], [r["rows_per_s"] for r in pd_])
            cpu_ratio = paired_ratio([r["rows_per_cpu_s"] for r in g], [r["rows_per_cpu_s"] for r in pd_])
            s = summary["grpoflow"]
            results[fmt] = {
                **summary,
                "vs_pandas": ratio,
                "vs_pandas_cpu": cpu_ratio,
                "target_met": {
                    "rows_per_s": s["rows_per_s"] >= TARGET_ROWS_PER_S,
                    "peak_rss_mb": s["peak_rss_mb"] <= TARGET_PEAK_RSS_MB,
                    "vs_pandas": ratio >= TARGET_VS_PANDAS[fmt],
                },
                "runs": runs,
            }
            for side in ("grpoflow", "pandas"):
                t = summary[side]
                table_rows.append(
                    [
                        f"{fmt}, {side}",
                        t["rows_per_s"],
                        t["rows_per_cpu_s"],
                        t["peak_rss_mb"],
                        t["import_rss_mb"],
                        ratio if side == "grpoflow" else 1.0,
                    ]
                )
    table = markdown_table(
        ["source, side", "rows/s (wall)", "rows per CPU-s", "peak RSS MB", "RSS after imports MB", "rows/s vs pandas"],
        table_rows,
    )
    table += (
        f"\n\nTargets (grpoflow): >= {TARGET_ROWS_PER_S:,} rows/s, <= {TARGET_PEAK_RSS_MB} MB peak RSS, "
        f">= {TARGET_VS_PANDAS['jsonl']}x pandas on JSONL and {TARGET_VS_PANDAS['parquet']}x on Parquet (pandas' "
        f"Parquet reader is Arrow's own); {rows:,} rows."
    )
    return finish(
        "ingest_scale",
        args,
        table,
        {
            "rows": rows,
            "repeats": repeats,
            "targets": {
                "rows_per_s": TARGET_ROWS_PER_S,
                "peak_rss_mb": TARGET_PEAK_RSS_MB,
                "vs_pandas": TARGET_VS_PANDAS,
            },
            "formats": results,
        },
    )


if __name__ == "__main__":
    main()
