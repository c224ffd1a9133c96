"""`grpoflow jobs`, `metrics`, `model`, `rollouts`, `compare`, `sweep compare`, `webhooks retry`: results read back.

grpoflow jobs
grpoflow metrics JOB_ID --keys reward,reward_std --json
grpoflow rollouts JOB_ID --last --worst 5
grpoflow compare JOB_ID JOB_ID --json
grpoflow sweep compare SWEEP_ID --baseline JOB_ID
"""

import argparse
import json
import re
import sys

import yaml

from grpoflow.flows.cli.common import (
    _hidden_output_uri,
    _job_id_argument,
    _Parser,
    _positive,
    _step,
    find_args_job,
    output_uri,
    roots_to_search,
)
from grpoflow.flows.cli.run import budget_stop
from grpoflow.flows.errors import (
    EXIT_OK,
    Failed,
    UsageError,
)

# The command `grpoflow sweep compare ...` runs; `main` reads those two words as this one (`sweep SPEC` runs a sweep).
SWEEP_COMPARE = "sweep compare"


def cmd_jobs(args) -> int:
    from grpoflow.core.jobdir import JobDir
    from grpoflow.integrations.job_folders import job_status, local_root
    from grpoflow.integrations.storage import is_remote
    from grpoflow.trainers.metrics import read_metrics

    explicit = output_uri(args) is not None
    rows, elsewhere, looked = [], [], []
    for root in roots_to_search(args):
        if is_remote(root) and not explicit:
            elsewhere.append(root)  # not read unasked: a remote root costs a download per job
            continue
        folder = local_root(root)
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"output root {root} is not a folder")
        looked.append(root)
        for path in sorted(p for p in folder.iterdir() if (p / "spec.yaml").exists()) if folder.exists() else []:
            job, metrics = JobDir(path), read_metrics(path / "metrics.jsonl")
            steps, stopped_by = metrics[-1]["step"] if metrics else 0, "budget" if budget_stop(job) else None
            row = {"job_id": job.job_id, "status": job_status(job), "steps": steps, "stopped_by": stopped_by}
            rows.append({**row, "root": root})
    if args.json:
        print(json.dumps({"jobs": [{k: v for k, v in r.items() if k != "root" or not explicit} for r in rows]}))
        return EXIT_OK
    if not rows:
        print(f"no jobs under {', '.join(looked)}")
    for row in rows:
        where = "" if explicit else f"  {row['root']}"
        stopped = "  stopped by budget" if row["stopped_by"] else ""
        print(f"{row['job_id']:<60} {row['status']:<10} {row['steps']:>6} steps{stopped}{where}")
    for root in elsewhere:
        print(f"(jobs under {root} too: grpoflow jobs --output-uri {root})")
    return EXIT_OK


# The columns `grpoflow metrics` shows by default, in this order, with the short name each gets in the table; each
# reward's mean and the held-out score (eval/<metric>) join them as the job logged them.
MAIN_METRICS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "kl": "kl",
    "loss": "loss",
    "completions/mean_length": "length",
    "completions/clipped_ratio": "clipped",
}


def main_metrics(known: list[str]) -> dict[str, str]:
    """The main series of a job's metric keys `known`, as {key: column name}: reward, reward_std, each reward's mean
    (named by the reward), kl, loss, completion length, the share of completions cut, the held-out score(s)."""
    from grpoflow.core.scores import EVAL_PREFIX, EVAL_SECONDS

    rewards = {k: k.split("/")[1] for k in known if re.fullmatch(r"rewards/[^/]+/mean", k)}
    held_out = {k: k for k in known if k.startswith(EVAL_PREFIX) and k != EVAL_SECONDS}
    first, rest = list(MAIN_METRICS.items())[:2], list(MAIN_METRICS.items())[2:]
    columns = {**dict(first), **rewards, **dict(rest), **held_out}
    return {k: name for k, name in columns.items() if k in known}


