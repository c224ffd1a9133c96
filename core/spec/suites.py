"""The evaluation suites' entries of the job spec (`evaluation.suites`): inspect-ai tasks run on the model GRPO
started from and on the kept model, after the held-out evaluation (`grpoflow.trainers.suites` runs them)."""

from pathlib import Path

from pydantic import Field

from grpoflow.core.spec.fields import Section, SuiteRef


class SuiteSpec(Section):
    """One evaluation suite: an inspect-ai task, scored on the start model and on the kept model."""

    inspect: SuiteRef = Field(
        description="An inspect-ai task, FILE@TASK: a Python file (relative to the folder grpoflow runs in, as "
        "dataset paths are) and the name of an @task function in it, whose dataset is local (e.g. a JSONL file "
        "beside it: nothing is downloaded). Needs the evals extra (pip install grpoflow[evals]).",
    )

    @property
    def file(self) -> Path:
        """The task's Python file."""
        return Path(self.inspect.rpartition("@")[0]).expanduser()

    @property
    def task(self) -> str:
        """The task's name in its file."""
        return self.inspect.rpartition("@")[2]
