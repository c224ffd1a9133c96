"""Per-step metrics: a `TrainerCallback` that appends each of TRL's log records to `metrics.jsonl`, and one that stops
a run whose loss, gradient or weights became NaN or inf (`finite_callback`).

One line per optimizer step, `{"step": n, "values": {...}}`, with everything TRL logs (reward, reward_std, loss,
completions/mean_length, entropy, kl when beta > 0, rewards/<name>/mean, ...) and, at the steps with a held-out
evaluation, `eval/<metric>` and `eval/seconds`. On resume from checkpoint N, the
lines after step N are dropped first, so each step appears exactly once.

Reading needs nothing heavy; the callbacks import transformers (and torch) only when they are built.
"""

import json
import logging
import math
from pathlib import Path

from grpoflow.core.errors import TrainingDiverged

logger = logging.getLogger("grpoflow")

# Trainer's end-of-training summary record; it is not a step.
_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}


def read_jsonl(path: Path, valid=None) -> list[dict]:
    """The records of a JSON Lines file, skipping each line that is not one (`valid(record)` says what is).

    Each skipped line is logged once, naming the file and the line; an unparsable last line without its newline is
    reported as torn (a write cut short, e.g. by a crash), since the writer appends whole lines.

    Args:
        path (`Path`): the file; a missing file has no records.
        valid (`Callable[[object], bool]`, *optional*): whether a parsed line is a record; default: any JSON object.
    """
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn = lineno == len(lines) and not text.endswith("\n")
            _skipped(path, lineno, "the last line is torn (a write cut short)" if torn else "not JSON")
            continue
        if not (valid or _is_object)(record):
            _skipped(path, lineno, f"not a record: {line[:60]}")
            continue
        records.append(record)
    return records


def read_metrics(path: Path) -> list[dict]:
    """The step records of `metrics.jsonl` (`{"step": n, "values": {...}}`), in file order; see `read_jsonl`."""
    return read_jsonl(path, _is_step)


def read_events(path: Path) -> list[dict]:
    """The records of `events.jsonl` (`{"event": name, "payload": {...}, ...}`), in file order; see `read_jsonl`."""
    return read_jsonl(path, lambda r: _is_object(r) and isinstance(r.get("event"), str))


def _is_object(record) -> bool:
    return isinstance(record, dict)


def _is_step(record) -> bool:
    step = record.get("step") if isinstance(record, dict) else None
    return isinstance(step, int) and not isinstance(step, bool) and isinstance(record.get("values"), dict)


_warned: set[tuple[str, int, str]] = set()


def _skipped(path: Path, lineno: int, why: str) -> None:
    # Once per line: the training task re-reads metrics.jsonl every half second.
    if (str(path), lineno, why) not in _warned:
        _warned.add((str(path), lineno, why))
        logger.warning("%s, line %d: skipped, %s", path, lineno, why)


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keeps only the records with step <= `last_step` (the step of the checkpoint a run resumes from)."""
    kept = [r for r in read_metrics(path) if r["step"] <= last_step]
    tmp = Path(path).with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)


def _clean(value):
    # JSON has no NaN/inf; None keeps the key visible without breaking strict parsers.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def metrics_file_callback(path: Path):
    """A `TrainerCallback` that appends every step's log record to the JSONL file `path` (main process only).

    A step with a held-out evaluation (`evaluation.every`) is logged twice by the Trainer, its training metrics and
    then its `eval_*` scores; its line waits for the second and holds both, the scores as `eval/<name>`, so that
    each step stays one line.

    The file is the run's history: the Trainer's own copy (`state.log_history`, which every checkpoint's
    trainer_state.json rewrites whole) keeps the latest record only. Logging every step, the whole copy made each save
    cost time growing with the run (17 ms at 100 steps, a step's worth on a small model; 170 ms at 1,000)."""
    from transformers import TrainerCallback

    class _MetricsFileCallback(TrainerCallback):
        pending: dict | None = None  # an evaluated step's training metrics, until its held-out scores come

        def on_log(self, args, state, control, logs=None, **kwargs):
            del state.log_history[:-1]  # on every process: each keeps (and saves) its own copy
            if not state.is_world_process_zero or not logs or _SUMMARY_KEYS & logs.keys():
                return
            values = {k: _clean(v) for k, v in logs.items() if isinstance(v, int | float)}
            if any(k.startswith("eval_") for k in values):
                values = {
                    ("eval/" + k.removeprefix("eval_") if k.startswith("eval_") else k): v for k, v in values.items()
                }
                pending, self.pending = self.pending, None
                if pending is not None and pending["step"] == state.global_step:
                    values = pending["values"] | values
            elif control.should_evaluate:
                self.pending = {"step": state.global_step, "values": values}
                return
            with Path(path).open("a") as f:
                f.write(json.dumps({"step": state.global_step, "values": values}) + "\n")

    return _MetricsFileCallback()


def finite_callback(field: str, learning_rate: float):
    """A `TrainerCallback` that stops training at the first logged step whose loss or gradient norm is NaN or inf, or
    after which the trained weights are, raising `grpoflow.core.errors.TrainingDiverged` that names `field` (the
    spec's learning rate) and its value: no later step recovers, and without it the next step's generation fails
    on the NaN probabilities with a torch error that says nothing of the rate (and every retry resumes into it).

    Runs in `on_log`, which the Trainer calls every step (logging_steps=1) before it saves a checkpoint, so no
    non-finite checkpoint is written. The weights are checked by one sum per trained tensor (no copy of them)."""
    from transformers import TrainerCallback

    class _FiniteCallback(TrainerCallback):
        # The model and its trained parameters, found once: walking the modules every step cost more than the sums
        # on a small model.
        trained: tuple = (None, [])

        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            if not logs or not {"loss", "grad_norm"} & logs.keys():
                return  # an evaluation's or the end-of-training record
            bad = [k for k in ("loss", "grad_norm") if isinstance(logs.get(k), float) and not math.isfinite(logs[k])]
            if model is not None and self.trained[0] is not model:
                self.trained = (model, trained_parameters(model))
            if not bad and model is not None and not weights_finite(self.trained[1]):
                bad = ["the weights"]
            if bad:
                raise TrainingDiverged(
                    f"{field}: training diverged at step {state.global_step}: {' and '.join(bad)} became NaN or inf "
                    f"with {field.rsplit('.', 1)[-1]} {learning_rate:g}; lower it (by 10x or more; LoRA wants ~2e-5, "
                    "full fine-tuning ~1e-6) and check the rewards' scale"
                )

    return _FiniteCallback()


def trained_parameters(model) -> list[tuple]:
    """The parameters of `model` that training updates (requires_grad), what `weights_finite` checks: each with
    whether it is sharded (FSDP2's DTensor, summed over its local shard)."""
    return [(p, hasattr(p, "to_local")) for p in model.parameters() if p.requires_grad]


def weights_finite(parameters: list[tuple]) -> bool:
    """Whether every one of `parameters` (`trained_parameters`') is finite: one sum per tensor, one device sync."""
    import torch

    with torch.no_grad():
        sums = [(p.to_local() if sharded else p).sum(dtype=torch.float32) for p, sharded in parameters]
        return not sums or bool(torch.isfinite(torch.stack([s.to(sums[0].device) for s in sums])).all())
