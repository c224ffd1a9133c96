"""The exceptions and exit codes the layers share: what a training child's exit means, raised by the job service
(`grpoflow.jobs.launch`) and caught by the tasks, the flows and the several-machine runner.

A child stops on purpose with one of three exit codes and records why (`grpoflow.trainers.child.record_exit`, in
`EXIT_RECORD`): 2 a setup problem no retry can fix, 3 a reward that failed, 4 a run that diverged.
"""

SETUP_ERROR_EXIT = 2
REWARD_FAILED_EXIT = 3
DIVERGED_EXIT = 4
ON_PURPOSE_EXITS = (SETUP_ERROR_EXIT, REWARD_FAILED_EXIT, DIVERGED_EXIT)  # the codes a child records (`record_exit`)
# Where a child records why it stopped on purpose (exit 2 or 3): `accelerate launch` turns any failed rank into
# its own exit code 1, which alone would read as a crash worth retrying.
EXIT_RECORD = "logs/child_exit.json"


class TrainingSetupError(RuntimeError):
    """The training child refused to start (missing library, no CUDA): retrying cannot help."""


class TrainingStopped(RuntimeError):
    """The run was stopped on purpose (the health monitor, with `stop_on_alert`): retrying would stop it again."""


class RewardFailed(RuntimeError):
    """A reward raised, hung or returned a bad value during training (the child's exit code 3): the user's reward,
    not a crash, so retrying would meet it again. The message names the reward and the step."""


class TrainingDiverged(RuntimeError):
    """Raised in a training child when the loss, the gradient norm or the trained weights became NaN or inf
    (`grpoflow.trainers.metrics.finite_callback`): no later step recovers, so the child exits `DIVERGED_EXIT` and the
    task stops the run, naming the learning rate, without a retry."""


class ChildFailed(RuntimeError):
    """The child crashed (an exit code or a signal the other errors do not explain): a retry may cure it. The message
    says how it ended, its log's last telling lines and where the whole log is; `ended` says the first two only."""

    def __init__(self, message: str, ended: str | None = None):
        super().__init__(message)
        self.ended = ended or message


class ChildEndedEarly(RuntimeError):
    """The child exited 0 without writing its result (something inside it ended the process, such as a reward
    calling `os._exit`): not a crash a retry cures."""


class SetupError(RuntimeError):
    """The job cannot run on this machine as specified (missing library, no CUDA); retrying will not help."""


class DatasetError(ValueError):
    """A user's dataset problem; the message names the file, row or column and what to do. `problems` holds each
    problem on its own ("dataset URI: ..."), for a report that lists them beside others (the preflight's)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]
