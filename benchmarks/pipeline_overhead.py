"""Benchmark 3: what the pipeline costs around training: `grpoflow run` wall time minus the training children's.

    python -m benchmarks.pipeline_overhead [--quick] [--json PATH]

Runs `grpoflow run examples/arithmetic.yaml --set sft.max_steps=N --set hyperparameters.max_steps=N --json` as a
child process and reads the job folder it leaves: the SFT and GRPO children's own wall times (startup included:
they are what running TRL by hand would cost too) from the `grpoflow.sft.completed` and
`grpoflow.training.completed` events, and every stage's boundaries from the events' timestamps. Overhead = the run's
wall time minus the two children's. Runs alternate between an ephemeral Prefect server (what `grpoflow run` starts
when PREFECT_API_URL is unset) and a Prefect server started once beforehand (PREFECT_API_URL set), so that the
server's start is reported apart. The ephemeral runs share one PREFECT_HOME whose database a first, separately
reported run created, as a user's runs after their first do; the running server, too, has served one separately
reported run before the timed ones (a server's first requests build its routes). A full fine-tune's held-out
evaluation runs inside the GRPO child (it holds the trained model); its seconds, from the event, count as overhead,
not as training.

The job is 4 steps of SFT and 4 of GRPO on the shipped example; the targets are 5 s of overhead with a running server
and 8 s with the ephemeral one (whose boot, ~5 s on a quiet machine, overlaps the pipeline's imports). `--repeats N`
runs each side N times (default 3) and reports the medians; `--quick` reports the first ephemeral run as its one
side (no server of its own).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from benchmarks.common import REPO_ROOT, alternate, bench_env, finish, markdown_table, median, parser, run_child

# The CLI overhead of `grpoflow run` for a 4-step job: what a user waits beyond the training children.
STEPS = 4
TARGET_OVERHEAD_S = {"running Prefect server": 5.0, "ephemeral Prefect": 8.0}
SPEC = REPO_ROOT / "examples" / "arithmetic.yaml"
# Each stage ends at an event (in pipeline order) and starts at the previous one the job emitted; the run starts at
# the process start and ends at its exit. A full fine-tune emits no adapter.merged: its merge falls in the next stage.
STAGES = {
    "grpoflow.job.started": "CLI start, Prefect start, flow run, job folder",
    "grpoflow.dataset.ingested": "ingest + reward dry-run",
    "grpoflow.sft.completed": "SFT task",
    "grpoflow.training.completed": "GRPO task",
    "grpoflow.adapter.merged": "merge (LoRA jobs)",
    "grpoflow.job.completed": "merge (full fine-tune), held-out evaluation, report",
    "end": "webhook flush, Prefect shutdown, exit",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path) -> tuple[subprocess.Popen, str]:
    """A Prefect server on loopback with its own PREFECT_HOME; returns the process and its API URL once healthy."""
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    env = bench_env(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    log = (home / "server.log").open("wb")
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            time.sleep(1)
    stop_server(proc)
    raise RuntimeError(f"the Prefect server did not start in 300 s; see {home / 'server.log'}")


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_pipeline(root: Path, tag: str, steps: int, api_url: str | None, home: Path) -> dict:
    out = root / tag
    extra = {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if api_url:
        extra["PREFECT_API_URL"] = api_url
    env = bench_env(**extra)
    if not api_url:
        env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "grpoflow.flows.cli", "run", str(SPEC), "--json", "--output-uri", str(out)]
    command += ["--set", f"sft.max_steps={steps}", "--set", f"hyperparameters.max_steps={steps}"]
    started = datetime.now().astimezone()
    child = run_child(command, out / "run.log", env=env)
    lines = (out / "run.log").read_text().splitlines()
    result = json.loads(next(line for line in reversed(lines) if line.startswith('{"job_id"')))
    events = [json.loads(line) for line in (Path(result["output_dir"]) / "events.jsonl").read_text().splitlines()]
    return {**child, **breakdown(events, started, child["wall_s"])}


def breakdown(events: list[dict], started: datetime, wall_s: float) -> dict:
    """Stage times from the events' timestamps, the children's own wall times, and the overhead."""
    at, payload = {"end": wall_s}, {}
    for e in events:
        at.setdefault(e["event"], (datetime.fromisoformat(e["occurred"]) - started).total_seconds())
        payload[e["event"]] = e.get("payload") or {}
    stages, previous = {}, 0.0
    for event, label in STAGES.items():
        if event in at:
            stages[label], previous = at[event] - previous, at[event]
    sft_child = payload.get("grpoflow.sft.completed", {}).get("seconds", 0.0)
    training = payload["grpoflow.training.completed"]
    train_child = training["wall_seconds"]
    # A full fine-tune is scored on the held-out prompts by the GRPO child itself, after training: that is not
    # training, so it counts as overhead here, as it did when the evaluation task ran it.
    evaluation_in_child = (training.get("evaluation") or {}).get("seconds", 0.0)
    stages["held-out evaluation (inside the GRPO child)"] = evaluation_in_child
    return {
        "sft_child_s": sft_child,
        "train_child_s": train_child,
        "evaluation_in_child_s": evaluation_in_child,
        "overhead_s": wall_s - sft_child - train_child + evaluation_in_child,
        "stages_s": stages,
    }


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of runs, 1 or more")
    return int(text)


def main(argv=None) -> dict:
    p = parser(__doc__)
    # Three runs a side by default: their median stands one outlier (runs scatter by ~1 s on a 2-core machine).
    p.add_argument("--repeats", type=_at_least_one, default=3, help="runs a side, their median reported (default 3)")
    args = p.parse_args(argv)
    steps, repeats = STEPS, 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory(prefix="grpoflow-bench-") as tmp:
        root = Path(tmp)
        # A first run creates the Prefect database in its PREFECT_HOME (once per machine for a user): measured
        # apart, untimed for the medians; the ephemeral runs then use that home, as a user's later runs do.
        home = root / "ephemeral-home"
        first_run = run_pipeline(root, "ephemeral-first", steps, None, home)
        modes = {"ephemeral Prefect": lambda i: run_pipeline(root, f"ephemeral-{i}", steps, None, home)}
        server, server_start_s, first_run_served = None, None, None
        try:
            if not args.quick:  # the quick mode only checks that the script runs: no server of its own
                server_started = time.perf_counter()
                server, url = start_server(root / "server-home")
                server_start_s = time.perf_counter() - server_started
                server_home = root / "server-home"
                # A server that has served a run, as a running server has: its first requests build FastAPI's
                # routes and SQLAlchemy's statements (~0.6 s), once per server. Measured apart, like the first run.
                first_run_served = run_pipeline(root, "server-first", steps, url, server_home)
                modes["running Prefect server"] = lambda i: run_pipeline(root, f"server-{i}", steps, url, server_home)
            # The quick mode's one side is its first run: it only checks that the script runs, and stays one
            # pipeline run long in the suite (tests/benchmarks/test_quick.py).
            runs = {"ephemeral Prefect": [first_run]} if args.quick else alternate(modes, repeats)
        finally:
            if server is not None:
                stop_server(server)
    sides = {}
    for name, side in runs.items():
        sides[name] = {
            key: median(r[key] for r in side)
            for key in ("wall_s", "sft_child_s", "train_child_s", "evaluation_in_child_s", "overhead_s", "peak_rss_mb")
        }
        sides[name]["stages_s"] = {
            label: median(r["stages_s"].get(label) for r in side)
            for label in [*STAGES.values(), "held-out evaluation (inside the GRPO child)"]
        }
        sides[name]["target_overhead_s"] = TARGET_OVERHEAD_S[name]
        sides[name]["target_met"] = sides[name]["overhead_s"] <= TARGET_OVERHEAD_S[name]
    rows = []
    for name, s in sides.items():
        rows.append(
            [name, s["wall_s"], s["sft_child_s"], s["train_child_s"], s["overhead_s"], f"<= {TARGET_OVERHEAD_S[name]}"]
        )
    table = markdown_table(
        ["Prefect", "grpoflow run wall s", "SFT child s", "GRPO child s", "overhead s", "target"], rows
    )
    labels = [*STAGES.values(), "held-out evaluation (inside the GRPO child)"]
    stage_rows = [[label, *(s["stages_s"][label] for s in sides.values())] for label in labels]
    table += "\n\n" + markdown_table(["stage (from event timestamps), s", *sides], stage_rows)
    table += (
        "\n\nFirst run on a fresh PREFECT_HOME (Prefect creates its database): "
        f"overhead {first_run['overhead_s']:.1f} s (not in the medians)."
    )
    if first_run_served is not None:
        table += (
            " First run against the just-started server (its first requests): "
            f"overhead {first_run_served['overhead_s']:.1f} s (not in the medians)."
        )
    return finish(
        "pipeline_overhead",
        args,
        table,
        {
            "steps": steps,
            "repeats": repeats,
            "prefect_server_start_s": server_start_s,
            "first_run_fresh_prefect_home": first_run,
            "first_run_started_server": first_run_served,
            "target_overhead_s": TARGET_OVERHEAD_S,
            "sides": sides,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
