"""What a `grpoflow` command raises, and the one table from it to the command's exit code (DESIGN.md, "CLI").

Commands raise; `grpoflow.flows.cli.main` prints `grpoflow: <message>` (nothing for an empty message: the command's
own output said it) and exits with the code `EXIT_CODES` gives. A module of its own, so that the classes are the same
objects however the CLI runs (`grpoflow`, or `python -m grpoflow.flows.cli`, whose module is `__main__`).
"""

EXIT_OK, EXIT_FAILED, EXIT_REJECTED = 0, 1, 2


class UsageError(Exception):
    """A user's mistake on the command line: printed as one message, exit code 2."""


class Rejected(Exception):
    """The job cannot run as given (its flow run ended Rejected, or its child found a setup problem): exit code 2."""


class Failed(Exception):
    """The command ran and what it ran failed: exit code 1. Its message, when it has one, is printed; an empty one
    means the command's own output already said what failed."""


class Stopped(Exception):
    """A signal stopped the command (its job's end already said so): exit code 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__("")
        self.signum = signum


# The one table from what a command raised to its exit code (DESIGN.md, "CLI"): 2 for what the user must change, 1
# for what failed. Keyed by the class's qualified name, matched along the raised class's MRO, so that a command's
# error costs no import of the modules that define the others. The message is printed as `grpoflow: <message>`.
EXIT_CODES = {
    "grpoflow.trainers.spec.loading.SpecError": EXIT_REJECTED,
    "grpoflow.flows.errors.UsageError": EXIT_REJECTED,
    "grpoflow.flows.errors.Rejected": EXIT_REJECTED,
    "grpoflow.flows.project.ProjectError": EXIT_REJECTED,
    "grpoflow.flows.deployments.ServerNotSet": EXIT_REJECTED,
    "grpoflow.jobs.publish.PublishError": lambda e: EXIT_REJECTED if e.user_error else EXIT_FAILED,
    "grpoflow.flows.deployments.DeploymentError": EXIT_FAILED,
    "grpoflow.jobs.registry.RegistrationError": EXIT_FAILED,
    "grpoflow.integrations.jobs.UnknownJob": EXIT_FAILED,
    "grpoflow.integrations.jobs.BadJobReference": EXIT_REJECTED,
    "grpoflow.integrations.prefect_server.ServerError": EXIT_FAILED,
    "grpoflow.flows.errors.Failed": EXIT_FAILED,
    "grpoflow.flows.errors.Stopped": lambda e: 128 + e.signum,
}


def exit_code(error: BaseException) -> int | None:
    """The exit code `EXIT_CODES` gives `error`'s class (or the nearest base class it lists); None for a bug."""
    for cls in type(error).__mro__:
        code = EXIT_CODES.get(f"{cls.__module__}.{cls.__qualname__}")
        if code is not None:
            return code(error) if callable(code) else code
    return None
