"""metrics.jsonl: the callback that writes one line per step, the reader, and the truncation a resume does."""

import json
import logging
import math

import pytest
from transformers import TrainerControl, TrainerState

from grpoflow.trainers.metrics import metrics_file_callback, read_metrics, truncate_metrics


def log(path, logs: dict, step: int = 1, main_process: bool = True) -> list[dict]:
    """Hands `logs` to the callback as Trainer does at `step`; returns what metrics.jsonl then holds."""
    state = TrainerState(global_step=step, is_world_process_zero=main_process)
    metrics_file_callback(path).on_log(None, state, TrainerControl(), logs=logs)
    return read_metrics(path)


@pytest.mark.parametrize(
    "logs, expected",
    [
        ({"reward": 0.5, "loss": 0.1, "kl": 0}, [{"step": 1, "values": {"reward": 0.5, "loss": 0.1, "kl": 0}}]),
        # JSON has no NaN or inf: they become null, the key stays visible.
        ({"reward": math.nan, "entropy": math.inf}, [{"step": 1, "values": {"reward": None, "entropy": None}}]),
        # Only numbers are metrics (TRL also logs e.g. completion tables as other types).
        ({"reward": 1.0, "note": "text", "table": [1, 2]}, [{"step": 1, "values": {"reward": 1.0}}]),
        # Trainer's end-of-training summary is not a step.
        ({"train_runtime": 3.2, "train_loss": 0.4}, []),
        ({}, []),  # nothing logged, no line
    ],
)
def test_callback_writes_one_line_per_step(tmp_path, logs, expected):
    assert log(tmp_path / "metrics.jsonl", logs) == expected


def test_callback_appends_in_step_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in (1, 2, 3):
        log(path, {"reward": step / 10}, step=step)
    assert [(r["step"], r["values"]["reward"]) for r in read_metrics(path)] == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_only_the_main_process_writes(tmp_path):
    # The other ranks of a several-GPU run log too; one line per step means they write nothing.
    assert log(tmp_path / "metrics.jsonl", {"reward": 1.0}, main_process=False) == []
    assert not (tmp_path / "metrics.jsonl").exists()


def test_read_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []  # no file yet: no steps
    lines = [json.dumps({"step": s, "values": {"reward": s}}) for s in (1, 2)]
    path.write_text("\n".join(lines) + '\n{"step": 3, "val')  # a crash in the middle of writing step 3
    assert [r["step"] for r in read_metrics(path)] == [1, 2]


@pytest.mark.parametrize(
    "last_step, kept",
    [
        (3, [1, 2, 3]),  # resuming from checkpoint-3 keeps steps up to it
        (0, []),  # no intact checkpoint: start over
        (10, [1, 2, 3, 4, 5]),  # a checkpoint past the last line keeps everything
    ],
)
def test_truncate_metrics(tmp_path, last_step, kept):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "values": {"reward": s}}) + "\n" for s in range(1, 6)))
    truncate_metrics(path, last_step)
    assert [r["step"] for r in read_metrics(path)] == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp file left


# --- robust reading: a malformed line costs that line, with a warning naming it -------------------------------------


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("[1, 2, 3]", "not a record"),  # JSON, but not a step record
        ("null", "not a record"),
        ('{"step": 5}', "not a record"),  # no values
        ('{"step": true, "values": {}}', "not a record"),  # a bool is no step number
        ("{not json", "not JSON"),
    ],
)
def test_malformed_lines_are_skipped_with_a_warning(tmp_path, caplog, line, why):
    path = tmp_path / "metrics.jsonl"
    good = [json.dumps({"step": s, "values": {"reward": 0.5}}) for s in (1, 2)]
    path.write_text("\n".join([good[0], line, good[1]]) + "\n")
    with caplog.at_level(logging.WARNING, logger="grpoflow"):
        assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert f"{path}, line 2: skipped, {why}" in caplog.text


