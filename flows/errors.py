"""What a `grpoflow` command raises, the one table from it to the command's exit code, and the one table of what each
command's codes mean, which its `--help` shows (docs/design.md, "The CLI").

Commands raise; `grpoflow.flows.cli.main` prints `grpoflow: <message>` (nothing for an empty message: the command's
own output said it) and exits with the code `EXIT_CODES` gives. A module of its own, so that the classes are the same
objects however the CLI runs (`grpoflow`, or `python -m grpoflow.flows.cli`, whose module is `__main__`).
"""

import textwrap

EXIT_OK, EXIT_FAILED, EXIT_REJECTED, EXIT_DIVERGED = 0, 1, 2, 4


class UsageError(Exception):
    """A user's mistake on the command line: printed as one message, exit code 2."""


class Rejected(Exception):
    """The job cannot run as given (its flow run ended Rejected, or its child found a setup problem): exit code 2."""


class Failed(Exception):
    """The command ran and what it ran failed: exit code 1. Its message, when it has one, is printed; an empty one
    means the command's own output already said what failed."""


class Diverged(Exception):
    """The run's health monitor stopped it (its training diverged, or an alert with stop_on_alert): exit code 4, so
    that a script can tell it from a crash (1): a retry would meet it again; the message says what to change."""


class Stopped(Exception):
    """A signal stopped the command (its job's end already said so): exit code 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__("")
        self.signum = signum


# The one table from what a command raised to its exit code (docs/design.md): 2 for what the user must change, 1
# for what failed, 4 for a run its health monitor stopped. Keyed by the class's qualified name, matched along the
# raised class's MRO, so that a command's error costs no import of the modules that define the others. The message is
# printed as `grpoflow: <message>`.
EXIT_CODES = {
    "grpoflow.core.spec.loading.SpecError": EXIT_REJECTED,
    "grpoflow.flows.errors.UsageError": EXIT_REJECTED,
    "grpoflow.core.policy.PolicyError": EXIT_REJECTED,
    "grpoflow.flows.errors.Rejected": EXIT_REJECTED,
    "grpoflow.flows.project.ProjectError": EXIT_REJECTED,
    "grpoflow.flows.deployments.ServerNotSet": EXIT_REJECTED,
    "grpoflow.jobs.publish.PublishError": lambda e: EXIT_REJECTED if e.user_error else EXIT_FAILED,
    "grpoflow.flows.deployments.DeploymentError": EXIT_FAILED,
    "grpoflow.jobs.registry.RegistrationError": EXIT_FAILED,
    "grpoflow.integrations.job_folders.UnknownJob": EXIT_REJECTED,
    "grpoflow.jobs.compare.NotComparable": EXIT_REJECTED,
    "grpoflow.jobs.lock.JobLocked": EXIT_REJECTED,
    "grpoflow.integrations.job_folders.BadJobReference": EXIT_REJECTED,
    "grpoflow.integrations.prefect_server.ServerError": EXIT_FAILED,
    "grpoflow.flows.errors.Failed": EXIT_FAILED,
    "grpoflow.flows.errors.Diverged": EXIT_DIVERGED,
    "grpoflow.flows.errors.Stopped": lambda e: 128 + e.signum,
}


def exit_code(error: BaseException) -> int | None:
    """The exit code `EXIT_CODES` gives `error`'s class (or the nearest base class it lists); None for a bug."""
    for cls in type(error).__mro__:
        code = EXIT_CODES.get(f"{cls.__module__}.{cls.__qualname__}")
        if code is not None:
            return code(error) if callable(code) else code
    return None


# --- what each command's exit codes mean, which its --help says

# One meaning per code, for every command (`grpoflow --help`); each command's own words for them are `COMMAND_EXITS`.
MEANINGS = {
    EXIT_OK: "done",
    EXIT_FAILED: "what the command ran failed",
    EXIT_REJECTED: "bad input: a spec, dataset or argument to fix, an unknown job id, a job another run holds",
    EXIT_DIVERGED: "a run the health monitor stopped (diverged)",
}
SIGNALLED = ("128+N", "stopped by signal N (Ctrl-C: 130)")

