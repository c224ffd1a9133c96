"""`grpoflow`: validate a job spec, run the pipeline, and read jobs, metrics and models back.

    grpoflow validate examples/smoke-test.yaml --set hyperparameters.max_steps=5
    grpoflow run examples/arithmetic.yaml --json
    grpoflow demo
    grpoflow jobs
    grpoflow metrics JOB_ID --keys reward,reward_std --json
    grpoflow model JOB_ID --json
    grpoflow rollouts JOB_ID --last --worst 5
    grpoflow webhooks retry JOB_ID
    grpoflow sweep examples/arithmetic.yaml --grid trl.loss_type=grpo,dr_grpo --max-concurrent 1
    grpoflow graders run examples/openai-rft/job.yaml --rows 20
    grpoflow k8s render deployments/k8s-spec.yaml --image registry/grpoflow:1 \
        --set distributed.num_machines=2 --set distributed.shared_volume=grpoflow-rwx

Exit codes, one meaning each (`grpoflow.flows.errors`: `MEANINGS` and every command's own words, its `--help`): 0
done, 1 what the command ran failed, 2 bad input (a spec, dataset or argument to fix, a training setup problem, an
unknown job id, a job another run holds), 4 a run the health monitor stopped (diverged).
"""

# Each command imports inside itself what only it uses (Prefect, the spec's models and through them torch, the job
# folders): `grpoflow --help` and every other command load none of it.
import argparse
import json
import logging
import os
import re
import select
import signal
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path

import yaml

from grpoflow.flows.errors import (
    EXIT_OK,
    EXIT_REJECTED,
    Diverged,
    Failed,
    Rejected,
    Stopped,
    UsageError,
    exit_code,
    exits_epilog,
)
from grpoflow.flows.policy_cli import add_policy_command
from grpoflow.trainers.trust import command_line

# The demo's spec, data and reward module ship as package data: found from any install, not only a checkout.
EXAMPLES = Path(str(files("grpoflow.examples")))
DEMO_SPEC = EXAMPLES / "arithmetic.yaml"


# --- helpers


def output_uri(args) -> str | None:
    """`--output-uri` or `GRPOFLOW_OUTPUT_URI` as given: a folder or `s3://bucket/prefix`."""
    return getattr(args, "output_uri", None) or os.environ.get("GRPOFLOW_OUTPUT_URI")


def output_root(args) -> Path | None:
    """The output root chosen by `--output-uri` or `GRPOFLOW_OUTPUT_URI`, as a local folder; None when neither is set.
    A remote root is read through a local copy of its jobs' top-level files (spec, metrics, events, model.json)."""
    from grpoflow.integrations.jobs import local_root

    root = output_uri(args)
    return local_root(root) if root else None


def roots_to_search(args) -> list[str]:
    """Where to look for jobs: `--output-uri` alone when given, else `./runs` and the job index's roots."""
    from grpoflow.integrations.jobs import search_roots

    return search_roots(output_uri(args))


def load(args, extra_overrides: list[str] = ()):
    from grpoflow.trainers.spec import load_spec

    overrides = [*extra_overrides, *(args.set or [])]
    root = output_uri(args)
    if root is not None:
        overrides.append(f"output_uri={root}")
    spec, warnings = load_spec(args.spec, overrides)
    for warning in warnings + limit_warnings(spec):
        print(f"warning: {warning}", file=sys.stderr)
    return spec


def limit_warnings(spec) -> list[str]:
    """Where `spec` asks for more than the policy's limits (which refuse it from a deployment; here it runs)."""
    from grpoflow.trainers.policy import PolicyError, limit_excess, load_policy

    try:
        loaded = load_policy()
    except PolicyError as e:
        return [str(e)]
    return [
        f"{where}: {what} (the policy's `limits.{key}`, {loaded.source}: a deployment would refuse this spec)"
        for where, what, key in limit_excess(spec, loaded.policy.limits)
    ]


def find_args_job(args, job_id: str):
    """The job folder of `job_id` and its location, under `--output-uri` when given (`grpoflow.integrations.jobs`)."""
    from grpoflow.integrations.jobs import find_job

    return find_job(job_id, output_uri(args))


# --- commands


def preflight(args, spec) -> None:
    """Runs the preflight checks (jobs/preflight.py: the model, its tokenizer, the dataset, the rewards' dry run;
    offline, no weights loaded) and raises `SpecError` (exit 2) listing every problem. `--no-preflight` skips them,
    for a spec whose paths and Hub cache are a worker's, not this machine's."""
    if getattr(args, "no_preflight", False):
        return
    from grpoflow.integrations.storage import storage_options
    from grpoflow.jobs.preflight import preflight as check
    from grpoflow.trainers.spec import SpecError

    warnings = []
    problems = check(spec, warnings, storage_options(spec.dataset.uri))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        raise SpecError(problems)


def check_this_machine(spec) -> None:
    """`run` trains on this machine: what the spec needs of it (a CUDA GPU and vllm for generation.engine vllm,
    DeepSpeed for zero2/zero3, Liger, Unsloth) is checked before anything starts (exit 2), as the training child
    would check it after the ingest. Specs that need none of these do not import torch here."""
    from grpoflow.trainers.model.load import SetupError, check_accelerators, needs_cuda
    from grpoflow.trainers.spec import SpecError

    if needs_cuda(spec):
        try:
            check_accelerators(spec)
        except SetupError as e:
            raise SpecError([str(e)]) from None