def metrics_table(records: list[dict], columns: dict[str, str]) -> str:
    """The records as an aligned table: a step per row, a column per key of `columns` ({key: header})."""
    from grpoflow.core.spec.markdown import number

    rows = [["step", *columns.values()]]
    rows += [[str(r["step"]), *(number(r["values"].get(k)) for k in columns)] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)


def unknown_keys_problem(missing: list[str], known: list[str]) -> str:
    """Names the keys a job never logged, each with its likeliest meaning (difflib), and the ones it did log."""
    import difflib

    def named(key: str) -> str:
        near = difflib.get_close_matches(key, known, n=1)
        return f"{key} (did you mean {near[0]}?)" if near else key

    return f"unknown metric key(s) {', '.join(map(named, missing))}; this job logged: {', '.join(sorted(known))}"


def cmd_metrics(args) -> int:
    """`grpoflow metrics JOB_ID`: the main series as a table; `--keys` or `--all` for others, `--json` for scripts."""
    from grpoflow.trainers.metrics import read_metrics

    job, _ = find_args_job(args, args.job_id)
    keys = [k for k in (args.keys or "").split(",") if k]
    records = read_metrics(job.metrics)
    known = list(dict.fromkeys(k for r in records for k in r["values"]))
    if keys:
        missing = [k for k in keys if k not in known]
        if records and missing:
            # `kl` exists only with kl_coef > 0: the series asked for that this job has still print, exit 0.
            if len(missing) == len(keys):
                raise UsageError(unknown_keys_problem(missing, known))
            print(f"warning: {unknown_keys_problem(missing, known)}", file=sys.stderr)
            keys = [k for k in keys if k in known]
        records = [{"step": r["step"], "values": {k: r["values"].get(k) for k in keys}} for r in records]
    if args.json:
        print(json.dumps({"metrics": records}))
        return EXIT_OK
    if records:
        columns = {k: k for k in keys or known} if keys or args.all else main_metrics(known)
        print(metrics_table(records, columns))
    return EXIT_OK


def cmd_rollouts(args) -> int:
    """`grpoflow rollouts JOB_ID`: the rollouts the job kept (rollouts/), sorted by a reward, as a table or JSON."""
    from grpoflow.integrations.job_folders import UnknownJob
    from grpoflow.trainers.rollouts import rollout_record, rollouts_table, select_rollouts

    try:
        job, location = find_args_job(args, args.job_id)
    except UnknownJob as e:  # a command that only reads: an id it cannot find is the user's to fix (exit 2)
        raise UsageError(str(e)) from None
    _fetch_folder(job, location, job.rollouts.name)
    try:
        rows = select_rollouts(job.rollouts, args.step, args.last, args.best, args.worst, args.reward, args.grep)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.json:
        print(json.dumps({"rollouts": [rollout_record(r) for r in rows]}))
    elif rows:
        import shutil

        print(rollouts_table(rows, shutil.get_terminal_size((120, 24)).columns))
    else:
        print(f"no rollouts{' match' if args.grep else ''} (rollouts/ of {location})", file=sys.stderr)
    return EXIT_OK


def _fetch_folder(job, location: str, name: str) -> None:
    """A remote job's `name` folder (rollouts/, evaluation/) into its local copy (which holds only its top-level
    files); new files only."""
    from grpoflow.integrations.storage import filesystem, is_remote

    if not is_remote(location):
        return
    fs, remote = filesystem(location)
    folder = f"{remote.rstrip('/')}/{name}"
    for path in fs.ls(folder, detail=False) if fs.exists(folder) else []:
        local = job.root / name / path.rsplit("/", 1)[-1]
        if path.endswith(".parquet") and not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(path, str(local))


