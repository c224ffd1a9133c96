"""Evaluation suites (`evaluation.suites`): inspect-ai tasks run on the model GRPO started from and on the kept model
(`merged/`), after the held-out evaluation, each through inspect-ai's `hf/` provider (transformers, the model loaded
from its folder once for all suites), greedy, up to `evaluation.max_new_tokens` per answer. Every metric of both
models goes to `suites.json` (and the report); inspect-ai's own logs of each run to `suites/`, where `inspect view
--log-dir <job>/suites` reads them. Needs the evals extra: `pip install grpoflow[evals]`.

    python -m grpoflow.trainers.suites runs/<job_id>

`suite_problems` is what the preflight checks before any model loads: the extra is installed, each file exists and
defines its task (inspect-ai reads the file's `@task` functions without running it).
"""

import argparse
import sys
import threading
import time
from pathlib import Path

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec, load_spec
from grpoflow.trainers.model.load import start_model

EXTRA = "pip install 'grpoflow[evals]'"
# One job's suites at a time in a process: a sweep's jobs evaluate in threads of one process, and inspect-ai keeps
# process-wide state (its model registry, the running eval's context).
_RUNNING = threading.Lock()
# inspect-ai's metric of a metric's spread (the `± x` beside a score), not a score of its own.
SPREAD = "stderr"


def suite_problems(spec: JobSpec) -> list[str]:
    """What stops `evaluation.suites` from running, one line each naming its entry; empty when nothing does.

    Args:
        spec (`JobSpec`): the job spec.
    """
    if not spec.evaluation.suites:
        return []
    try:
        from inspect_ai import list_tasks
    except ImportError:
        return [f"evaluation.suites: inspect-ai is not installed here; install grpoflow's evals extra: {EXTRA}"]
    problems = []
    for i, suite in enumerate(spec.evaluation.suites):
        where = f"evaluation.suites[{i}].inspect"
        if not suite.file.is_file():
            problems.append(f"{where}: {suite.file} is not a file; give the path of the task's Python file")
            continue
        file = suite.file.resolve()
        names = sorted({t.name for t in list_tasks(file.name, root_dir=file.parent)})  # a glob under root_dir
        if suite.task not in names:
            found = ", ".join(names) if names else "none (a task is a function decorated with @task)"
            problems.append(f"{where}: {suite.file} has no task {suite.task!r}; its tasks: {found}")
    return problems


def run_suites(job: JobDir, spec: JobSpec, start: str) -> dict | None:
    """Runs every suite on `start` and on `job.merged` and writes `suites.json`; None without suites.

    Args:
        job (`JobDir`): the job (merged/ holds the kept model; inspect-ai's logs go to suites/).
        spec (`JobSpec`): the job's spec (`evaluation.suites`, `evaluation.max_new_tokens`).
        start (`str`): the folder (or Hub id, from the cache) of the model GRPO started from.

    Returns:
        `dict`: `{"suites": [{"suite", "samples", "metrics": [{"scorer", "metric", "start", "kept", "change"}],
        "logs": {"start", "kept"}, "error"}], "seconds"}`.
    """
    if not spec.evaluation.suites:
        return None
    started = time.monotonic()
    with _RUNNING:
        runs = {side: _evaluate(job, spec, side, m) for side, m in (("start", start), ("kept", str(job.merged)))}
    result = {
        "suites": [
            _compare(suite.inspect, runs["start"][i], runs["kept"][i])
            for i, suite in enumerate(spec.evaluation.suites)
        ],
        "seconds": round(time.monotonic() - started, 3),
    }
    write_json_atomic(job.suites, result)
    return result


def _evaluate(job: JobDir, spec: JobSpec, side: str, model_path: str) -> list[dict]:
    """Each suite's run on one model: `{"samples", "metrics": {(scorer, metric): value}, "log", "error"}`."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelInfo, get_model, set_model_info

    from grpoflow.trainers.model.load import torch_dtype

    name = f"hf/{job.job_id}/{side}"
    # Registered so that inspect-ai never looks the made-up name up on the Hub (it would load "<job_id>/<side>").
    set_model_info(name, ModelInfo(context_length=_context_length(model_path)))
    job.suite_logs.mkdir(exist_ok=True)
    runs = []
    with get_model(name, model_path=model_path, do_sample=False, dtype=torch_dtype(), memoize=False) as model:
        for suite in spec.evaluation.suites:
            try:
                (log,) = inspect_eval(
                    str(suite.file.resolve()) + "@" + suite.task,
                    model=model,
                    log_dir=str(job.suite_logs),
                    display="none",
                    max_tokens=spec.evaluation.max_new_tokens,
                    seed=spec.hyperparameters.seed,
                )
            except Exception as e:  # the suite's own code (its dataset, its scorer) failed: its row says so
                runs.append({"samples": 0, "metrics": {}, "log": None, "error": f"{type(e).__name__}: {e}"})
                continue
            runs.append(_run(job, log))
    return runs


def _context_length(model_path: str) -> int | None:
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)


def _run(job: JobDir, log) -> dict:
    """What one inspect-ai log says: its samples, each scorer's metrics, where it lies, its error."""
    metrics = {}
    if log.status == "success" and log.results:
        for scores in log.results.scores:
            metrics |= {(scores.name, key): metric.value for key, metric in scores.metrics.items()}
    return {
        "samples": log.results.total_samples if log.results else 0,
        "metrics": metrics,
        "log": str(Path(log.location).relative_to(job.root)) if log.location else None,
        "error": None if log.status == "success" else (log.error.message if log.error else log.status),
    }


def _compare(suite: str, start: dict, kept: dict) -> dict:
    """One suite's entry of suites.json: each metric of both models and the change; a spread beside its score."""
    metrics = []
    for scorer, metric in dict.fromkeys([*start["metrics"], *kept["metrics"]]):
        if metric == SPREAD:
            continue
        before, after = start["metrics"].get((scorer, metric)), kept["metrics"].get((scorer, metric))
        row = {"scorer": scorer, "metric": metric, "start": before, "kept": after}
        row["change"] = after - before if before is not None and after is not None else None
        spreads = {side: run["metrics"].get((scorer, SPREAD)) for side, run in (("start", start), ("kept", kept))}
        if any(v is not None for v in spreads.values()):
            row[SPREAD] = spreads
        metrics.append(row)
    return {
        "suite": suite,
        "samples": kept["samples"] or start["samples"],
        "metrics": metrics,
        "logs": {"start": start["log"], "kept": kept["log"]},
        "error": start["error"] or kept["error"],
    }


def suite_rows(suites: dict | None) -> list[dict]:
    """suites.json as the report's and the artifact's table: one row per suite and metric (suite, metric, start,
    kept, change), a failed suite's error in its row."""
    rows = []
    for entry in (suites or {}).get("suites", []):
        if entry["error"]:
            rows.append({"suite": entry["suite"], "metric": f"failed: {entry['error']}"[:300], "start": None,
                         "kept": None, "change": None})  # fmt: skip
        for m in entry["metrics"]:
            metric = m["metric"] if m["metric"] == m["scorer"] else f"{m['scorer']} {m['metric']}"
            rows.append({"suite": entry["suite"], "metric": metric, "start": m["start"], "kept": m["kept"],
                         "change": m["change"]})  # fmt: skip
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir")
    job = JobDir(Path(parser.parse_args().job_dir))
    spec, _ = load_spec(job.spec)
    if problems := suite_problems(spec):
        print("\n".join(problems), file=sys.stderr)
        sys.exit(2)
    print(run_suites(job, spec, start_model(spec, job)))
    sys.exit(0)
