"""Per-step metrics: a `TrainerCallback` that appends each of TRL's log records to `metrics.jsonl`.

One line per optimizer step, `{"step": n, "values": {...}}`, with everything TRL logs (reward, reward_std, loss,
completions/mean_length, entropy, kl when beta > 0, rewards/<name>/mean, ...). On resume from checkpoint N, the
lines after step N are dropped first, so each step appears exactly once.

Reading needs nothing heavy; the callback (`metrics_file_callback`) imports transformers only when it is built.
"""

import json
import math
from pathlib import Path

# Trainer's end-of-training summary record; it is not a step.
_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"}


def read_metrics(path: Path) -> list[dict]:
    """Reads `metrics.jsonl` and returns its records; a torn last line (a crash mid-write) is ignored."""
    if not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


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
    """A `TrainerCallback` that appends every step's log record to the JSONL file `path` (main process only)."""
    from transformers import TrainerCallback

    class _MetricsFileCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or _SUMMARY_KEYS & logs.keys():
                return
            values = {k: _clean(v) for k, v in logs.items() if isinstance(v, int | float)}
            with Path(path).open("a") as f:
                f.write(json.dumps({"step": state.global_step, "values": values}) + "\n")

    return _MetricsFileCallback()
