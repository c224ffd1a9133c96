"""Hyperparameter sweeps: one GRPO job per combination of grid values, then a comparison report.

    grpoflow sweep examples/arithmetic.yaml --grid hyperparameters.learning_rate=1e-5,3e-5 \\
        --grid trl.loss_type=grpo,dr_grpo --max-concurrent 2

`grid_overrides` expands the grid (a cartesian product, values parsed as `--set` parses them) and validates every
combination's spec before anything runs: one invalid combination rejects the whole sweep (exit 2). The
`grpo-sweep` flow then runs each combination's job, at most `max_concurrent` at a time: in this process as subflows
of the sweep (`grpoflow sweep`), or, given `deployment`, as flow runs of that `grpo-pipeline` deployment on the
server (the `sweep` deployment of deployments/prefect.yaml runs them on `grpo-pipeline/retrain`). A job that fails
fails its row, not the sweep's other jobs. The report, `sweep.md` and `sweep.json` under
`<output_uri>/sweeps/<sweep_id>/`, and a markdown and a table artifact (keys `<name>-sweep`, `<name>-sweep-table`;
one "sweep" only, for a spec whose name already says sweep),
give each job's held-out score before and after GRPO (after: the model the job kept), its final training reward and
its wall time, ranked by the score after (then the gain), the best job marked; jobs tied at the top (the same score
and gain, e.g. 0.000 -> 0.000) share the rank, and none is named best: the report says they tie. The sweep's run
ends Completed when every job completed, else Failed with "k of n jobs failed".
"""

import asyncio
import itertools
import json
import re
import secrets
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from prefect.states import Completed, Failed
from prefect.task_runners import ThreadPoolTaskRunner

from grpoflow.core.scores import SCORE_TOLERANCE
from grpoflow.core.spec import JobSpec, SpecError, apply_overrides, load_spec
from grpoflow.flows.admission import admission_problems
from grpoflow.flows.deployments import deployment_name, name_after_job, pool_job_variables, run_parameters, wait_for
from grpoflow.flows.pipeline import checked_spec, grpo_pipeline, spec_name
from grpoflow.integrations.artifacts import score_change
from grpoflow.integrations.stages import REJECTED, rejected
from grpoflow.integrations.storage import filesystem, is_remote, join
from grpoflow.trainers.metrics import read_jsonl

_NOT_KEY = re.compile(r"[^a-z0-9]+")  # Prefect artifact keys: lowercase letters, digits and dashes
BEST = "★ best"
TIED = "tied for first"


# --- the grid --------------------------------------------------------------------------------------------------------


def parse_grid(options: list[str]) -> dict[str, list]:
    """`--grid key=v1,v2` options as `{key: [v1, v2]}`, each value parsed as `--set` parses it (`1e-5` a float,
    `true` a bool, `grpo` a string). Raises `SpecError` naming every malformed option."""
    grid, problems = {}, []
    for option in options:
        key, sep, raw = option.partition("=")
        key = key.strip()
        values = [v.strip() for v in raw.split(",")]
        if not sep or not key or not all(values):
            problems.append(f"--grid {option!r}: expected key=value1,value2,..., e.g. hyperparameters.max_steps=5,10")
        elif key in grid:
            problems.append(f"--grid {key}: given twice; put all its values in one --grid {key}=v1,v2")
        else:
            # `--set`'s parser, on a scratch mapping: the values read exactly as `--set key=value` reads them.
            grid[key] = [apply_overrides({}, [f"value={v}"])["value"] for v in values]
    if problems:
        raise SpecError(problems)
    return grid


def _override(key: str, value: Any) -> str:
    # JSON is YAML: the value comes back with its type (a string that looks like a number stays a string).
    return f"{key}={json.dumps(value)}"


def combination_name(values: dict) -> str:
    """`hyperparameters.learning_rate=1e-05, trl.loss_type=grpo`: how a combination is named in messages."""
    return ", ".join(f"{k}={v}" for k, v in values.items())