def test_a_torn_last_line_is_reported_as_torn(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "values": {}}) + '\n{"step": 2, "val')
    with caplog.at_level(logging.WARNING, logger="grpoflow"):
        assert [r["step"] for r in read_metrics(path)] == [1]
        read_metrics(path)  # a second read (the watcher polls) does not warn again
    assert caplog.text.count("line 2: skipped, the last line is torn") == 1


def test_events_reader_keeps_event_records_only(tmp_path):
    from grpoflow.trainers.metrics import read_events

    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"event": "grpoflow.job.started"}\n[1]\n{"step": 1, "values": {}}\n{"event": "grpoflow.job.completed"}\n'
    )
    assert [r["event"] for r in read_events(path)] == ["grpoflow.job.started", "grpoflow.job.completed"]


def test_an_evaluated_step_is_one_line_with_its_held_out_score(tmp_path):
    # Trainer logs an evaluated step twice (its training metrics, then eval_*): the line waits for the score.
    path, callback = tmp_path / "metrics.jsonl", metrics_file_callback(tmp_path / "metrics.jsonl")
    evaluating = TrainerControl(should_evaluate=True)
    callback.on_log(None, TrainerState(global_step=1), TrainerControl(), logs={"reward": 0.1})
    callback.on_log(None, TrainerState(global_step=2), evaluating, logs={"reward": 0.2})
    assert [r["step"] for r in read_metrics(path)] == [1]  # step 2 waits for its held-out score
    scores = {"eval_exact_answer": 0.35, "eval_seconds": 1.5, "epoch": 0.5}
    callback.on_log(None, TrainerState(global_step=2), evaluating, logs=scores)
    callback.on_log(None, TrainerState(global_step=3), TrainerControl(), logs={"reward": 0.3})
    assert read_metrics(path) == [
        {"step": 1, "values": {"reward": 0.1}},
        {"step": 2, "values": {"reward": 0.2, "eval/exact_answer": 0.35, "eval/seconds": 1.5, "epoch": 0.5}},
        {"step": 3, "values": {"reward": 0.3}},
    ]


# --- the child's own stop on NaN or inf (issue 28, item 7): a rule table of (what is logged, the weights) -> stop


@pytest.mark.parametrize(
    "logs, weight, stopped",
    [
        ({"loss": 0.1, "grad_norm": 1.0}, 0.5, None),  # a healthy step
        ({"loss": math.nan, "grad_norm": 1.0}, 0.5, "loss became NaN or inf"),  # the loss went first
        ({"loss": 0.1, "grad_norm": math.inf}, 0.5, "grad_norm became NaN or inf"),
        # learning_rate 1e300: the step's loss and gradient were finite, the update made the weights inf
        ({"loss": 0.1, "grad_norm": 1.0}, math.inf, "the weights became NaN or inf"),
        ({"eval_exact_answer": 0.5}, math.nan, None),  # an evaluation's record is no training step
    ],
)
def test_a_non_finite_step_stops_the_child_naming_the_rate(logs, weight, stopped):
    import torch

    from grpoflow.core.errors import TrainingDiverged
    from grpoflow.trainers.metrics import finite_callback

    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, weight)
    model.bias.requires_grad_(False)
    callback = finite_callback("hyperparameters.learning_rate", 1e300)
    state = TrainerState(global_step=3)
    if stopped is None:
        callback.on_log(None, state, TrainerControl(), logs=logs, model=model)
        return
    with pytest.raises(TrainingDiverged) as caught:
        callback.on_log(None, state, TrainerControl(), logs=logs, model=model)
    assert str(caught.value).startswith(
        f"hyperparameters.learning_rate: training diverged at step 3: {stopped} with learning_rate 1e+300; lower it"
    )


def test_weights_finite_reads_only_what_trains():
    import torch

    from grpoflow.trainers.metrics import trained_parameters, weights_finite

    model = torch.nn.Linear(2, 2)
    assert weights_finite(trained_parameters(model))
    torch.nn.init.constant_(model.bias, math.nan)
    assert not weights_finite(trained_parameters(model))
    model.bias.requires_grad_(False)  # a frozen tensor (a LoRA base, a 4-bit weight) is not the run's to check
    assert weights_finite(trained_parameters(model))
