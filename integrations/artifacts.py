"""What a run shows where Prefect users look: its artifacts, its progress, and the message of its final state.

- `report_artifact`: `report.md` as a markdown artifact, its plots inlined as `data:` URIs (the Prefect UI, V1 and V2,
  renders those; a file path or a relative link shows a broken image), beside the report's table of figures.
- `evaluation_artifact`: the held-out before/after scores as a table artifact.
- `rollouts_artifact`: at each held-out evaluation, a few of the step's rollouts (the best, the worst and one between,
  with every reward's score) as a table artifact.
- `StageProgress`: one line per training step in the run's log, a progress artifact the UI shows as a bar, and a
  one-line bar on an interactive terminal; the SFT and GRPO watchers feed it from their poll callbacks.
- `link_artifact`: the Hub repo after publish, the serving registry's record after register.
- `completed_message`: the final state's message, `completed: exact_answer 0.33 -> 0.75 (+42 pts); healthy`.

Keys are stable per Prefect deployment (a run outside one: per spec name), `<base>-report`, `<base>-evaluation`,
`<base>-sft-progress`, `<base>-training-progress`, `<base>-hub-repo`, `<base>-deployment`, so the Artifacts page holds
each one's history. An artifact that cannot be created is a warning in the log, never a failed job.
"""

import base64
import json
import logging
import re
import shutil
import sys
import time
from collections.abc import Callable

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.context import FlowRunContext, TaskRunContext
from prefect.runtime import deployment

from grpoflow.core.jobdir import JobDir
from grpoflow.core.scores import EVAL_PREFIX, EVAL_SECONDS, change, gain_line
from grpoflow.core.spec import JobSpec
from grpoflow.jobs.canary import projection_line
from grpoflow.jobs.registry import registry_dir
from grpoflow.trainers.budget import budget_line
from grpoflow.trainers.health import HealthMonitor, verdict
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.rollouts import highlight_rows
from grpoflow.trainers.suites import suite_rows

logger = logging.getLogger("grpoflow.artifacts")

_NOT_KEY = re.compile(r"[^a-z0-9]+")  # Prefect keys: lowercase letters, digits and dashes
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")
BAR_WIDTH = 24


def artifact_key(spec: JobSpec, kind: str) -> str:
    """`<base>-<kind>`: base is the Prefect deployment's name for a deployment's run, else the spec's name, in the
    letters Prefect allows (a spec named `arithmetic_demo.v2` outside a deployment: `arithmetic-demo-v2-report`)."""
    base = _NOT_KEY.sub("-", (_deployment_name() or spec.name).lower()).strip("-") or "grpo"
    return f"{base}-{kind}"


def _deployment_name() -> str | None:
    # A run outside any deployment (`grpoflow run`) asks the API nothing.
    flow_run = getattr(FlowRunContext.get(), "flow_run", None)
    if flow_run is not None and flow_run.deployment_id is None:
        return None
    return deployment.name


def _in_run() -> bool:
    # Outside a flow or task run an artifact would belong to nothing (Prefect deprecates it) and could start a server.
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _safely(what: str, create: Callable, *args, **kwargs):
    """Runs an artifact call; a failure (the API down, a rejected payload) is a warning, not a failed stage."""
    if not _in_run():
        return None
    try:
        return create(*args, **kwargs)
    except Exception as e:
        logger.warning("could not create the %s artifact: %s: %s", what, type(e).__name__, e)
        return None


# --- report and evaluation ------------------------------------------------------------------------------------------


def report_markdown(job: JobDir) -> str:
    """`report.md` with each `![name](file.png)` of a plot in the job folder inlined as a `data:image/png` URI."""

    def inline(match: re.Match) -> str:
        path = job.root / match.group(2)
        if not path.is_file():
            return f"*({match.group(1)}: plot missing)*"
        return f"![{match.group(1)}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()})"

    return _IMAGE.sub(inline, job.report.read_text())


def report_artifact(job: JobDir, spec: JobSpec, location: str):
    """The job's report as a markdown artifact (key `<base>-report`), its job folder named at the end."""
    markdown = report_markdown(job) + f"\n\nJob folder: `{location}`\n"
    return _safely(
        "report",
        create_markdown_artifact,
        markdown,
        key=artifact_key(spec, "report"),
        description=f"GRPO job report of {job.job_id}",
    )