def cmd_validate(args) -> int:
    from grpoflow.trainers.spec import resolved_dict, to_yaml

    spec = load(args)
    preflight(args, spec)
    print(json.dumps(resolved_dict(spec), indent=2) if args.json else to_yaml(spec), end="\n" if args.json else "")
    print_estimate(args, spec)
    return EXIT_OK


def print_estimate(args, spec) -> None:
    """The training time to expect, from a job of the same base model that trained here (trainers/budget.py)."""
    from grpoflow.trainers.budget import estimate

    print(f"training time: {estimate(spec, roots_to_search(args))}", file=sys.stderr)


def check_resume(spec, job_id: str) -> None:
    """A resumed job must run the spec it started with (`resume_problem`), and no live run may hold it: said here,
    before a server starts, as exit 2 (the flow checks the same for a deployment's `job_id`)."""
    from grpoflow.integrations.jobs import resume_problem
    from grpoflow.integrations.storage import is_remote

    if problem := resume_problem(spec, job_id, "--resume"):
        raise UsageError(problem)
    if not is_remote(spec.output_uri):
        from grpoflow.jobs.lock import JobLock, JobLocked

        try:
            JobLock(Path(spec.output_uri).expanduser().resolve() / job_id).check()
        except JobLocked as e:
            raise UsageError(f"--resume: {e}") from None


def print_result(args, result: dict, spec) -> dict:
    """Prints a finished run's result (`--json`: the job id, folder and status, and `stopped_by` when the budget ended
    its training) and returns that much of it."""
    from grpoflow.integrations.jobs import job_dir

    out = {k: result[k] for k in ("job_id", "output_dir", "status")}
    stopped = budget_stop(job_dir(spec.output_uri, out["job_id"]))
    if args.json:
        print(json.dumps({**out, "stopped_by": "budget"} if stopped else out))
    else:
        print(f"job {out['job_id']} {out['status']}{f', {stopped}' if stopped else ''}: {out['output_dir']}")
        evaluation = result.get("evaluation")
        if evaluation:
            before, after = (_score(evaluation[side]) for side in ("before", "after"))
            held_out = f"held-out {evaluation['metric']} on {evaluation['n']} prompts"
            print(f"{held_out}: before GRPO {before}, after GRPO {after}")
            if evaluation.get("note"):
                print(f"note: {evaluation['note']}")
        print(f"report: {out['output_dir'].rstrip('/')}/report.md")  # a path or an s3:// URI
    return out


def budget_stop(job) -> str | None:
    """The sentence saying the budget ended `job`'s training (its training.json's `stopped_by: budget`), else None:
    a job that completed short of max_steps says why wherever its outcome is shown (`run`, `jobs`)."""
    from grpoflow.trainers.budget import budget_line

    path = job.training_result
    return budget_line(json.loads(path.read_text())) if path.exists() else None


def resumed_job_done(spec, job_id: str) -> dict | None:
    """The result of a completed job that a resume would not change (every stage's record up to date), else None."""
    from grpoflow.integrations.storage import is_remote

    if is_remote(spec.output_uri):  # its folder is not here to check: the flow run finds every stage done
        return None
    from grpoflow.flows.pipeline import completed_before
    from grpoflow.trainers.jobdir import JobDir

    job = JobDir(Path(spec.output_uri).expanduser().resolve() / job_id)
    if not completed_before(job, spec):
        return None
    evaluation = json.loads(job.evaluation.read_text()) if job.evaluation.exists() else None
    print(f"job {job_id} is already completed and up to date: nothing to resume", file=sys.stderr)
    return {"job_id": job_id, "output_dir": str(job.root), "status": "completed", "evaluation": evaluation}


def refuse_approval(spec) -> None:
    """A run (or sweep) on a temporary Prefect server of its own cannot wait for a person: that server has no UI to
    approve in and ends with the command. Refused before anything starts (exit 2)."""
    from grpoflow.trainers.spec import SpecError

    if spec.evaluation.gate.approval:
        raise SpecError(
            "evaluation.gate.approval: a person approves in the Prefect UI, and this run has no Prefect server to "
            "show it (grpoflow run starts a temporary one, without UI, that ends with the run): set PREFECT_API_URL "
            "to your server (`prefect server start`), submit the spec to a deployment (`grpoflow submit`), or "
            "remove approval"
        )