def grid_overrides(spec: dict | JobSpec, grid: dict[str, list]) -> list[dict]:
    """Every combination of `grid`'s values (a cartesian product, in the grid's order), each validated.

    Args:
        spec (`dict` or `JobSpec`): the base spec (`--set` overrides applied); each combination overrides it.
        grid (`dict[str, list]`): dotted spec paths (as `--set` takes them) to the values to try.

    Returns:
        `list[dict]`: one `{path: value}` per combination.

    Raises:
        `SpecError`: an empty grid, a key with no values, or combinations whose spec is rejected, each problem
        prefixed with its combination (a problem every combination has, such as a grid key that is not a spec
        path, is reported once).
    """
    if not grid:
        raise SpecError("--grid: give at least one grid, e.g. --grid hyperparameters.learning_rate=1e-5,3e-5")
    empty = [f"grid.{key}: give at least one value" for key, values in grid.items() if not values]
    if empty:
        raise SpecError(empty)
    combinations = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    rejected_by = {}
    for values in combinations:
        try:
            combination_spec(spec, values)
        except SpecError as e:
            for problem in e.problems:
                rejected_by.setdefault(problem, []).append(values)
    problems = []
    for problem, where in rejected_by.items():
        if len(where) == len(combinations) and len(combinations) > 1:
            problems.append(f"every combination: {problem}")
        else:
            problems += [f"combination {combination_name(values)}: {problem}" for values in where]
    if problems:
        raise SpecError(problems)
    return combinations


def combination_spec(spec: dict | JobSpec, values: dict) -> JobSpec:
    """The validated spec of one combination: `spec` with each `path: value` of `values` set."""
    base = spec.model_dump(mode="json", exclude_unset=True) if isinstance(spec, JobSpec) else spec
    return load_spec(base, [_override(k, v) for k, v in values.items()])[0]


def sweep_name(name: str) -> str:
    """What a sweep of spec `name` is called: `<name>-sweep`, or `name` itself when one of its words already is
    "sweep" (a spec named `lr-sweep` gave sweep ids `lr-sweep-sweep-...`)."""
    return name if "sweep" in _NOT_KEY.split(name.lower()) else f"{name}-sweep"


def new_sweep_id(name: str) -> str:
    """`<name>-sweep-<UTC time>-<6 hex>` (`sweep_name`)."""
    return f"{sweep_name(name)}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


# --- one job ---------------------------------------------------------------------------------------------------------


def _read_json(uri: str):
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        return json.loads(f.read())


def final_reward(uri: str) -> float | None:
    """The `reward` of the last step in the job's `metrics.jsonl` (a local path or URL), None before any step."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        return None
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(path) if not is_remote(uri) else Path(scratch) / "metrics.jsonl"
        if is_remote(uri):
            fs.get(path, str(local))
        records = read_jsonl(local, lambda r: isinstance(r, dict) and isinstance(r.get("values"), dict))
    reward = records[-1]["values"].get("reward") if records else None
    return reward if isinstance(reward, int | float) else None


def job_root(spec: JobSpec, job_id: str) -> str:
    """Where the job's folder is: `<output_uri>/<job_id>` (a local path resolved, or a URL)."""
    return join(spec.output_uri, job_id) if is_remote(spec.output_uri) else str(_local(spec.output_uri) / job_id)


def _run_here(spec: JobSpec):
    """Runs the job as a subflow of the sweep; returns (its final state, its flow run's name: the job id)."""
    state = grpo_pipeline(spec, return_state=True)
    flow_run_id = state.state_details.flow_run_id
    if flow_run_id is None:
        return state, None
    with get_client(sync_client=True) as client:
        return state, client.read_flow_run(flow_run_id).name


def _run_deployment(spec: JobSpec, deployment: str):
    """Runs the job as a flow run of `deployment` on the server (the sweep's subflow in the UI) and waits for it;
    returns (final state, job id). The run gets what `grpoflow submit` gives one: the pool's `gpu_count` from the
    spec, and its job id as its name from the start."""
    started = asyncio.run(start_job_run(spec, deployment))
    flow_run = asyncio.run(wait_for(started.id))
    return flow_run.state, flow_run.name


async def start_job_run(spec: JobSpec, deployment: str):
    """Creates the flow run of `deployment` for `spec` (linked to the calling task run, if any); returns it."""
    from prefect.deployments import arun_deployment

    name = deployment_name(deployment)
    async with get_client() as client:
        job_variables = await pool_job_variables(client, await client.read_deployment_by_name(name), spec)
        flow_run = await arun_deployment(
            name, parameters=run_parameters(spec), job_variables=job_variables or None, timeout=0
        )
        return await name_after_job(client, flow_run, spec.name)


