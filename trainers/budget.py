"""A cap on what a job may spend (`budget.max_training_hours`), and an estimate of what it will spend.

At the cap the training child stops at a checkpoint: `BudgetCallback` asks the Trainer, at the end of the step that
reaches it, to save and stop; the merge, evaluation and report then run on that model, and training.json says
`"stopped_by": "budget"` (so do the `grpoflow.training.completed` event, its webhooks, the report and the final state's
message). Time spent training adds up over attempts: `budget.json` in the job folder records the seconds used after
each step, and each checkpoint's trainer_state.json keeps its own count (the callback is an `ExportableState`, saved
under `stateful_callbacks`); a resumed job gets only what is left of the larger of the two, so editing or deleting
budget.json cannot give back time spent up to the newest checkpoint. A record that is not a number of seconds >= 0
(NaN, negative, not JSON) is refused when a budget is set (`BudgetRecordError`: the child exits 2, not retried) and
ignored with a warning when none is.

`estimate` is what `grpoflow validate` prints: the seconds per step of the newest job of the same base model that
trained on this machine (found through the job index), scaled by the completions and tokens per step, times
`max_steps`; or a sentence saying there is no such job yet.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import yaml

from grpoflow.core.errors import SetupError
from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import JobSpec, resolved_dict

BUDGET_FILE = "budget.json"
# How often budget.json is rewritten while training runs (and at each checkpoint and the end): a crash loses at most
# this much of the books (a checkpoint's own record keeps its time exactly), not a file written every step.
BUDGET_WRITE_S = 5.0
CALLBACK_NAME = "BudgetCallback"  # its class name: the key of its record in trainer_state.json's stateful_callbacks
DELETE_FIX = (
    "delete the file and resume the job: the count restarts from the newest checkpoint's own record (from 0 without "
    "a checkpoint)"
)


class BudgetRecordError(SetupError):
    """A record of the training time used is corrupt: with `budget.max_training_hours` set, training would run
    unbounded, so the training child refuses to start (exit 2: the job is rejected, not retried)."""


def _corruption(record) -> str | None:
    """What is wrong with a time record (`{"seconds": s, ...}`), or None when `seconds` is a finite number >= 0."""
    if not isinstance(record, dict):
        return f"it holds {json.dumps(record)[:60]}, not an object"
    if "seconds" not in record:
        return 'it has no "seconds"'
    value = record["seconds"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return f'its "seconds" is {json.dumps(value)[:60]}, not a number of seconds >= 0'
    return None


def _checked(record, where: str, fix: str, spec: JobSpec, problem: str | None = None) -> float:
    """`record`'s seconds; a corrupt record (or one with a `problem` found before) raises `BudgetRecordError` when a
    budget is set, and counts as 0 with a warning when none is (nothing to keep; budget.json is rewritten at the
    next step)."""
    if (problem := problem or _corruption(record)) is None:
        return float(record["seconds"])
    cap = spec.budget.max_training_hours
    if cap is None:
        print(f"grpoflow: warning: {where} is corrupt ({problem}); ignored: no budget is set", file=sys.stderr)
        return 0.0
    raise BudgetRecordError(
        f"budget.max_training_hours ({cap:g} h) cannot be kept: {where} is corrupt: {problem}, so the training time "
        f"already used is unknown; {fix}"
    )


def recorded_seconds(job: JobDir, spec: JobSpec) -> float:
    """The seconds of GRPO training `budget.json` records (0 when there is none), checked as `_checked` does."""
    path = job.root / BUDGET_FILE
    try:
        record, problem = json.loads(path.read_text()), None
    except FileNotFoundError:
        return 0.0
    except (OSError, ValueError) as e:
        record, problem = None, f"it cannot be read as JSON ({e})"
    return _checked(record, str(path), DELETE_FIX, spec, problem)


def checkpoint_seconds(callbacks: dict | None, where: str, spec: JobSpec) -> float:
    """The seconds a checkpoint's trainer state records (`callbacks` is its `stateful_callbacks`, where the Trainer put
    `BudgetCallback.state()`); 0 when it has no record (saved before grpoflow kept one)."""
    record = (callbacks or {}).get(CALLBACK_NAME)
    if record is None:
        return 0.0
    attributes = record.get("attributes") if isinstance(record, dict) else record
    fix = "remove that checkpoint folder to resume from the one before it"
    return _checked(attributes, f"{where} (stateful_callbacks.{CALLBACK_NAME})", fix, spec)


def used_seconds(job: JobDir, spec: JobSpec, checkpoint: str | Path | None = None) -> float:
    """Seconds of GRPO training the job's earlier attempts used (0 for a new job): the larger of budget.json's count
    and the one in `checkpoint`'s trainer_state.json (an intact checkpoint: `resume_checkpoint` found it)."""
    used = recorded_seconds(job, spec)
    if checkpoint is not None:
        path = Path(checkpoint) / "trainer_state.json"
        used = max(used, checkpoint_seconds(json.loads(path.read_text()).get("stateful_callbacks"), str(path), spec))
    return used


def spent(job: JobDir, spec: JobSpec, checkpoint: str | Path | None = None) -> bool:
    """Whether the job has used its whole training budget already (resuming from `checkpoint`)."""
    cap = spec.budget.max_training_hours
    return cap is not None and used_seconds(job, spec, checkpoint) >= cap * 3600