def score_change(before, after) -> str:
    """`+42 pts` for scores in [0, 1] (accuracies, pass rates), else the plain difference; `no change` for equal
    scores (`grpoflow.core.scores.change`)."""
    return change(before, after, digits=0, unit=" pts")


def _scored(evaluation: dict | None) -> bool:
    return bool(evaluation) and all(isinstance(evaluation.get(k), int | float) for k in ("before", "after"))


def evaluation_rows(evaluation: dict) -> list[dict]:
    """The evaluation table's one row: metric, prompts, before, after, change, note."""
    row = {"metric": evaluation.get("metric"), "prompts": evaluation.get("n")}
    row["before"], row["after"] = evaluation.get("before"), evaluation.get("after")
    row["change"] = score_change(row["before"], row["after"]) if _scored(evaluation) else "—"
    if _scored(evaluation) and (gain_ci := (evaluation.get("ci") or {}).get("gain")):
        row[f"{100 * evaluation['confidence']:g}% CI of the gain"] = f"{gain_ci[0]:+.4g} to {gain_ci[1]:+.4g}"
    if evaluation.get("selected_step") == 0:
        row["model kept"] = "the starting model (step 0)"
    elif evaluation.get("selected_step") is not None:
        row["model kept"] = f"step {evaluation['selected_step']} ({evaluation.get('select', 'last')})"
    row["note"] = evaluation.get("note") or "before: the model GRPO started from; after: the GRPO result"
    return [row]


def evaluation_artifact(spec: JobSpec, job: JobDir, evaluation: dict | None):
    """The held-out evaluation as a table artifact (key `<base>-evaluation`); none when no evaluation ran."""
    if not evaluation:
        return None
    return _safely(
        "evaluation",
        create_table_artifact,
        evaluation_rows(evaluation),
        key=artifact_key(spec, "evaluation"),
        description=f"Held-out evaluation of {job.job_id}",
    )


def suites_artifact(spec: JobSpec, job: JobDir, suites: dict | None):
    """The evaluation suites (suites.json) as a table artifact (key `<base>-suites`): each inspect-ai metric of the
    start and the kept model; none when the job ran no suites."""
    if not suites:
        return None
    return _safely(
        "suites",
        create_table_artifact,
        suite_rows(suites),
        key=artifact_key(spec, "suites"),
        description=f"Evaluation suites of {job.job_id} (inspect-ai): the model GRPO started from and the kept model",
    )


def samples_artifact(job: JobDir, spec: JobSpec, evaluation: dict | None):
    """A few of the GRPO result's held-out completions with their scores (evaluation.json's `samples`) as a table
    artifact (key `<base>-samples`): what a person reads before approving; none without samples."""
    samples = (evaluation or {}).get("samples")
    if not samples:
        return None
    return _safely(
        "samples",
        create_table_artifact,
        samples,
        key=artifact_key(spec, "samples"),
        description=f"Held-out completions of {job.job_id} (the GRPO result, greedy) and their scores",
    )


def rollouts_artifact(job: JobDir, spec: JobSpec, step: int):
    """The best, the worst and one in-between rollout of `step` (or of the newest kept step before it), with every
    reward's score, as a table artifact (key `<base>-rollouts`); none when no step up to it kept its rollouts."""
    shown, rows = highlight_rows(job, step)
    if not rows:
        return None
    return _safely(
        "rollouts",
        create_table_artifact,
        rows,
        key=artifact_key(spec, "rollouts"),
        description=f"Rollouts of {job.job_id} at step {shown}: the best, the worst and one between by the total "
        f"reward, with each reward's score (all of them: grpoflow rollouts {job.job_id} --step {shown})",
    )


def link_artifact(spec: JobSpec, kind: str, link: str, text: str, description: str):
    """A link artifact (key `<base>-<kind>`): the Hub repo (`hub-repo`) or the serving registry's record
    (`deployment`, its key kept)."""
    return _safely(
        kind, create_link_artifact, link, link_text=text, key=artifact_key(spec, kind), description=description
    )


def serving_link(job: JobDir, record: dict) -> str:
    """The `file://` URI of a name's record in the serving registry."""
    return (registry_dir(job.root.parent) / f"{record['name']}.json").resolve().as_uri()