@task(name="sweep-job", task_run_name="sweep-job {index}")
def sweep_job(index: int, values: dict, spec: JobSpec, deployment: str | None = None) -> dict:
    """Runs one combination's job to its end and returns its row of the report (a failed job is a row too).

    Args:
        index (`int`): the combination's number, from 1.
        values (`dict`): the combination's grid values.
        spec (`JobSpec`): the combination's spec.
        deployment (`str`, *optional*): a `grpo-pipeline` deployment to run the job on; None runs it here.
    """
    started = time.time()
    try:
        state, job_id = _run_deployment(spec, deployment) if deployment else _run_here(spec)
        status = "completed" if state.is_completed() else ("rejected" if state.name == REJECTED else "failed")
        message = state.message or ""
    except Exception as e:  # the server refused the run, or the job could not start: this row, not the sweep
        job_id, status, message = None, "failed", f"{type(e).__name__}: {e}"
    ended = time.time()
    row = {"index": index, "values": values, "job_id": job_id, "status": status, "message": message}
    row |= {"evaluation": None, "final_reward": None, "wall_seconds": round(ended - started, 1)}
    row |= {"started": started, "ended": ended}
    if job_id:
        root = job_root(spec, job_id)
        row["output_dir"] = root
        row["evaluation"] = _read_json(join(root, "evaluation.json"))
        row["final_reward"] = final_reward(join(root, "metrics.jsonl"))
    get_run_logger().info("job %d (%s): %s %s", index, combination_name(values), status, job_id or "")
    return row


# --- the report ------------------------------------------------------------------------------------------------------


def _gain(row: dict) -> float | None:
    evaluation = row.get("evaluation") or {}
    before, after = evaluation.get("before"), evaluation.get("after")
    if row["status"] != "completed" or not all(isinstance(v, int | float) for v in (before, after)):
        return None
    return after - before


def ranked(rows: list[dict]) -> list[dict]:
    """The completed, scored jobs, best first: by the held-out score of the model each kept ("after", the selected
    step's with `evaluation.select: best`), ties broken by the higher gain (after - before)."""
    scored = [r for r in rows if _gain(r) is not None]
    return sorted(scored, key=lambda r: (r["evaluation"]["after"], _gain(r)), reverse=True)


def _ties(a: dict, b: dict) -> bool:
    """Whether two ranked rows tie: the same score after and the same gain, within float noise."""
    same_after = abs(a["evaluation"]["after"] - b["evaluation"]["after"]) <= SCORE_TOLERANCE
    return same_after and abs(_gain(a) - _gain(b)) <= SCORE_TOLERANCE


def leaders(rows: list[dict]) -> list[dict]:
    """The ranked rows tied with the first (one row when it is ahead alone); none when no job scored."""
    order = ranked(rows)
    return [r for r in order if _ties(r, order[0])] if order else []


def best_row(rows: list[dict]) -> dict | None:
    """The first of `ranked(rows)`, the highest held-out score at the kept step; None when jobs tie for first (no job
    is better than another) or none scored."""
    first = leaders(rows)
    return first[0] if len(first) == 1 else None


def _rank(row: dict, order: list[dict]) -> str:
    """`row`'s place in `order` (`ranked`), shared with the rows it ties; `—` for a row not ranked."""
    if not any(r is row for r in order):
        return "—"
    return str(next(i for i, r in enumerate(order, start=1) if _ties(r, row)))


def summary_line(rows: list[dict]) -> str:
    """The sweep's one-line verdict: the best job and its scores, the jobs that tie for first, or none scored."""
    first = leaders(rows)
    if not first:
        return "no job scored"
    if len(first) == 1:
        return f"best {first[0]['job_id']}: {_held_out(first[0])}"
    return f"no best: {', '.join(r['job_id'] for r in first)} tie at {_held_out(first[0])}"


def _kept(row: dict) -> str:
    step = (row.get("evaluation") or {}).get("selected_step")
    if step == 0:
        return "the starting model (step 0)"
    return "—" if step is None else f"step {step} ({row['evaluation'].get('select', 'last')})"


def _held_out(row: dict) -> str:
    if _gain(row) is None:
        return "—"
    before, after = row["evaluation"]["before"], row["evaluation"]["after"]
    return f"{before:.3f} → {after:.3f} ({score_change(before, after)})"