def cmd_run(args, extra_overrides: list[str] = ()) -> int:
    from grpoflow.integrations import prefect_server as server

    # Without a configured Prefect API, the temporary server boots while the spec loads, the preflight runs and the
    # pipeline's modules import (its boot is the longest of them); a job that cannot run stops it before it answered,
    # and never becomes a flow run.
    previous, temporary = _stop_on_signals(), None
    try:
        temporary = server.start_if_needed()
        spec = load(args, extra_overrides)
        if temporary is not None:
            refuse_approval(spec)
        if getattr(args, "resume", None):
            check_resume(spec, args.resume)
            if done := resumed_job_done(spec, args.resume):
                print_result(args, done, spec)
                return EXIT_OK
        preflight(args, spec)
        check_this_machine(spec)
        from grpoflow.flows.pipeline import grpo_pipeline
        from grpoflow.integrations.stages import REJECTED
        from grpoflow.jobs.report import waited_since

        _quiet_prefect_console()  # Prefect's logging is set up now (importing the flow did it)

        # The report's wall time is the one the user waited: from this command's start.
        with server.connected(temporary), waited_since(getattr(args, "started", None) or time.time()):
            try:
                state = grpo_pipeline(spec, job_id=getattr(args, "resume", None), return_state=True)
            except BaseException:
                if not _STOPPED_BY:
                    raise
                _stopped()
                raise Stopped(_STOPPED_BY[0]) from None
    except KeyboardInterrupt:  # before the flow started (the server booting, the imports) or after it ended
        if not _STOPPED_BY:
            raise
        print(f"grpoflow: stopped by {signal.Signals(_STOPPED_BY[0]).name}", file=sys.stderr)
        raise Stopped(_STOPPED_BY[0]) from None
    finally:
        if temporary is not None:
            temporary.stop()  # last: the job's end (job.failed, the flow run's state) went through it
        _restore_signals(previous)
    if state.name == REJECTED:
        raise Rejected(f"rejected: {state.message}")
    if not state.is_completed():
        from grpoflow.trainers.errors import TrainingSetupError, TrainingStopped

        error = state.result(raise_on_failure=False)
        if isinstance(error, TrainingSetupError):  # the child's SetupError: a fix of the spec or machine, not a retry
            raise Rejected(f"cannot train: {str(error).removeprefix('grpoflow: ')}")
        if isinstance(error, TrainingStopped):  # the health monitor's stop (NaN, stop_on_alert): no crash to retry
            raise Diverged(f"run stopped: {error}")
        raise Failed(f"run failed: {type(error).__name__}: {error}")
    result = state.result()
    out = print_result(args, result, spec)
    _say_if_not_promoted(spec, out["job_id"], sys.stderr if args.json else sys.stdout)
    return EXIT_OK


# The signal that stopped `grpoflow run` (SIGINT: Ctrl-C; SIGTERM: kill, systemd, a CI timeout), once one did.
_STOPPED_BY: list[int] = []


def _interrupt(signum, frame) -> None:
    """The first SIGINT or SIGTERM becomes a KeyboardInterrupt, which the job's end (grpoflow.tasks.job.JobEnding)
    turns into job.failed (reason cancelled); further ones are ignored so that the end runs to completion."""
    if _STOPPED_BY:
        return
    _STOPPED_BY.append(signum)
    _quiet_prefect_console()
    raise KeyboardInterrupt(signal.Signals(signum).name)


class _QuietAfterStop(logging.Filter):
    """Once a signal stopped the run, Prefect's console reports of it ("Crash detected! ... KeyboardInterrupt", its
    traceback, "Finished in state Crashed/Cancelled") are the stop itself, which grpoflow says in one line: they are
    kept out of the terminal. They still reach the Prefect API's logs (another handler) for the run's page."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect") or record.levelno < logging.INFO:
            return True
        # Prefect's own SIGTERM handling reports "aborted by a termination signal" before grpoflow's handler runs.
        return not (_STOPPED_BY or "termination signal" in record.getMessage())


def _quiet_prefect_console() -> None:
    for handler in logging.getLogger().handlers:  # the terminal's: Prefect's console handler sits on the root logger
        if not any(isinstance(f, _QuietAfterStop) for f in handler.filters):
            handler.addFilter(_QuietAfterStop())


def _stop_on_signals() -> dict:
    _STOPPED_BY.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _stopped() -> None:
    """One line for a run a signal stopped (its job ended cancelled, checkpoints kept); the flow run is marked
    Cancelled."""
    from grpoflow.tasks.job import cancel_interrupted_runs

    name = signal.Signals(_STOPPED_BY[0]).name
    try:
        jobs = cancel_interrupted_runs(f"stopped by {name}")
    except Exception as e:  # the server unreachable: the run stays Crashed there, which is still true
        print(f"grpoflow: could not mark the flow run cancelled: {type(e).__name__}: {e}", file=sys.stderr)
        jobs = []
    if jobs:
        print(
            f"grpoflow: stopped by {name}: job {jobs[0]} cancelled (flow run marked Cancelled), its checkpoints "
            f"kept; resume with --resume {jobs[0]}",
            file=sys.stderr,
        )
    else:  # stopped before the job existed
        print(f"grpoflow: stopped by {name}", file=sys.stderr)


def _say_if_not_promoted(spec, job_id: str, stream) -> None:
    """One line when the promotion gate (evaluation.gate) kept the model from publish and deploy: the run completed."""
    from grpoflow.integrations.jobs import job_dir

    gate = job_dir(spec.output_uri, job_id).root / "gate.json"
    decision = json.loads(gate.read_text()) if gate.exists() else {"promote": True}
    if not decision["promote"]:
        print(f"model not promoted (not published, not deployed): {decision['reason']}", file=stream)


def _score(value) -> str:
    return "not scored" if value is None else f"{value:.3f}"


def cmd_demo(args) -> int:
    args.spec = str(DEMO_SPEC)
    # The shipped dataset is found wherever grpoflow runs from.
    return cmd_run(args, [f"dataset.uri={EXAMPLES / 'data' / 'arithmetic.jsonl'}"])


def cmd_init(args) -> int:
    from grpoflow.flows.project import init_project

    written = init_project(Path(args.dir))
    root = Path(args.dir).resolve()
    for path in written:
        print(path.relative_to(root))
    print(f"wrote a grpoflow project in {root}; next: cd {args.dir} && grpoflow validate spec.yaml (see README.md)")
    return EXIT_OK


def cmd_jobs(args) -> int:
    from grpoflow.integrations.jobs import job_status, local_root
    from grpoflow.integrations.storage import is_remote
    from grpoflow.trainers.jobdir import JobDir
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
    from grpoflow.trainers.held_out import EVAL_PREFIX, EVAL_SECONDS

    rewards = {k: k.split("/")[1] for k in known if re.fullmatch(r"rewards/[^/]+/mean", k)}
    held_out = {k: k for k in known if k.startswith(EVAL_PREFIX) and k != EVAL_SECONDS}
    first, rest = list(MAIN_METRICS.items())[:2], list(MAIN_METRICS.items())[2:]
    columns = {**dict(first), **rewards, **dict(rest), **held_out}
    return {k: name for k, name in columns.items() if k in known}


def metrics_table(records: list[dict], columns: dict[str, str]) -> str:
    """The records as an aligned table: a step per row, a column per key of `columns` ({key: header})."""
    from grpoflow.trainers.spec.markdown import number

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
    from grpoflow.integrations.jobs import UnknownJob
    from grpoflow.trainers.rollouts import rollout_record, rollouts_table, select_rollouts

    try:
        job, location = find_args_job(args, args.job_id)
    except UnknownJob as e:  # a command that only reads: an id it cannot find is the user's to fix (exit 2)
        raise UsageError(str(e)) from None
    _fetch_rollouts(job, location)
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


def _fetch_rollouts(job, location: str) -> None:
    """A remote job's rollouts/ into its local copy (which holds only its top-level files); new files only."""
    from grpoflow.integrations.storage import filesystem, is_remote

    if not is_remote(location):
        return
    fs, remote = filesystem(location)
    folder = f"{remote.rstrip('/')}/rollouts"
    for name in fs.ls(folder, detail=False) if fs.exists(folder) else []:
        local = job.rollouts / name.rsplit("/", 1)[-1]
        if name.endswith(".parquet") and not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(name, str(local))


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