# --- the final state's message --------------------------------------------------------------------------------------


def score_summary(evaluation: dict | None) -> str:
    """`exact_answer 0.33 -> 0.75 (+42 pts)`, with an interval `exact_answer 0.40 -> 0.62 (+0.22, 95% CI +0.12 to
    +0.31)`, or why there is no score."""
    if not evaluation:
        return "no held-out evaluation"
    if not _scored(evaluation):
        return f"{evaluation.get('metric')} not scored" + (
            f" ({evaluation['note']})" if evaluation.get("note") else ""
        )
    before, after = evaluation["before"], evaluation["after"]
    summary = f"{evaluation['metric']} {before:.2f} -> {after:.2f} ({score_change(before, after)}"
    if (gain_ci := (evaluation.get("ci") or {}).get("gain")) and not evaluation.get("trained"):  # not the start kept
        summary = gain_line(evaluation["metric"], before, after, gain_ci, evaluation.get("confidence"))[:-1]
    if evaluation.get("improved") is False:  # the note says which model is kept, and that none beat the start
        return f"{summary}); {evaluation['note']}"
    kept = f", best at step {evaluation['selected_step']}" if evaluation.get("select") == "best" else ""
    return f"{summary}{kept})"


def completed_message(job: JobDir, spec: JobSpec, evaluation: dict | None) -> str:
    """The message of a completed run's state: the held-out score and the health verdict (as the report's), that the
    budget ended training when it did, the canary's projection beside the time training took, and why the model was not
    promoted when the gate or a person kept it back."""
    alerts = HealthMonitor.for_spec(spec).check(read_metrics(job.metrics))
    message = f"completed: {score_summary(evaluation)}; {verdict(alerts)}"
    training = json.loads(job.training_result.read_text()) if job.training_result.exists() else {}
    if budget := budget_line(training):
        message += f"; {budget}"
    if canary := projection_line(job):
        message += f"; {canary}"
    gate = job.root / "gate.json"
    decision = json.loads(gate.read_text()) if gate.exists() else {"promote": True}
    return message if decision["promote"] else f"{message}; not promoted: {decision['reason']}"


# --- progress -------------------------------------------------------------------------------------------------------


