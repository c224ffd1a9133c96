"""Progress where a stage has no steps to count: a training child's setup (its imports, the model load, the first
generation), its final save, and the merge, which can each take a minute on a 7B model without a line.

`ChildPhases` shows the phase lines a training child prints (`grpoflow.trainers.child.say_phase`, kept in its log
too) as they come, and outside its steps (before the first, after the last), every `EVERY_S` seconds without a line,
how long the phase has lasted. `Heartbeat` does the same for work in this process (the merge): each phase is logged
as it starts, then a line every `EVERY_S` seconds while it lasts.
"""

import contextvars
import re
import threading
import time
from pathlib import Path

from grpoflow.trainers.child import PHASE_MARK

EVERY_S = 15.0  # a user waits this long without a line, at most
AFTER_STEP = re.compile(r"\(after step (\d+)\) (.*)")  # `say_phase(text, after_step=N)`


class ChildPhases:
    """A training child's phase lines, read from its log as the stage's watcher polls.

    Args:
        log_path (`Path`): the child's log (`logs/train.log`); only what is written after this object is made counts
            (a retried task's log holds the earlier attempts').
        note (`Callable[[str], None]`): where a line goes (the stage's `StageProgress.note`).
        stage (`str`): how the lines start, e.g. `"training"`.
    """

    def __init__(self, log_path: Path, note, stage: str):
        self.path, self.note, self.stage = log_path, note, stage
        self.offset = log_path.stat().st_size if log_path.exists() else 0
        self.said = self.phase_started = time.monotonic()
        self.phase = "starting the child process (importing torch, transformers and TRL)"
        self.pending: list[tuple[int | None, str]] = []  # (the step it follows, text), not shown yet
        note(f"{stage}: {self.phase}")

    def flush(self) -> None:
        """Shows what is held back (the stage ended: its steps are all shown, or never will be)."""
        for _, text in self.pending:
            self._show(text, time.monotonic())
        self.pending = []

    def stepped(self, step: int, total: int) -> None:
        """Step `step` of `total` is shown: the phase before it is over, and until the child's next phase line what
        lasts is the time after it (a beat after the last step says "after step 5/5: 15 s so far", not the phase
        before step 1)."""
        now = time.monotonic()
        self.phase, self.said, self.phase_started = f"after step {step}/{total}", now, now

    def _show(self, text: str, now: float) -> None:
        self.phase, self.said, self.phase_started = text, now, now
        self.note(f"{self.stage}: {text}")

    def poll(self, shown_step: int = 0, stepping: bool = False) -> None:
        """Shows the new phase lines in their order, a line the child marked as following step N only once step N's
        own line is shown (`shown_step`: the watcher's last; a fast child's steps and final save can arrive at once);
        while not `stepping` (between its first step and its last), how long the phase lasts."""
        now = time.monotonic()
        self.pending += self._new_lines()
        while self.pending and (self.pending[0][0] or 0) <= shown_step:
            self._show(self.pending.pop(0)[1], now)
        if not stepping and now - self.said >= EVERY_S:
            self.said = now
            self.note(f"{self.stage}: {self.phase}: {now - self.phase_started:.0f} s so far")

    def _new_lines(self) -> list[tuple[int | None, str]]:
        """The phase lines completed since the last call, as (the step it follows, text); a line still being written
        waits for its newline."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.decode("utf-8", "replace").splitlines()
        # Several machines' logs arrive prefixed with "[node i] ".
        texts = [line.split(PHASE_MARK, 1)[1].strip() for line in lines if PHASE_MARK in line]
        return [(int(m[1]), m[2]) if (m := AFTER_STEP.match(text)) else (None, text) for text in texts]


class Heartbeat:
    """Phases of work in this process, each logged as it starts and, from a thread, every `EVERY_S` seconds while it
    lasts; a context manager (the thread stops at its end).

    >>> with Heartbeat(logger, "merge") as beat:
    ...     beat.say("loading the base model")   # "merge: loading the base model", then every 15 s
    ...     ...                                   # "merge: loading the base model: 15 s so far"


    Args:
        log (`logging.Logger`-like): the task's run logger.
        stage (`str`): how the lines start, e.g. `"merge"`.
    """

    def __init__(self, log, stage: str, every_s: float = EVERY_S):
        self.log, self.stage, self.every_s = log, stage, every_s
        self.phase, self.phase_started = None, time.monotonic()
        self.done = threading.Event()
        # In a copy of this context: a thread's own lacks the Prefect settings of `grpoflow run`'s server, and the run
        # logger's first line there would start a second, ephemeral, server.
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._beat,), name=f"{stage} heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    def say(self, text: str) -> None:
        """Starts a phase: logs `text`."""
        self.phase, self.phase_started = text, time.monotonic()
        self.log.info("%s: %s", self.stage, text)

    def _beat(self) -> None:
        while not self.done.wait(self.every_s):
            if self.phase is not None:
                self.log.info("%s: %s: %.0f s so far", self.stage, self.phase, time.monotonic() - self.phase_started)