def _step(text: str) -> int:
    """argparse type of --step: an integer >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number (an integer >= 0)")
    return int(text)


def cmd_model(args) -> int:
    from grpoflow.integrations.jobs import UnknownJob, job_status
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


def cmd_deployments_apply(args) -> int:
    import asyncio

    from grpoflow.flows.deployments import (
        api_url,
        deploy_all,
        describe_deployments,
        ensure_pools,
        load_pools,
        start_watchers,
    )
    from grpoflow.flows.project import project_files

    project = Path(args.project).resolve()
    prefect_file, pools_file = project_files(project)
    url = api_url()
    for line in asyncio.run(ensure_pools(load_pools(pools_file))):
        print(line)
    deploy_all(prefect_file, project)
    for line in asyncio.run(describe_deployments(prefect_file)):
        print(line)
    for line in asyncio.run(start_watchers(prefect_file)):
        print(line)
    print(f"deployed to {url}; start a worker with: prefect worker start --pool grpo-gpu")
    return EXIT_OK


def cmd_submit(args) -> int:
    import asyncio

    from grpoflow.flows.deployments import api_url, deployment_name, flow_run_url, submit, wait_for

    spec = load(args)  # a rejected spec stops here: nothing is sent
    api_url()  # no server to send to is said first, before the preflight reads the model and the dataset
    preflight(args, spec)
    flow_run = asyncio.run(submit(spec, args.deployment))
    url = flow_run_url(flow_run)
    if not args.json:
        print(f"submitted {spec.name} to {deployment_name(args.deployment)}: flow run {flow_run.name}")
        print(url)
    if args.wait:
        flow_run = asyncio.run(wait_for(flow_run.id))
    state = flow_run.state.name if flow_run.state else "Scheduled"
    if args.json:
        out = {"flow_run_id": str(flow_run.id), "flow_run_name": flow_run.name, "url": url, "state": state}
        print(json.dumps(out))
    elif args.wait:
        message = flow_run.state.message
        print(f"flow run {flow_run.name}: {state}" + (f" ({message})" if message else ""))
    if args.wait and not flow_run.state.is_completed():
        raise run_ending(flow_run.state)  # the line above said how it ended
    return EXIT_OK


def run_ending(state) -> Exception:
    """What a flow run that did not complete ends the command with, as `grpoflow run` would for the same end: Rejected
    (exit 2) for a rejected spec or a training setup problem, Diverged (4) for the health monitor's stop, else Failed
    (1). A server's run holds its exception only as the state's message, which Prefect begins with the class name."""
    from grpoflow.integrations.stages import REJECTED

    message = state.message or ""
    if state.name == REJECTED or message.startswith("Flow run encountered an exception: TrainingSetupError: "):
        return Rejected("")
    if message.startswith("Flow run encountered an exception: TrainingStopped: "):
        return Diverged("")
    return Failed("")


def cmd_sweep(args) -> int:
    """`grpoflow sweep SPEC --grid k=v1,v2 ...`: every combination validated (and preflighted) first, then one job
    per combination (flows/sweep.py), then the comparison report. Exit 0 all completed, 1 some failed, 2 rejected."""
    from grpoflow.flows.sweep import combination_name, combination_spec, grid_overrides, new_sweep_id, parse_grid
    from grpoflow.trainers.spec import SpecError

    grid = parse_grid(args.grid or [])
    spec = load(args)
    if not args.deployment:  # the jobs run here, on this command's Prefect server
        from grpoflow.integrations import prefect_server as server

        if server.needed():
            refuse_approval(spec)
    combinations = grid_overrides(spec, grid)
    if args.deployment:
        from grpoflow.flows.deployments import ServerNotSet, api_url

        try:
            api_url()  # jobs on a server's deployment need that server: a temporary one would end with this command
        except ServerNotSet as e:
            raise UsageError(f"--deployment: {e}") from None
    for values in combinations:  # what `run` checks, for each job, before anything starts
        job_spec = combination_spec(spec, values)
        try:
            preflight(args, job_spec)
            check_this_machine(job_spec)
        except SpecError as e:
            raise SpecError([f"combination {combination_name(values)}: {p}" for p in e.problems]) from None
    print(f"sweep of {len(combinations)} jobs, at most {args.max_concurrent} at once", file=sys.stderr)
    from grpoflow.integrations import prefect_server as server

    sweep_id, previous, temporary = new_sweep_id(spec.name), _stop_on_signals(), None
    try:
        temporary = server.start_if_needed()
        from grpoflow.flows.sweep import grpo_sweep

        with server.connected(temporary):
            state = grpo_sweep(spec, grid, args.max_concurrent, args.deployment, sweep_id=sweep_id, return_state=True)
    except KeyboardInterrupt:
        if not _STOPPED_BY:
            raise
        print(f"grpoflow: sweep stopped by {signal.Signals(_STOPPED_BY[0]).name}", file=sys.stderr)
        raise Stopped(_STOPPED_BY[0]) from None
    finally:
        if temporary is not None:
            temporary.stop()
        _restore_signals(previous)
    return _sweep_result(args, spec, sweep_id, state)


def _sweep_result(args, spec, sweep_id: str, state) -> int:
    """Prints the sweep's report (`--json`: sweep.json with its folder); raises when the sweep did not complete."""
    from grpoflow.flows.sweep import report_dir, table_rows
    from grpoflow.integrations.stages import REJECTED
    from grpoflow.integrations.storage import filesystem, join

    if state.name == REJECTED:
        raise Rejected(f"rejected: {state.message}")
    folder = report_dir(spec.output_uri, sweep_id)
    fs, path = filesystem(join(folder, "sweep.json"))
    if not fs.exists(path):  # the sweep itself broke before its report
        raise Failed(f"sweep failed: {state.message}")
    with fs.open(path, "rb") as f:
        summary = json.loads(f.read())
    if args.json:
        print(
            json.dumps({**summary, "report_dir": folder, "status": "completed" if state.is_completed() else "failed"})
        )
    else:
        best = summary["best"]
        for row, line in zip(summary["jobs"], table_rows(summary["jobs"], None), strict=True):
            mark = "  * best" if best and row["job_id"] == best else ""
            values = ", ".join(f"{k}={v}" for k, v in row["values"].items())
            print(f"{values}: {line['status']}  {line['job']}  held-out {line['held-out before → after']}{mark}")
        print(f"sweep {sweep_id} {state.message}")
        print(f"report: {join(folder, 'sweep.md')}")
    if not state.is_completed():
        raise Failed("")  # the report above says which jobs failed
    return EXIT_OK