def _add_rollouts_command(sub) -> None:
    rollouts = sub.add_parser("rollouts", help="what the model wrote: a job's kept rollouts with every reward's score")
    _job_id_argument(rollouts)
    which = rollouts.add_mutually_exclusive_group()
    which.add_argument("--step", type=_step, metavar="N", help="only step N (default: every kept step)")
    which.add_argument("--last", action="store_true", help="only the newest kept step")
    ends = rollouts.add_mutually_exclusive_group()
    ends.add_argument("--best", type=_positive, metavar="K", help="the K highest by --reward")
    ends.add_argument("--worst", type=_positive, metavar="K", help="the K lowest by --reward, lowest first")
    rollouts.add_argument("--reward", metavar="NAME", help="sort by this reward's own score (default: the total)")
    rollouts.add_argument("--grep", metavar="TEXT", help="only rollouts whose prompt or completion holds TEXT")
    rollouts.add_argument("--json", action="store_true", help='print {"rollouts": [...]}')
    _hidden_output_uri(rollouts)
    rollouts.set_defaults(func=cmd_rollouts)


def cmd_compare(args) -> int:
    """`grpoflow compare JOB_ID JOB_ID...`: the jobs' held-out scores side by side on the prompts they share, each
    later job's gain against the first with its paired interval (jobs/compare.py); `--json` for scripts."""
    if len(args.job_ids) < 2 or len(set(args.job_ids)) < len(args.job_ids):
        raise UsageError(f"compare: name two or more different jobs (got {' '.join(args.job_ids)})")
    return _print_comparison(args, args.job_ids)


def cmd_sweep_compare(args) -> int:
    """`grpoflow sweep compare SWEEP_ID`: `compare` of the sweep's completed jobs (sweep.json), in grid order, the
    first or `--baseline` the baseline; the jobs left out are named on stderr."""
    from grpoflow.flows.sweep import compared_jobs, read_sweep
    from grpoflow.jobs.compare import NotComparable

    record = read_sweep(roots_to_search(args), args.sweep_id)
    job_ids, left_out = compared_jobs(record, args.baseline)
    for line in left_out:
        print(f"sweep compare: left out {line}", file=sys.stderr)
    if len(job_ids) < 2:
        raise NotComparable(
            f"sweep {args.sweep_id} has {len(job_ids)} completed job with held-out scores; comparing needs two"
        )
    return _print_comparison(args, job_ids)


def _print_comparison(args, job_ids: list[str]) -> int:
    """`compare`'s table (or --json) of `job_ids`, each job's held-out rollouts fetched where its folder is remote."""
    from grpoflow.jobs.compare import compare, compare_table

    jobs = []
    for job_id in job_ids:
        job, location = find_args_job(args, job_id)
        _fetch_folder(job, location, job.evaluation_rollouts.name)
        jobs.append(job)
    result = compare(jobs, args.confidence)
    print(json.dumps(result) if args.json else compare_table(result))
    return EXIT_OK