def table_rows(rows: list[dict], best: dict | None) -> list[dict]:
    """The comparison table's rows, ranked (`ranked`; then the failed and unscored jobs in grid order): the rank,
    the grid values, job id, status, held-out before → after, the step kept, reward, wall time."""
    scored = ranked(rows)
    first = leaders(rows)
    tied = first if best is None and len(first) > 1 else []
    table = []
    for row in scored + [r for r in rows if not any(r is o for o in scored)]:
        values = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in row["values"].items()}
        line = {"rank": _rank(row, scored), **values}
        line["job"] = row["job_id"] or "—"
        line["status"] = row["status"] + (f" ({row['message']})" if row["status"] != "completed" else "")
        line["held-out before → after"] = _held_out(row)
        line["model kept"] = _kept(row)
        line["final reward"] = "—" if row["final_reward"] is None else f"{row['final_reward']:.3f}"
        line["wall time"] = f"{row['wall_seconds']:.0f} s"
        line["best"] = BEST if row is best else TIED if any(row is t for t in tied) else ""
        table.append(line)
    return table


def _cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def report_markdown(sweep_id: str, rows: list[dict], metric: str | None) -> str:
    """`sweep.md`: a heading, the number of failed jobs, and one table row per combination."""
    best = best_row(rows)
    table = table_rows(rows, best)
    failed = sum(r["status"] != "completed" for r in rows)
    lines = [f"# Sweep {sweep_id}", ""]
    lines.append(f"{len(rows)} jobs, {len(rows) - failed} completed, {failed} failed.")
    if metric:
        lines.append(
            f"Held-out metric: {metric}; ranked by the held-out score of the model each job kept (after: the "
            "selected step's with evaluation.select: best), then by the gain (after − before)."
        )
    if len(first := leaders(rows)) > 1:
        lines.append(f"No best job: {len(first)} jobs tie for first at {_held_out(first[0])}.")
    lines += ["", "| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(table[0])]
    lines += ["| " + " | ".join(_cell(v) for v in line.values()) + " |" for line in table]
    return "\n".join(lines) + "\n"


def sweep_key(name: str, table: bool = False) -> str:
    """The artifact key of a sweep of spec `name`: `<name>-sweep` as `sweep_name` says it (the table's:
    `<name>-sweep-table`), in the letters a Prefect key takes."""
    key = _NOT_KEY.sub("-", sweep_name(name).lower()).strip("-")
    return f"{key}-table" if table else key


def report_dir(root: str, sweep_id: str) -> str:
    """`<root>/sweeps/<sweep_id>`: the sweep's report folder under output root `root` (a local path resolved)."""
    return join(root, "sweeps", sweep_id) if is_remote(root) else join(str(_local(root)), "sweeps", sweep_id)


def write_report(root: str, sweep_id: str, rows: list[dict]) -> str:
    """Writes `sweep.md` and `sweep.json` under `<root>/sweeps/<sweep_id>/`; returns that folder."""
    folder = report_dir(root, sweep_id)
    metric = next((r["evaluation"]["metric"] for r in rows if r.get("evaluation")), None)
    best, first = best_row(rows), leaders(rows)
    summary = {"sweep_id": sweep_id, "metric": metric, "best": best["job_id"] if best else None}
    summary |= {"tied": [r["job_id"] for r in first] if len(first) > 1 else [], "jobs": rows}
    fs, path = filesystem(folder)
    fs.makedirs(path, exist_ok=True)
    with fs.open(f"{path}/sweep.json", "w") as f:
        f.write(json.dumps(summary, indent=2) + "\n")
    with fs.open(f"{path}/sweep.md", "w") as f:
        f.write(report_markdown(sweep_id, rows, metric))
    return folder


def _local(root: str) -> Path:
    return Path(root).expanduser().resolve()


# --- the flow --------------------------------------------------------------------------------------------------------


def sweep_run_name() -> str:
    """The sweep's flow run name: its sweep id (the `sweep_id` parameter, else a new one)."""
    parameters = FlowRunContext.get().parameters
    return parameters.get("sweep_id") or new_sweep_id(spec_name(parameters["spec"]))


# validate_parameters=False: the flow checks the spec itself and ends Rejected, as grpo-pipeline does (`checked_spec`).
@flow(name="grpo-sweep", flow_run_name=sweep_run_name, validate_parameters=False)
def grpo_sweep(
    spec: JobSpec,
    grid: dict[str, list[Any]],
    max_concurrent: int = 1,
    deployment: str | None = None,
    sweep_id: str | None = None,
) -> dict:
    """Runs one GRPO job per combination of `grid`'s values on `spec`, then writes and shows the comparison report.

    Args:
        spec (`JobSpec`): the base job spec; each combination sets its grid values on it.
        grid (`dict[str, list]`): dotted spec paths (as `--set` takes them, e.g. `hyperparameters.learning_rate`) to
            the values to try; every combination of them is one job.
        max_concurrent (`int`, *optional*, defaults to 1): the most jobs running at once.
        deployment (`str`, *optional*): a grpo-pipeline deployment (e.g. `retrain`) to run each job as its flow run
            on the server; none runs the jobs in this flow run's process, as its subflows.
        sweep_id (`str`, *optional*): the report's folder name under `<output_uri>/sweeps/` (default: a new id).
    """
    logger = get_run_logger()
    spec = checked_spec(spec)  # a deployment's run: the spec as its JSON
    if not isinstance(spec, JobSpec):
        return spec
    if max_concurrent < 1:
        return rejected(f"max_concurrent: must be >= 1 (got {max_concurrent})")
    try:
        combinations = grid_overrides(spec, grid)
    except SpecError as e:
        logger.error("sweep rejected:\n%s", "\n".join(e.problems))
        return rejected("; ".join(e.problems))
    sweep_id = sweep_id or flow_run.name
    specs = [combination_spec(spec, values) for values in combinations]
    if problems := list(dict.fromkeys(p for s in specs for p in admission_problems(s))):
        logger.error("sweep rejected:\n%s", "\n".join(problems))
        return rejected("; ".join(problems))
    logger.info("sweep %s: %d jobs, at most %d at once", sweep_id, len(specs), max_concurrent)

    # --- the jobs, at most max_concurrent at once (each a thread that waits for its job)
    with ThreadPoolTaskRunner(max_workers=max_concurrent) as runner:
        futures = [
            runner.submit(sweep_job, {"index": i, "values": v, "spec": s, "deployment": deployment})
            for i, (v, s) in enumerate(zip(combinations, specs, strict=True), start=1)
        ]
        rows = [future.result() for future in futures]

    # --- the comparison report: files and artifacts
    folder = write_report(spec.output_uri, sweep_id, rows)
    metric = next((r["evaluation"]["metric"] for r in rows if r.get("evaluation")), None)
    markdown = report_markdown(sweep_id, rows, metric) + f"\nReport folder: `{folder}`\n"
    description = f"GRPO sweep {sweep_id}"
    create_markdown_artifact(markdown, key=sweep_key(spec.name), description=description)
    create_table_artifact(
        table_rows(rows, best_row(rows)), key=sweep_key(spec.name, table=True), description=description
    )
    failed = sum(r["status"] != "completed" for r in rows)
    result = {"sweep_id": sweep_id, "report_dir": folder, "jobs": len(rows), "failed": failed}
    summary = summary_line(rows)
    if failed:
        return Failed(message=f"{failed} of {len(rows)} jobs failed; {summary}", data=result)
    return Completed(message=f"{len(rows)} jobs completed; {summary}", data=result)


# --- a sweep's jobs side by side (`grpoflow sweep compare SWEEP_ID`) -------------------------------------------------


def read_sweep(roots: list[str], sweep_id: str) -> dict:
    """`sweep.json` of `sweep_id` (what `write_report` wrote), from the first of the output `roots` that has it;
    `UsageError` naming where it looked when none has."""
    from grpoflow.flows.errors import UsageError

    for root in roots:
        record = _read_json(join(report_dir(root, sweep_id), "sweep.json"))
        if record is not None:
            return record
    raise UsageError(
        f"sweep compare: no sweep {sweep_id!r} under {', '.join(roots)} (sweeps/<sweep_id>/sweep.json, as `grpoflow "
        "sweep` writes it); pass the sweep id it printed, and --output-uri when its jobs went elsewhere"
    )


def compared_jobs(record: dict, baseline: str | None = None) -> tuple[list[str], list[str]]:
    """The jobs of a sweep's `record` that `grpoflow sweep compare` puts side by side, and a line for each left out:
    those that completed with a held-out evaluation, in grid order, `baseline` first when given (`UsageError` when it
    is not one of them)."""
    from grpoflow.flows.errors import UsageError

    rows = record.get("jobs") or []
    kept = [r["job_id"] for r in rows if r.get("status") == "completed" and r.get("evaluation")]
    left_out = [
        f"job {r['index']} ({r.get('job_id') or 'never started'}): "
        + (r.get("status") if r.get("status") != "completed" else "no held-out evaluation")
        for r in rows
        if r.get("job_id") not in kept
    ]
    if baseline is not None:
        if baseline not in kept:
            raise UsageError(
                f"sweep compare: --baseline {baseline!r} is not one of sweep {record.get('sweep_id')}'s completed, "
                f"scored jobs: {', '.join(kept) or 'none'}"
            )
        kept = [baseline, *(job_id for job_id in kept if job_id != baseline)]
    return kept, left_out
