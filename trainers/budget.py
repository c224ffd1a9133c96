"""A cap on what a job may spend (`budget.max_training_hours`), and an estimate of what it will spend.

At the cap the training child stops at a checkpoint: `BudgetCallback` asks the Trainer, at the end of the step that
reaches it, to save and stop; the merge, evaluation and report then run on that model, and training.json says
`"stopped_by": "budget"` (so do the `grpoflow.training.completed` event, its webhooks, the report and the final state's
message). Time spent training adds up over attempts: `budget.json` in the job folder keeps the seconds used, so a
resumed job gets only what is left.

`estimate` is what `grpoflow validate` prints: the seconds per step of the newest job of the same base model that
trained on this machine (found through the job index), scaled by the completions and tokens per step, times
`max_steps`; or a sentence saying there is no such job yet.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from grpoflow.trainers.jobdir import JobDir, write_json_atomic
from grpoflow.trainers.spec import JobSpec

BUDGET_FILE = "budget.json"


def used_seconds(job: JobDir) -> float:
    """Seconds of GRPO training the job's earlier attempts used (0 for a new job)."""
    try:
        return float(json.loads((job.root / BUDGET_FILE).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def spent(job: JobDir, spec: JobSpec) -> bool:
    """Whether the job has used its whole training budget already."""
    cap = spec.budget.max_training_hours
    return cap is not None and used_seconds(job) >= cap * 3600


def budget_callback(job: JobDir, spec: JobSpec):
    """A `TrainerCallback` that records the training seconds used after each step and, once they reach
    `budget.max_training_hours`, saves a checkpoint and stops training; `.stopped_at` is then that step."""
    from transformers import TrainerCallback

    cap = spec.budget.max_training_hours

    class BudgetCallback(TrainerCallback):
        stopped_at: int | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.before, self.started = used_seconds(job), time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            used = self.before + time.monotonic() - self.started
            if state.is_world_process_zero:
                write_json_atomic(job.root / BUDGET_FILE, {"seconds": round(used, 3), "step": state.global_step})
            if cap is not None and used >= cap * 3600 and state.global_step < state.max_steps:
                control.should_save = control.should_training_stop = True
                self.stopped_at = state.global_step
                print(
                    f"grpoflow: budget.max_training_hours ({cap:g} h) reached after step {state.global_step}: "
                    "training stops at this step's checkpoint",
                    flush=True,
                )
            return control

    return BudgetCallback()


def budget_summary(spec: JobSpec, job: JobDir, stopped_at: int | None) -> dict:
    """training.json's fields about the budget: the cap, the hours used, and `stopped_by` when it ended training."""
    if spec.budget.max_training_hours is None:
        return {}
    summary = {
        "budget": {"max_training_hours": spec.budget.max_training_hours, "used_hours": used_seconds(job) / 3600}
    }
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
    import yaml

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
    from grpoflow.trainers.spec import resolved_dict

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