def _number(value, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def eta(seconds: float | None) -> str:
    """`H:MM:SS`, or `-` when the rate is not known yet."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _rate(seconds_per_step: float | None, remaining: int) -> str:
    per_step = f"{seconds_per_step:.2f} s/step" if seconds_per_step is not None else "- s/step"
    return f"{per_step}  ETA {eta(None if seconds_per_step is None else seconds_per_step * remaining)}"


def grpo_line(step: int, total: int, values: dict, seconds_per_step: float | None) -> str:
    """One GRPO step, in the fixed format of the logs and the terminal:

    >>> grpo_line(3, 12, {"reward": 0.25, "reward_std": 0.433, "completions/mean_length": 5.25}, 1.5)
    'step  3/12  reward 0.2500  reward_std 0.4330  kl -  mean_length 5.2  1.50 s/step  ETA 0:00:14'

    A step with a held-out evaluation (`evaluation.every`) shows its score:

    >>> grpo_line(4, 12, {"reward": 0.5, "eval/exact_answer": 0.35, "eval/seconds": 2.1}, None)
    'step  4/12  reward 0.5000  reward_std -  kl -  mean_length -  held-out exact_answer 0.3500  - s/step  ETA -'
    """
    held_out = "".join(
        f"held-out {key.removeprefix(EVAL_PREFIX)} {_number(value)}  "
        for key, value in values.items()
        if key.startswith(EVAL_PREFIX) and key != EVAL_SECONDS
    )
    return (
        f"step {step:>{len(str(total))}}/{total}  reward {_number(values.get('reward'))}  "
        f"reward_std {_number(values.get('reward_std'))}  kl {_number(values.get('kl'))}  "
        f"mean_length {_number(values.get('completions/mean_length'), 1)}  {held_out}"
        f"{_rate(seconds_per_step, total - step)}"
    )


def sft_line(step: int, total: int, values: dict, seconds_per_step: float | None) -> str:
    """One logged SFT step: `sft step  40/200  loss 1.2345  lr 2.9e-03  0.05 s/step  ETA 0:00:08`."""
    lr = values.get("learning_rate")
    return (
        f"sft step {step:>{len(str(total))}}/{total}  loss {_number(values.get('loss'))}  "
        f"lr {f'{lr:.1e}' if isinstance(lr, int | float) else '-'}  {_rate(seconds_per_step, total - step)}"
    )


class StepRate:
    """Seconds per step as the watcher sees them (wall clock between the steps it saw, checkpoints and logging
    included); before two steps were seen, the child's own `step_time` when it logs one."""

    def __init__(self):
        self.first: tuple[float, int] | None = None

    def seconds_per_step(self, step: int, values: dict) -> float | None:
        now = time.monotonic()
        if self.first is None:
            self.first = (now, step)
        started, first_step = self.first
        if step > first_step:
            return (now - started) / (step - first_step)
        own = values.get("step_time")
        return float(own) if isinstance(own, int | float) else None


class StageProgress:
    """A training stage's progress: each line to the run's log, a progress artifact (key `<base>-<stage>-progress`,
    its description the latest line), and, when stderr is a terminal, a one-line bar redrawn in place (never in the
    logs, never in a pipe or file).

    Args:
        spec (`JobSpec`): the job's spec (for the artifact key).
        stage (`str`): `"sft"` or `"training"`.
        total (`int`): the stage's steps.
        log (`logging.Logger`-like): where the lines go (the task's run logger).
        start (`int`, *optional*): the step it starts from (a resumed run).
    """

    UPDATE_EVERY_S = 0.5  # the UI's bar needs no more; a fast SFT logs several steps a second

    def __init__(self, spec: JobSpec, stage: str, total: int, log, start: int = 0):
        self.total, self.log, self.tty = total, log, sys.stderr.isatty()
        self.updated, self.bar, self.step = 0.0, "", start
        self.artifact_id = _safely(
            f"{stage} progress",
            create_progress_artifact,
            100 * start / total,
            key=artifact_key(spec, f"{stage}-progress"),
            description=f"{'SFT warm-up' if stage == 'sft' else 'GRPO training'}: starting",
        )

    def update(self, step: int, line: str) -> None:
        """Logs `line`, then moves the artifact and the terminal bar (captioned with `line`) to `step`."""
        self._clear_bar()
        self.log.info(line)
        step = self.step = min(step, self.total)
        now = time.monotonic()
        if self.artifact_id is not None and (now - self.updated >= self.UPDATE_EVERY_S or step == self.total):
            self.updated = now
            percent = 100 * step / self.total
            if _safely("progress", update_progress_artifact, self.artifact_id, percent, description=line) is None:
                self.artifact_id = None  # warned once; the stage goes on without it
        if self.tty:
            done = BAR_WIDTH * step // self.total
            # Cut to the terminal's width: a wrapped line could not be redrawn in place.
            width = shutil.get_terminal_size().columns - 1
            self.bar = f"\r[{'#' * done}{'.' * (BAR_WIDTH - done)}] {line}"[: width + 1]
            sys.stderr.write(self.bar)
            sys.stderr.flush()

    def note(self, line: str) -> None:
        """Logs `line`, a phase outside the steps (the model load, the final save), and until the last step makes it
        the artifact's description, the progress where it was (the last step's line stays the stage's summary)."""
        self._clear_bar()
        self.log.info(line)
        if self.artifact_id is not None and self.step < self.total:
            percent = 100 * self.step / self.total
            if _safely("progress", update_progress_artifact, self.artifact_id, percent, description=line) is None:
                self.artifact_id = None

    def _clear_bar(self) -> None:
        if self.bar:
            sys.stderr.write("\r\033[K")
            self.bar = ""

    def close(self) -> None:
        """Clears the terminal bar, so the lines after the stage start on a clean line."""
        self._clear_bar()
        if self.tty:
            sys.stderr.flush()

    def finish(self) -> None:
        """Shows the stage done in the UI, when its last step was not a logged one (SFT logs every few steps)."""
        if self.artifact_id is not None and self.step < self.total:
            _safely(
                "progress", update_progress_artifact, self.artifact_id, 100.0, description=f"{self.total} steps done"
            )
