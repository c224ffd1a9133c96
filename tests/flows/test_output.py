"""A flow run's console with no reader (its worker died): Prefect's console handler, print and the interpreter's own
flush go on, the line dropped, where rich would raise SystemExit(1)."""

import logging
import os
import sys

import pytest
from prefect.logging.handlers import PrefectConsoleHandler

from grpoflow.flows.output import ClosedSafe, survive_closed_output


@pytest.fixture
def closed_pipe():
    """A stream on a pipe whose reader is gone, as a dead worker leaves a flow run's stdout and stderr."""
    reader, writer = os.pipe()
    stream = os.fdopen(writer, "w", buffering=1)
    os.close(reader)
    yield stream
    stream.close()


@pytest.fixture
def console_logger():
    logger = logging.getLogger("grpoflow.test.closed")
    logger.propagate = False
    yield logger
    logger.handlers.clear()


def test_prefect_console_on_a_closed_pipe_goes_on(closed_pipe, console_logger, monkeypatch):
    # Set here, not in a fixture: pytest puts its own sys.stderr back between a test's setup and its call.
    monkeypatch.setattr(sys, "stdout", closed_pipe)  # where rich's answer points /dev/null
    before = PrefectConsoleHandler(stream=closed_pipe)
    console_logger.addHandler(before)
    with pytest.raises(SystemExit):  # what a run met: rich's answer to the broken pipe
        console_logger.warning("before")
    console_logger.removeHandler(before)

    reader, writer = os.pipe()
    os.close(reader)
    stderr = os.fdopen(writer, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", stderr)
    handler = PrefectConsoleHandler(stream=sys.stderr)  # as Prefect's logging.yml makes it
    console_logger.addHandler(handler)
    survive_closed_output()
    assert isinstance(sys.stderr, ClosedSafe) and handler.console.file is sys.stderr
    console_logger.warning("after the worker died")
    print("and a print", file=sys.stderr)
    sys.stderr.flush()
    assert os.path.samestat(os.fstat(stderr.fileno()), os.stat(os.devnull))  # later writers too, the exit's flush
    stderr.close()


def test_other_errors_still_raise(tmp_path):
    stream = open(tmp_path / "f", "w")  # noqa: SIM115
    stream.close()
    with pytest.raises(ValueError):  # a closed file object is a bug, not a closed reader
        ClosedSafe(stream).write("x")