BAD_SPEC = "a rejected spec, dataset, reward or argument"
UNKNOWN_JOB = "an unknown job id or bad argument"
RUN = {
    EXIT_OK: "completed",
    EXIT_FAILED: "the run failed (after its retries)",
    EXIT_REJECTED: f"{BAD_SPEC}, a training setup problem (not retried), an unknown or locked job to --resume",
    EXIT_DIVERGED: "stopped by the health monitor (NaN or inf, an alert with stop_on_alert, a stall)",
}
# Each command's exit codes in its own words (the key: the words after `grpoflow`), its `--help` epilog.
COMMAND_EXITS = {
    "validate": {EXIT_OK: "valid", EXIT_REJECTED: BAD_SPEC},
    "canary": {EXIT_OK: "passed", EXIT_REJECTED: f"the canary failed, or {BAD_SPEC}"},
    "run": RUN,
    "demo": {**RUN, EXIT_REJECTED: "a bad --set, a training setup problem (not retried)"},
    "init": {EXIT_OK: "written", EXIT_REJECTED: "the folder is not new or empty"},
    "jobs": {EXIT_OK: "listed", EXIT_REJECTED: "an output root that is not a folder or cannot be read"},
    "metrics": {EXIT_OK: "printed", EXIT_REJECTED: "an unknown job id or metric key"},
    "model": {EXIT_OK: "printed", EXIT_REJECTED: "an unknown job id, or a job without a trained model yet"},
    "rollouts": {EXIT_OK: "printed", EXIT_REJECTED: UNKNOWN_JOB},
    "compare": {
        EXIT_OK: "printed",
        EXIT_REJECTED: f"{UNKNOWN_JOB}, a job without per-prompt held-out scores, jobs of different metrics or "
        "sharing no held-out prompt",
    },
    "sweep compare": {
        EXIT_OK: "printed",
        EXIT_REJECTED: "an unknown sweep, --baseline or job, fewer than two completed jobs with per-prompt held-out "
        "scores, jobs of different metrics or sharing no held-out prompt",
    },
    "webhooks retry": {
        EXIT_OK: "none left undelivered",
        EXIT_FAILED: "some still undelivered",
        EXIT_REJECTED: "an unknown job id, or a job a live run holds (that run sends its own)",
    },
    "deployments apply": {
        EXIT_OK: "deployed",
        EXIT_FAILED: "the Prefect server failed or refused a deployment",
        EXIT_REJECTED: "no server to deploy to (PREFECT_API_URL), or a project file to fix",
    },
    "deployments list": {EXIT_OK: "listed (old spelling of serving list)", EXIT_REJECTED: "a bad argument"},
    "policy show": {EXIT_OK: "printed", EXIT_REJECTED: "a policy file with a mistake"},
    "policy check": {
        EXIT_OK: "a deployment run of the spec is allowed",
        EXIT_REJECTED: f"it would be refused (one line a field), {BAD_SPEC}, or a policy file with a mistake",
    },
    "submit": {
        EXIT_OK: "submitted (--wait: completed)",
        EXIT_FAILED: "the server failed, or (--wait) the run failed or was cancelled",
        EXIT_REJECTED: f"{BAD_SPEC}, no server to submit to (PREFECT_API_URL), or (--wait) the run ended Rejected "
        "or with a training setup problem",
        EXIT_DIVERGED: "(--wait) the run's health monitor stopped it",
    },
    "sweep": {EXIT_OK: "every job completed", EXIT_FAILED: "some job failed", EXIT_REJECTED: f"{BAD_SPEC} or grid"},
    "publish": {
        EXIT_OK: "pushed",
        EXIT_FAILED: "the Hub failed (a transient error: try again)",
        EXIT_REJECTED: "an unknown job id, a bad --repo-id, no Hub token, no such artifact, the Hub refused it",
    },
    "serving register": {
        EXIT_OK: "registered",
        EXIT_FAILED: "registering failed (no merged weights, the smoke inference failed)",
        EXIT_REJECTED: "an unknown job id, a bad --name",
    },
    "serving list": {EXIT_OK: "listed", EXIT_REJECTED: "a bad argument"},
    "serving rollback": {
        EXIT_OK: "rolled back",
        EXIT_FAILED: "nothing to roll back to",
        EXIT_REJECTED: "a name the serving registry does not hold",
    },
    "deploy": {
        EXIT_OK: "registered (--rollback: rolled back); old spelling of serving register and serving rollback",
        EXIT_FAILED: "registering failed (no merged weights, the smoke inference failed), nothing to roll back to",
        EXIT_REJECTED: "an unknown job id or serving name, a bad --name",
    },
    "serve": {
        EXIT_OK: "stopped",
        EXIT_FAILED: "the name's current version is not ready",
        EXIT_REJECTED: "a name the serving registry does not hold, a bad --port",
    },
    "graders run": {EXIT_OK: "scored", EXIT_REJECTED: f"{BAD_SPEC}, a bad completions file"},
    "k8s render": {EXIT_OK: "printed", EXIT_REJECTED: BAD_SPEC},
    "api": {
        EXIT_OK: "stopped",
        EXIT_FAILED: "the temporary Prefect server or its deployments failed",
        EXIT_REJECTED: "no keys file, a bad --port, a project to fix",
    },
    "api keys add": {EXIT_OK: "a key printed", EXIT_REJECTED: "a bad --team, or a keys file that cannot be read"},
}


def exits_epilog(command: str | None) -> str | None:
    """The `--help` epilog of `command` (the words after `grpoflow`; None: `grpoflow` itself), its exit codes one a
    line; None for a group of commands (`webhooks`, `k8s`), whose commands each say their own."""
    if command is None:
        head, codes = "exit codes, every command (each command's --help says its own):", [*MEANINGS.items(), SIGNALLED]
    elif command in COMMAND_EXITS:
        head, codes = "exit codes:", sorted(COMMAND_EXITS[command].items())
    else:
        return None
    lines = (textwrap.fill(text, 79, initial_indent=f"  {code:<6}", subsequent_indent=" " * 8) for code, text in codes)
    return "\n".join([head, *lines])