def cmd_publish(args) -> int:
    from grpoflow.tasks.publish import publish_and_record
    from grpoflow.trainers.spec import PublishSpec

    job, _ = find_args_job(args, args.job_id)
    try:
        target = PublishSpec(repo_id=args.repo_id, artifact=args.artifact, private=not args.public)
    except ValueError as e:  # pydantic names the rule the repo id breaks
        raise UsageError(f"--repo-id {args.repo_id!r}: {e.errors()[0]['msg']}") from None
    result = publish_and_record(job, target)
    change = "new commit" if result["changed"] else "unchanged"
    print(json.dumps(result) if args.json else f"{result['url']} ({change})")
    return EXIT_OK


def cmd_deploy(args) -> int:
    from grpoflow.integrations import webhooks
    from grpoflow.integrations.events import emit
    from grpoflow.jobs.registry import register
    from grpoflow.tasks.register import registered_payload
    from grpoflow.trainers.spec import load_spec

    if args.rollback:
        if args.job_id:
            raise UsageError("deploy: give a JOB_ID to register or --rollback NAME, not both")
        return cmd_rollback(args)
    if not args.job_id:
        raise UsageError("deploy: give the JOB_ID to register (or --rollback NAME)")
    job, _ = find_args_job(args, args.job_id)
    spec, _ = load_spec(job.spec)
    name = args.name or (spec.deploy.name if spec.deploy else spec.name)
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
        raise UsageError(f"--name {name!r}: use lowercase letters, digits, '-', '_' or '.', at most 63 characters")
    record = register(job, name)
    emit(job, "grpoflow.deployment.registered", registered_payload(record))
    webhooks.flush()  # the deliveries run in a thread that ends with this process
    where = f"{record['artifact_path']} (version {record['version']})"
    print(json.dumps(record) if args.json else f"deployment {name} {record['status']}: {where}")
    return EXIT_OK


def registry_roots(args) -> list[Path]:
    """The output roots whose `deployments/` to read: `--output-uri` alone when given, else `./runs` and the job
    index's local roots (`roots_to_search`), since `grpoflow deploy` registers a job beside its own folder."""
    from grpoflow.integrations.storage import is_remote

    if output_uri(args) is not None:
        return [output_root(args).resolve()]
    return [Path(root) for root in roots_to_search(args) if not is_remote(root)]


def deployment_root(args, name: str) -> Path:
    """The one output root (`registry_roots`) whose registry holds deployment `name`; a `UsageError` (exit 2, a name
    to fix as an unknown job id is) naming the roots looked in when none does, or those that do when several do."""
    from grpoflow.jobs.registry import registry_dir

    roots = registry_roots(args)
    holding = [root for root in roots if (registry_dir(root) / f"{name}.json").is_file()]
    if len(holding) > 1:
        where = ", ".join(map(str, holding))
        raise UsageError(f"deployment {name!r} is registered under {where}: pick one with --output-uri")
    if not holding:
        known = sorted({p.stem for root in roots for p in registry_dir(root).glob("*.json")})
        where = ", ".join(str(registry_dir(root)) for root in roots)
        raise UsageError(f"unknown deployment {name!r} under {where}; registered: {', '.join(known) or 'none'}")
    return holding[0]


