"""`grpoflow validate`, `canary`, `run`, `demo` and `init`: a spec checked, tried, trained here, and a new project.

grpoflow validate examples/smoke-test.yaml --set hyperparameters.max_steps=5
grpoflow run examples/arithmetic.yaml --json
grpoflow demo
"""

import json
import logging
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from grpoflow.flows.cli.common import DEMO_SPEC, EXAMPLES, check_this_machine, load, preflight, roots_to_search
from grpoflow.flows.errors import (
    EXIT_OK,
    Diverged,
    Failed,
    Rejected,
    Stopped,
    UsageError,
)


def cmd_validate(args) -> int:
    from grpoflow.core.spec import resolved_dict, to_yaml

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
    from grpoflow.integrations.job_folders import resume_problem
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
    from grpoflow.core.scores import gain_text
    from grpoflow.integrations.job_folders import job_dir

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
            gain_ci = (evaluation.get("ci") or {}).get("gain")
            if gain_ci and not evaluation.get("trained"):  # a gain with its interval; none when the start was kept
                after += (
                    f" ({gain_text(evaluation['before'], evaluation['after'], gain_ci, evaluation['confidence'])})"
                )
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
    from grpoflow.core.jobdir import JobDir
    from grpoflow.flows.pipeline import completed_before

    job = JobDir(Path(spec.output_uri).expanduser().resolve() / job_id)
    if not completed_before(job, spec):
        return None
    evaluation = json.loads(job.evaluation.read_text()) if job.evaluation.exists() else None
    print(f"job {job_id} is already completed and up to date: nothing to resume", file=sys.stderr)
    return {"job_id": job_id, "output_dir": str(job.root), "status": "completed", "evaluation": evaluation}


def refuse_approval(spec) -> None:
    """A run (or sweep) on a temporary Prefect server of its own cannot wait for a person: that server has no UI to
    approve in and ends with the command. Refused before anything starts (exit 2)."""
    from grpoflow.core.spec import SpecError

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
        from grpoflow.core.errors import TrainingSetupError, TrainingStopped

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
    """The first SIGINT or SIGTERM becomes a KeyboardInterrupt, which the job's end
    (grpoflow.tasks.bookkeeping.JobEnding) turns into job.failed (reason cancelled); further ones are ignored so that
    the end runs to completion."""
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
    from grpoflow.tasks.bookkeeping import cancel_interrupted_runs

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
    from grpoflow.integrations.job_folders import job_dir

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