def _confidence(text: str) -> float:
    """argparse type of --confidence: a number in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number between 0 and 1 (e.g. 0.95)")
    return value


def _add_compare_command(sub) -> None:
    compare = sub.add_parser(
        "compare",
        help="held-out scores of jobs side by side on the prompts they share, each against the first",
        description="Each job's kept model scored on the held-out prompts all the jobs share (matched by text), "
        "with a bootstrap interval over those prompts, and each later job's gain against the first with its paired "
        "interval.",
    )
    compare.add_argument("job_ids", nargs="+", metavar="JOB_ID", help="two or more job ids; the first is the baseline")
    compare.add_argument(
        "--confidence", type=_confidence, default=0.95, help="the intervals' coverage (default: 0.95)"
    )
    compare.add_argument(
        "--json",
        action="store_true",
        help='print {"jobs", "metric", "prompts", "confidence", "rows": [{"job", "score", "ci", "gain_vs_first", '
        '"gain_ci"}]}',
    )
    _hidden_output_uri(compare)
    compare.set_defaults(func=cmd_compare)
    # `sweep compare` (main() reads `grpoflow sweep compare ...` as this command; `sweep SPEC` runs a sweep)
    sweep = sub.add_parser(
        SWEEP_COMPARE,
        help="held-out scores of a sweep's jobs side by side, each against the first (or --baseline)",
        description="grpoflow compare on a sweep's completed jobs (its sweep.json), in grid order: the held-out "
        "prompts they share, each job's score with its bootstrap interval, each job's gain against the baseline with "
        "its paired interval.",
    )
    sweep.add_argument("sweep_id", metavar="SWEEP_ID", help="the sweep's id, as `grpoflow sweep` printed it")
    sweep.add_argument("--baseline", metavar="JOB_ID", help="the job compared with (default: the sweep's first)")
    sweep.add_argument("--confidence", type=_confidence, default=0.95, help="the intervals' coverage (default: 0.95)")
    sweep.add_argument("--json", action="store_true", help="print what compare --json prints")
    _hidden_output_uri(sweep)
    sweep.set_defaults(func=cmd_sweep_compare)


def cmd_model(args) -> int:
    from grpoflow.integrations.job_folders import UnknownJob, job_status
    from grpoflow.integrations.storage import join

    job, location = find_args_job(args, args.job_id)  # a remote job's weights stay remote: location is its URL
    if not job.model_json.exists():
        raise UnknownJob(f"job {args.job_id} has no trained model yet (status: {job_status(job)})")
    info = json.loads(job.model_json.read_text())
    info = {"job_id": job.job_id, **info, "adapter_dir": None, "merged_dir": join(location, "merged")}
    if info["artifact_type"] == "adapter":
        info["adapter_dir"] = join(location, "adapter")
    print(json.dumps(info) if args.json else yaml.safe_dump(info, sort_keys=False), end="\n" if args.json else "")
    return EXIT_OK


def cmd_webhooks_retry(args) -> int:
    """Sends the job's undelivered webhook deliveries once more, with their first `webhook-id`, and waits for them
    (`grpoflow.integrations.webhooks.retry`); one line each. Exit 0 when none is left undelivered, 1 when some are, 2
    for an unknown job or one a live run holds (that run sends its own)."""
    from grpoflow.integrations import webhooks
    from grpoflow.integrations.storage import filesystem, is_remote, join
    from grpoflow.jobs.lock import JobLock, JobLocked
    from grpoflow.jobs.report import note_undelivered

    job, location = find_args_job(args, args.job_id)
    lock = JobLock(job.root)
    try:
        lock.acquire()
    except JobLocked as e:
        raise UsageError(f"webhooks retry: {e}") from None
    try:
        results = webhooks.retry(job, args.timeout)
        note_undelivered(job, webhooks.undelivered(job))
    finally:
        lock.release()
    if is_remote(location):  # the local copy's log and report go back, so a later retry skips what was delivered
        for path in (job.webhooks, job.report):
            if path.exists():
                fs, remote = filesystem(join(location, path.name))
                fs.put_file(str(path), remote)
    for result in results:
        print(f"{result['type']}  {result['event_id']}  {result['url']}  {_delivery_outcome(result)}")
    if not results:
        print(f"job {job.job_id}: no webhook delivery is undelivered")
    if left := sum(not result["settled"] for result in results):
        raise Failed(f"{left} of {len(results)} webhook deliveries still undelivered; run it again later")
    return EXIT_OK


def _delivery_outcome(result: dict) -> str:
    last = result["last"] or {"outcome": "queued", "error": "not attempted before --timeout"}
    if result["settled"]:
        return "delivered" if last["outcome"] == "delivered" else f"failed for good: HTTP {last['status']}"
    return f"undelivered ({last['outcome']}): {last['error']}"


def _add_webhooks_command(sub) -> None:
    """`webhooks retry`: a job's undelivered webhook deliveries sent again (integrations/webhooks.py)."""
    hooks = sub.add_parser("webhooks", help="a job's webhook deliveries")
    actions = hooks.add_subparsers(dest="action", required=True, parser_class=_Parser)
    retry = actions.add_parser(
        "retry", help="send a job's undelivered webhook deliveries again (the same webhook-id) and wait for them"
    )
    _job_id_argument(retry)
    retry.add_argument(
        "--timeout", type=float, default=300.0, metavar="SECONDS", help="the most to wait for them (default: 300)"
    )
    _hidden_output_uri(retry)
    retry.set_defaults(func=cmd_webhooks_retry)