def _version_line(version: dict, current: int | None) -> str:
    score = "not scored" if version.get("score") is None else f"{version.get('metric')} {version['score']:.3f}"
    mark = "*" if version["version"] == current else " "
    return f"{mark} v{version['version']:<3} {version['job_id']:<50} {score:<24} {version['status']:<11} " + (
        version.get("registered") or ""
    )


def cmd_rollback(args) -> int:
    from grpoflow.jobs.registry import rollback

    restored, replaced = rollback(deployment_root(args, args.rollback), args.rollback)
    if args.json:
        print(json.dumps({"name": args.rollback, "current": restored, "replaced": replaced}))
    else:
        print(f"deployment {args.rollback} rolled back to version {restored['version']} (job {restored['job_id']}),")
        print(f"replacing version {replaced['version']} (job {replaced['job_id']})")
    return EXIT_OK


def cmd_deployments_list(args) -> int:
    from grpoflow.jobs.registry import list_deployments, registry_dir

    explicit, roots = output_uri(args) is not None, registry_roots(args)
    # Each record names its root when several were searched, as `grpoflow jobs` does.
    records = [{**r, **({} if explicit else {"root": str(root)})} for root in roots for r in list_deployments(root)]
    if args.json:
        print(json.dumps({"deployments": records}))
        return EXIT_OK
    if not records:
        print(f"no deployments under {', '.join(str(registry_dir(root)) for root in roots)}")
    for record in records:
        where = f"  {record['root']}" if "root" in record else ""
        print(f"{record['name']}  (current: {'v' + str(record['current']) if record['current'] else 'none'}){where}")
        for version in record["versions"]:
            print("  " + _version_line(version, record["current"]))
    return EXIT_OK


def cmd_serve(args) -> int:
    from grpoflow.jobs.registry import read_deployment
    from grpoflow.trainers.model.serve import serve

    record = read_deployment(deployment_root(args, args.name), args.name)
    if record["status"] != "ready":
        raise Failed(f"deployment {args.name} is {record['status']}, not ready")
    serve(record["artifact_path"], args.name, args.host, args.port)
    return EXIT_OK


def _port(text: str) -> int:
    """argparse type of --port: a TCP port, 1 to 65535 (checked before any model is loaded)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def _add_model_commands(sub) -> None:
    """`publish`, `deploy` and `serve`: push a job's model to the Hub (jobs/publish.py), register its merged
    weights for serving and serve them (jobs/registry.py)."""
    deploy = sub.add_parser("deploy", help="register a serving deployment from a job's merged weights")
    _job_id_argument(deploy, nargs="?")
    deploy.add_argument("--rollback", metavar="NAME", help="make deployment NAME's previous version current again")
    deploy.add_argument("--name", help="deployment name (default: the spec's deploy.name, else its name)")
    deploy.add_argument("--json", action="store_true", help="print the registered version's record as JSON")
    deploy.set_defaults(func=cmd_deploy)
    publish = sub.add_parser("publish", help="push a job's merged weights or adapter to the Hugging Face Hub")
    _job_id_argument(publish)
    publish.add_argument("--repo-id", required=True, help="owner/name on the Hub")
    publish.add_argument(
        "--artifact", choices=["merged", "adapter"], default="merged", help="what to push (default: merged)"
    )
    publish.add_argument("--public", action="store_true", help="create the repo public (default: private)")
    publish.add_argument("--json", action="store_true", help="print the result (repo, URL, commit) as JSON")
    publish.set_defaults(func=cmd_publish)
    serve = sub.add_parser("serve", help="serve a registered deployment over an OpenAI-compatible HTTP API")
    serve.add_argument("name", help="a registered deployment (see grpoflow deployments list)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=_port, default=8000, help="TCP port (default: 8000)")
    serve.set_defaults(func=cmd_serve)
    for p in (deploy, publish, serve):
        _hidden_output_uri(p)


# --- argument parsing


class _Parser(argparse.ArgumentParser):
    """Every grpoflow parser: a mistake is a `UsageError` (exit 2), and `--help` ends with the command's exit codes
    (`grpoflow.flows.errors.COMMAND_EXITS`, by the words after `grpoflow` in its prog)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # the codes one a line
        super().__init__(*args, **kwargs)
        if self.epilog is None:
            command = self.prog.split(" ", 1)[1] if " " in self.prog else None
            self.epilog = exits_epilog(command)

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _add_server_commands(sub) -> None:
    """`deployments apply` and `submit`: grpoflow on a Prefect server (flows/deployments.py)."""
    deployments = sub.add_parser(
        "deployments", help="deploy grpoflow to the Prefect server at PREFECT_API_URL, or list serving deployments"
    )
    actions = deployments.add_subparsers(dest="action", required=True, parser_class=_Parser)
    apply = actions.add_parser(
        "apply", help="create the work pools when missing and deploy the project's prefect.yaml (`grpoflow init`)"
    )
    apply.add_argument("--project", default=".", metavar="DIR", help="the project folder (default: this one)")
    apply.set_defaults(func=cmd_deployments_apply)
    listing = actions.add_parser("list", help="every registered serving deployment with its versions (* current)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    _hidden_output_uri(listing)
    listing.set_defaults(func=cmd_deployments_list)
    submit = sub.add_parser("submit", help="validate a spec here, then start a deployment's run with it")
    _spec_arguments(submit)
    submit.add_argument("--deployment", default="retrain", help="a deployment of grpo-pipeline (default: retrain)")
    submit.add_argument("--wait", action="store_true", help="wait for the run to end; exit 1 unless it completed")
    submit.add_argument("--json", action="store_true", help="print JSON")
    submit.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight checks of the model, dataset and rewards (for paths that are the worker's)",
    )
    _hidden_output_uri(submit)
    submit.set_defaults(func=cmd_submit)


def _add_sweep_command(sub) -> None:
    """`sweep`: one job per combination of grid values, then a comparison report (flows/sweep.py)."""
    sweep = sub.add_parser("sweep", help="run one job per combination of --grid values, then compare them")
    _spec_arguments(sweep)
    sweep.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        help="a spec field (dotted path, as --set) and the values to try; each combination of grids is one job",
    )
    sweep.add_argument("--max-concurrent", type=_positive, default=1, metavar="N", help="jobs at once (default: 1)")
    sweep.add_argument(
        "--deployment",
        help="run each job as a flow run of this grpo-pipeline deployment (e.g. retrain) on PREFECT_API_URL's "
        "server, instead of here",
    )
    sweep.add_argument("--json", action="store_true", help="print the report as JSON")
    sweep.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight checks of the model, dataset and rewards (for paths that are the worker's)",
    )
    _hidden_output_uri(sweep)
    sweep.set_defaults(func=cmd_sweep)


