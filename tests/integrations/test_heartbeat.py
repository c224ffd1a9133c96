"""Progress outside a stage's steps (`grpoflow.integrations.heartbeat`): a training child's phase lines shown as they
come, a line every so often while a phase lasts, and the merge's phases."""

import logging
import time
from pathlib import Path

import pytest

from grpoflow.integrations import heartbeat
from grpoflow.integrations.heartbeat import ChildPhases, Heartbeat
from grpoflow.trainers.child import PHASE_MARK, say_phase


@pytest.fixture
def log_file(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(f"an earlier attempt\n{PHASE_MARK}loading the model old\n")
    return path


def test_phase_lines_are_shown_as_they_come_and_only_this_attempts(log_file):
    notes = []
    phases = ChildPhases(log_file, notes.append, "training")
    assert notes == ["training: starting the child process (importing torch, transformers and TRL)"]
    with log_file.open("a") as f:
        f.write(f"Loading weights: 100%\n{PHASE_MARK}loading the model /m (1 MB in 1 file)\n")
        f.write(f"[node 0] {PHASE_MARK}model loaded in 2.0 s\n{PHASE_MARK}saving the wei")  # a line half written
    phases.poll(stepping=False)
    assert notes[1:] == ["training: loading the model /m (1 MB in 1 file)", "training: model loaded in 2.0 s"]
    with log_file.open("a") as f:
        f.write("ghts to merged/\n")
    phases.poll(stepping=False)
    assert notes[3:] == ["training: saving the weights to merged/"]  # once whole


def test_a_phase_after_a_step_waits_for_that_steps_line(log_file, capsys):
    notes = []
    phases = ChildPhases(log_file, notes.append, "training")
    say_phase("model loaded in 0.1 s")
    say_phase("saving the weights to merged/", after_step=2)  # a fast child: its steps and save arrive at once
    say_phase("scoring the held-out prompts", after_step=2)
    with log_file.open("a") as f:
        f.write(capsys.readouterr().out)
    phases.poll(shown_step=0)
    assert notes[1:] == ["training: model loaded in 0.1 s"]
    phases.poll(shown_step=1)
    assert len(notes) == 2  # held back until step 2's line is out
    phases.poll(shown_step=2)
    assert notes[2:] == ["training: saving the weights to merged/", "training: scoring the held-out prompts"]


def test_what_is_held_back_is_shown_when_the_stage_ends(log_file):
    notes = []
    phases = ChildPhases(log_file, notes.append, "training")
    with log_file.open("a") as f:
        f.write(f"{PHASE_MARK}(after step 9) saving the weights to merged/\n")
    phases.poll(shown_step=3)  # the child died before its step 9 was read
    assert len(notes) == 1
    phases.flush()
    assert notes[1:] == ["training: saving the weights to merged/"]


def phase_lasting(log_file: Path, phase: str, seconds: float) -> tuple[ChildPhases, list[str]]:
    """A child's watcher that has shown `phase`, `seconds` ago; and the lines it showed."""
    notes = []
    phases = ChildPhases(log_file, notes.append, "training")
    with log_file.open("a") as f:
        f.write(f"{PHASE_MARK}{phase}\n")
    phases.poll(stepping=False)
    time.sleep(seconds)
    return phases, notes


def test_a_long_phase_says_how_long_it_lasts_but_not_between_steps(log_file, monkeypatch):
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.5)
    phases, notes = phase_lasting(log_file, "loading the model /m", 0.6)
    phases.poll(stepping=True)  # steps are coming: their own lines say enough
    assert notes[-1] == "training: loading the model /m"
    phases.poll(stepping=False)
    assert notes[-1].startswith("training: loading the model /m: ") and notes[-1].endswith(" s so far")
    assert len(notes) == 3
    phases.poll(stepping=False)  # not again until EVERY_S more have passed
    assert len(notes) == 3


def test_after_the_last_step_the_beat_counts_from_it_not_from_the_phase_before_step_1(log_file, monkeypatch):
    # A beat between the last step's line and the final save's said "step 1: generating ...: 4 s so far".
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.3)
    phases, notes = phase_lasting(log_file, "model loaded in 1.5 s; step 1: generating 4 completions", 0.4)
    phases.stepped(5, 5)
    phases.poll(shown_step=5, stepping=False)  # the phase before step 1 is over: no beat of it
    assert notes == ["training: starting the child process (importing torch, transformers and TRL)"] + [
        "training: model loaded in 1.5 s; step 1: generating 4 completions"
    ]
    time.sleep(0.4)
    phases.poll(shown_step=5, stepping=False)
    assert len(notes) == 3 and notes[-1].startswith("training: after step 5/5: ") and notes[-1].endswith(" s so far")


def test_say_phase_prints_from_the_main_process_only(capsys, monkeypatch):
    say_phase("loading the model /m")
    monkeypatch.setenv("RANK", "1")
    say_phase("loading the model /m")
    assert capsys.readouterr().out == f"{PHASE_MARK}loading the model /m\n"


def test_heartbeat_logs_each_phase_then_how_long_it_lasts(caplog):
    logger = logging.getLogger("test-heartbeat")
    with caplog.at_level(logging.INFO, logger="test-heartbeat"), Heartbeat(logger, "merge", every_s=0.05) as beat:
        beat.say("loading the base model /m")
        time.sleep(0.3)
        beat.say("writing merged/")
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "so far" not in line] == [
        "merge: loading the base model /m",
        "merge: writing merged/",
    ]
    beats = lines[1 : lines.index("merge: writing merged/")]
    assert beats and all(line.startswith("merge: loading the base model /m: ") for line in beats)
    assert not beat.thread.is_alive()  # stopped with the block


def test_heartbeat_lines_are_logged_with_the_callers_prefect_settings():
    # A thread's own context has no `grpoflow run` server: the run logger's first line there would start another.
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    seen = []

    class Recorder:
        def info(self, *args):
            seen.append(get_current_settings().api.url)

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with Heartbeat(Recorder(), "merge", every_s=0.02) as beat:
            beat.say("writing merged/")
            time.sleep(0.2)
    assert len(seen) > 2 and set(seen) == {"http://127.0.0.1:9/api"}  # the beats, from the thread, too