def budget_callback(job: JobDir, spec: JobSpec):
    """A `TrainerCallback` that records the training seconds used after each step and, once they reach
    `budget.max_training_hours`, saves a checkpoint and stops training; `.stopped_at` is then that step. Its count
    goes into each checkpoint (`state()`), and a resume starts from the larger of that and budget.json's. A corrupt
    budget.json with a budget set raises `BudgetRecordError` here, before the model loads."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    cap = spec.budget.max_training_hours
    if cap is not None:
        recorded_seconds(job, spec)

    class BudgetCallback(TrainerCallback, ExportableState):
        stopped_at: int | None = None
        seconds: float = 0.0  # used as of the last step's end

        def state(self) -> dict:
            return {"args": {}, "attributes": {"seconds": self.seconds}}

        def on_train_begin(self, args, state, control, **kwargs):
            # On a resume the Trainer has loaded the checkpoint's trainer_state.json into `state` by now.
            where = job.checkpoints / f"checkpoint-{state.global_step}" / "trainer_state.json"
            resumed = checkpoint_seconds(state.stateful_callbacks, str(where), spec) if state.global_step else 0.0
            self.seconds = max(recorded_seconds(job, spec), resumed)
            # A checkpoint saved before this callback kept a record has no key for it, and Trainer._save_checkpoint
            # indexes it (a KeyError at the first save after such a resume).
            state.stateful_callbacks.setdefault(CALLBACK_NAME, self.state())
            self.before, self.started, self.written = self.seconds, time.monotonic(), float("-inf")

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            used = self.before + now - self.started
            self.seconds = round(used, 3)
            if cap is not None and used >= cap * 3600 and state.global_step < state.max_steps:
                control.should_save = control.should_training_stop = True
                self.stopped_at = state.global_step
                print(
                    f"grpoflow: budget.max_training_hours ({cap:g} h) reached after step {state.global_step}: "
                    "training stops at this step's checkpoint",
                    flush=True,
                )
            due = control.should_save or control.should_training_stop or state.global_step >= state.max_steps
            if due or now - self.written >= BUDGET_WRITE_S:
                self.write(state)
            return control

        def on_train_end(self, args, state, control, **kwargs):
            self.write(state)  # a stop another callback asked for after this one's step end: the books exact

        def write(self, state) -> None:
            if state.is_world_process_zero:
                write_json_atomic(job.root / BUDGET_FILE, {"seconds": self.seconds, "step": state.global_step})
            self.written = time.monotonic()

    return BudgetCallback()


def budget_summary(spec: JobSpec, job: JobDir, stopped_at: int | None, checkpoint: str | Path | None = None) -> dict:
    """training.json's fields about the budget: the cap, the hours used (as `used_seconds` counts them, resuming from
    `checkpoint`), and `stopped_by` when it ended training."""
    if spec.budget.max_training_hours is None:
        return {}
    used_hours = used_seconds(job, spec, checkpoint) / 3600
    summary = {"budget": {"max_training_hours": spec.budget.max_training_hours, "used_hours": used_hours}}
    if stopped_at is not None:
        summary |= {"stopped_by": "budget", "budget_stopped_at_step": stopped_at}
    return summary


def budget_line(training: dict) -> str | None:
    """One sentence when the budget ended training, for the state message, the report and the model card.

    >>> budget_line({"stopped_by": "budget", "budget_stopped_at_step": 40, "budget": {"max_training_hours": 0.5}})
    'training stopped by budget.max_training_hours (0.5 h) at step 40'
    """
    if training.get("stopped_by") != "budget":
        return None
    cap = training.get("budget", {}).get("max_training_hours")
    return (
        f"training stopped by budget.max_training_hours ({cap:g} h) at step {training.get('budget_stopped_at_step')}"
    )


# --- the estimate ---------------------------------------------------------------------------------------------------


def _work(spec: dict) -> float:
    """Tokens generated per step, as the spec sets them: completions per step times their length."""
    hp = spec.get("hyperparameters") or {}
    return hp.get("rollouts_per_prompt", 8) * hp.get("prompts_per_step", 1) * hp.get("max_response_length", 2048)


def _measured(folder: Path, base_model: str) -> tuple[float, dict, str] | None:
    """(seconds per step, spec, job id) of a finished job of `base_model` in `folder`, or None."""
    try:
        spec = yaml.safe_load((folder / "spec.yaml").read_text())
        training = json.loads((folder / "training.json").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(spec, dict) or spec.get("base_model") != base_model:
        return None
    resumed = training.get("resumed_from") or "checkpoint-0"
    steps = training.get("global_step", 0) - int(str(resumed).rsplit("-", 1)[-1])
    runtime = training.get("train_runtime")
    if not isinstance(runtime, int | float) or steps <= 0:
        return None
    return runtime / steps, spec, folder.name


def estimate(spec: JobSpec, roots: list[str]) -> str:
    """The training time `spec` should take here, from the newest job of its base model under `roots` (local
    folders; URLs are skipped), as one sentence; or why there is none."""
    folders = [f for root in roots if "://" not in root for f in Path(root).expanduser().glob("*/training.json")]
    for path in sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True):
        if (found := _measured(path.parent, spec.base_model)) is None:
            continue
        per_step, measured_spec, job_id = found
        scaled = per_step * _work(resolved_dict(spec)) / max(_work(measured_spec), 1)
        total = scaled * spec.hyperparameters.max_steps
        text = (
            f"about {_duration(total)} of GRPO training ({spec.hyperparameters.max_steps} steps at "
            f"{scaled:.2f} s/step: job {job_id}'s {per_step:.2f} s/step on this machine, scaled by completions x "
            "max_response_length)"
        )
        cap = spec.budget.max_training_hours
        if cap is not None and total > cap * 3600:
            text += f"; budget.max_training_hours ({cap:g} h) stops it at about step {int(cap * 3600 / scaled)}"
        return text
    return f"no estimate: no job of {spec.base_model} has trained on this machine yet"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
