"""What every benchmark shares: the command line, alternating side-by-side runs, medians, child processes with their
own peak RSS, and the markdown table and JSON every script ends with.

Absolute times on a shared machine mean little, so each benchmark measures its baseline in the same script, in
alternating order (A B, B A, A B, ...), and reports medians and ratios.
"""

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from grpoflow.core.spec.markdown import table

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# Quiet logs for the benchmarks' own process too (they ingest and train in-process as well).
for _name, _value in (
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("HF_HUB_OFFLINE", "1"),
):
    os.environ.setdefault(_name, _value)


def parser(doc: str) -> argparse.ArgumentParser:
    """The command line every benchmark takes: `--quick` (the CI smoke mode) and `--json PATH`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few steps or rows: checks that it runs")
    p.add_argument("--json", type=Path, help="where to write the results (default: benchmarks/results/<name>.json)")
    return p


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of every benchmark child (both sides alike).

    One torch thread unless the caller set OMP_NUM_THREADS: on a small machine shared with other work, torch's
    thread pool oversubscribes the cores and steps get several times slower and erratic.
    """
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONWARNINGS": "ignore",
        **extra,
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def pin_threads() -> None:
    """Applies `bench_env`'s thread rule to this process (for benchmarks that train in-process)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def run_child(command: list[str], log: Path, env: dict | None = None, timeout: float = 1800) -> dict:
    """Runs `command` from the repository root, output to `log`; returns its wall seconds and peak RSS (MB).

    Raises `RuntimeError` with the end of the log when the child fails.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=env or bench_env())
        deadline = started + timeout
        while True:
            # wait4 gives this child's own rusage (RUSAGE_CHILDREN would be the max over every child so far).
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                raise RuntimeError(f"{' '.join(command)} ran past {timeout} s; see {log}")
            time.sleep(0.05)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{' '.join(command)} exited with {proc.returncode}:\n{tail}")
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024}


@contextlib.contextmanager
def output_to(log: Path):
    """Sends this process's stdout and stderr (prints, progress bars, warnings) to `log` while a run trains here."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


def alternate(sides: dict[str, Callable[[int], dict]], repeats: int) -> dict[str, list[dict]]:
    """Runs each side `repeats` times, alternating A B, B A, A B ... so that drift in the machine's load hits both
    sides alike; each call gets the repeat index. Returns every side's results in run order.

    Before each run, what is alive in this process (imports, and whatever earlier runs left) is collected and then
    frozen (`gc.freeze`), so that a run's garbage collections walk only the objects it makes itself and no run
    pays for the runs before it: `Trainer.train` starts with a full collection (accelerate's `free_memory`),
    which took 0.25-0.29 s in the later runs of a benchmark (3-4% of a 100-step run of the tiny model)."""
    names = list(sides)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else reversed(names):
            gc.collect()
            gc.freeze()
            results[name].append(sides[name](i))
    return results


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired_ratio(numerators: list[float], denominators: list[float]) -> float | None:
    """Median of the per-repeat ratios: the runs of one repeat ran back to back, under the same load."""
    return median([a / b for a, b in zip(numerators, denominators, strict=True) if a and b])


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    return table(headers, [[fmt(v) for v in row] for row in rows])


def machine() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1 (benchmark default)"),
    }


def finish(name: str, args, table: str, data: dict) -> dict:
    """Prints the table and writes the JSON (`--json`, else benchmarks/results/<name>.json); returns the data."""
    data = {"benchmark": name, "quick": bool(args.quick), "machine": machine(), **data, "table": table}
    path = args.json or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\n### {name}{' (quick)' if args.quick else ''}\n\n{table}\n\nJSON: {path}", file=sys.stdout)
    return data


def seeds_of(args, defaults: tuple[int, ...]) -> list[int]:
    """`--seeds` as given, else `defaults` (only the first with `--quick`)."""
    if args.seeds:
        return [int(s) for s in args.seeds.split(",")]
    return [defaults[0]] if args.quick else list(defaults)


def seed_major(name: str, seeds: list[int], kinds: list[str], run_one: Callable, quick: bool) -> list[dict]:
    """`run_one(kind, seed, folder, quick)` for every kind at every seed, seed-major (a run stopped halfway still has
    every kind at the first seeds), in a temporary folder removed afterwards."""
    runs = []
    with tempfile.TemporaryDirectory(prefix=f"grpoflow-bench-{name}-") as tmp:
        for seed in seeds:
            for kind in kinds:
                print(f"--- {kind}, seed {seed}", file=sys.stderr, flush=True)
                runs.append(run_one(kind, seed, Path(tmp), quick))
    return runs