def cmd_canary(args) -> int:
    """`grpoflow canary SPEC`: the canary's one full-length step here, on this machine's devices (jobs/canary.py)."""
    import datasets

    from grpoflow.integrations.storage import storage_options
    from grpoflow.jobs.canary import run_canary, summary_line
    from grpoflow.trainers.dataset import ingest_dataset

    spec = load(args)
    preflight(args, spec)  # a spec, dataset or reward mistake: named, exit 2, before any model loads
    datasets.disable_progress_bars()  # the ingest's bars would bury the verdict
    with tempfile.TemporaryDirectory(prefix="grpoflow-canary-data-") as tmp:
        dataset = Path(tmp) / "dataset"
        ingest_dataset(
            spec.dataset.uri, dataset, prompt_column=spec.dataset.prompt_column,
            storage_options=storage_options(spec.dataset.uri),
        )  # fmt: skip
        result = run_canary(spec, dataset)
    print(json.dumps(result, indent=2) if args.json else summary_line(result, spec))
    if result["status"] != "passed":
        # --json: stdout holds the answer already (canary.json's object), not main's {"status": "rejected"} too.
        args.json = False
        raise Rejected("the canary failed: the job would not run here as specified")
    return EXIT_OK


def cmd_graders_run(args) -> int:
    from grpoflow.integrations.storage import storage_options
    from grpoflow.trainers.graders.run import score_completions, table

    spec = load(args)
    completions = Path(args.completions) if args.completions else None
    scores = score_completions(spec, completions, args.rows, storage_options(spec.dataset.uri))
    print(json.dumps(scores.as_json()) if args.json else table(scores))
    return EXIT_OK


def _add_graders_command(sub) -> None:
    """`graders run`: a spec's rewards on given completions, as training scores them (trainers/graders/run.py)."""
    run = _spec_subcommand(
        sub,
        ("graders", "score completions with a spec's rewards (OpenAI graders included)"),
        ("run", "score completions against the dataset's rows with every reward of the spec, as training would"),
    )
    run.add_argument(
        "--completions",
        metavar="FILE.jsonl",
        help='lines of {"row": i, "completion": ...}, i a 0-based dataset row (default: the dataset\'s completion '
        "column)",
    )
    run.add_argument("--rows", type=_positive, metavar="N", help="score only the first N completions")
    run.add_argument("--json", action="store_true", help='print {"scores": [{"row", "rewards", "total"}]}')
    _hidden_output_uri(run)
    run.set_defaults(func=cmd_graders_run)


def cmd_k8s_render(args) -> int:
    import secrets

    from grpoflow.cluster.kube import IMAGE_ENV
    from grpoflow.cluster.trainjob import rendered
    from grpoflow.trainers.spec import SpecError

    spec = load(args)
    if spec.distributed.num_machines < 2:
        raise SpecError(
            "distributed.num_machines: 1 trains in the flow run's own process and creates no Kubernetes object; "
            "render is for several machines (set distributed.num_machines >= 2)"
        )
    image = args.image or os.environ.get(IMAGE_ENV)
    if not image:
        raise UsageError(f"k8s render: give the training image with --image or {IMAGE_ENV}")
    job_id = f"{spec.name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"  # as the next run's would be
    print(yaml.safe_dump_all(rendered(spec, image, job_id), sort_keys=False), end="")
    return EXIT_OK


def _add_k8s_command(sub) -> None:
    """`k8s render`: the Kubernetes objects of a several-machine job, without a cluster (cluster/trainjob.py)."""
    render = _spec_subcommand(
        sub,
        ("k8s", "the Kubernetes objects of a several-machine job"),
        ("render", "print, as YAML documents, every Kubernetes object a several-machine job would create"),
    )
    render.add_argument("--image", help="the training image (default: GRPOFLOW_IMAGE)")
    _hidden_output_uri(render)
    render.set_defaults(func=cmd_k8s_render)


def _positive(text: str) -> int:
    """argparse type of --max-concurrent: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def _spec_arguments(parser) -> None:
    """The spec file and its `--set` overrides, as every command that reads a spec takes them."""
    parser.add_argument("spec", help="job spec YAML file")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a spec field (dotted path)")


def _spec_subcommand(sub, group: tuple[str, str], action: tuple[str, str]):
    """`grpoflow GROUP ACTION SPEC [--set ...]` (each a (name, help) pair): the action's parser, for its options."""
    parent = sub.add_parser(group[0], help=group[1])
    actions = parent.add_subparsers(dest="action", required=True, parser_class=_Parser)
    parser = actions.add_parser(action[0], help=action[1])
    _spec_arguments(parser)
    return parser


def _job_id_argument(parser, **kwargs) -> None:
    """The JOB_ID positional of the commands that read a job back."""
    parser.add_argument("job_id", help="a job's id, as grpoflow jobs lists it", **kwargs)


def _hidden_output_uri(parser) -> None:
    """`--output-uri` after the command too (`grpoflow --output-uri DIR CMD` is the documented form)."""
    parser.add_argument("--output-uri", dest="output_uri", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="grpoflow", description="GRPO fine-tuning pipelines on Prefect.")
    parser.add_argument("--output-uri", help="output root for jobs (default: the spec's output_uri, else ./runs)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def spec_command(name, help_text):
        p = sub.add_parser(name, help=help_text)
        _spec_arguments(p)
        p.add_argument("--json", action="store_true", help="print JSON")
        return p

    validate = spec_command("validate", "check a spec and print it with every default filled")
    validate.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight checks of the model, dataset and rewards (for paths that are the worker's)",
    )
    validate.set_defaults(func=cmd_validate)
    canary = spec_command("canary", "one training step at full length here: does the job fit, how long will it take")
    canary.set_defaults(func=cmd_canary)
    run = spec_command("run", "run the whole pipeline")
    run.add_argument("--resume", metavar="JOB_ID", help="continue an existing job folder")
    run.set_defaults(func=cmd_run)
    demo = sub.add_parser("demo", help="run the shipped arithmetic example offline on CPU")
    demo.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a field of the shipped spec (dotted path)"
    )
    demo.add_argument("--json", action="store_true", help='print {"job_id", "output_dir", "status"}')
    demo.set_defaults(func=cmd_demo)
    init = sub.add_parser("init", help="write a project of your own: prefect.yaml, a spec, a reward module, data/")
    init.add_argument("dir", help="the project folder to create (new or empty)")
    init.set_defaults(func=cmd_init)
    jobs = sub.add_parser("jobs", help="list jobs under the output root")
    jobs.add_argument(
        "--json", action="store_true", help='print {"jobs": [{"job_id", "status", "steps", "stopped_by"}]}'
    )
    jobs.set_defaults(func=cmd_jobs)
    metrics = sub.add_parser(
        "metrics",
        help="a job's metric series",
        description="A table of the main series per step: reward, reward_std, each reward's mean, kl, loss, "
        "completion length (length), share of completions cut (clipped), held-out score (eval/<metric>).",
    )
    _job_id_argument(metrics)
    metrics.add_argument(
        "--keys", help="comma-separated metric names as metrics.jsonl has them, e.g. reward,rewards/exact_answer/mean"
    )
    metrics.add_argument("--all", action="store_true", help="every series the job logged (~45 columns)")
    metrics.add_argument("--json", action="store_true", help='print {"metrics": [{"step", "values"}]}')
    metrics.set_defaults(func=cmd_metrics)
    model = sub.add_parser("model", help="a job's trained artifact (model.json)")
    _job_id_argument(model)
    model.add_argument("--json", action="store_true", help="print JSON (default: YAML)")
    model.set_defaults(func=cmd_model)
    _add_webhooks_command(sub)
    _add_server_commands(sub)
    _add_model_commands(sub)
    _add_sweep_command(sub)
    _add_graders_command(sub)
    _add_k8s_command(sub)
    _add_rollouts_command(sub)
    add_policy_command(sub)
    for p in (run, demo, jobs, metrics, model, sub.choices["validate"]):
        _hidden_output_uri(p)
    return parser


def main(argv=None) -> int:
    started, args = time.time(), None
    try:
        args = build_parser().parse_args(argv)
        args.started = started
        with command_line():  # the user's own command: its specs may name any module (trainers/trust.py)
            return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C before `run` handles it (loading the spec, the preflight), or another command
        print("grpoflow: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception as e:
        code = exit_code(e)
        if code is None:  # a bug: its traceback
            raise
        if str(e):  # a parser's mistake names its command already (`grpoflow validate: ...`)
            named = isinstance(e, UsageError) and str(e).startswith("grpoflow")
            print(str(e) if named else f"grpoflow: {e}", file=sys.stderr)
        if code == EXIT_REJECTED and getattr(args, "json", False):  # a script reading stdout gets an answer too
            print(json.dumps({"status": "rejected", "problems": getattr(e, "problems", None) or [str(e)]}))
        return code


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or terminal) whose reader went away, as `grpoflow jobs | head -3` leaves it; not a
    broken pipe of another kind (a socket, a child's stdin), which stays a traceback."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def entry() -> None:
    """The `grpoflow` command: `main()`, its return value the exit code."""
    try:
        code = main()
        if sys.stdout is not None:  # None when started with stdout closed (`>&-`)
            sys.stdout.flush()  # here, not at exit, so that a reader gone away is caught below
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        # Python's advice (the signal module's "Note on SIGPIPE"): stdout to devnull, so the flush at exit cannot fail
        # again, and exit quietly; 128 + SIGPIPE, the code of a program SIGPIPE ended (`yes | head`).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    sys.exit(code)


if __name__ == "__main__":
    entry()
