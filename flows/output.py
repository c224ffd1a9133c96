"""A flow run's process outlives its worker: a closed stdout or stderr is no error.

A process worker starts each flow run with its stdout and stderr on pipes it reads and prints. When the worker dies
(SIGKILL, an upgrade, a lost terminal) the pipes close, and the run's next console line meets a broken pipe: rich,
which Prefect's console handler prints through, answers it with `SystemExit(1)`, which crashes the run and stops its
training child. Everything the run says also goes elsewhere (Prefect's API log, the job's `logs/`, the training
child's own log file), so a console with no reader is only a console: `survive_closed_output()` wraps stdout,
stderr and every logging handler (Prefect's console handler among them) that writes to them in `ClosedSafe`, which
points the closed descriptor at /dev/null on the first broken pipe and goes on.
"""

import errno
import logging
import os
import sys


class ClosedSafe:
    """`stream` (a text stream on a file descriptor), whose writes and flushes never fail on a closed reader: the
    first broken pipe points the descriptor at /dev/null (so the interpreter's own flush at exit, and any other
    writer of that descriptor, succeed too) and the text is dropped."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            self._closed(e)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._closed(e)

    def _closed(self, error: OSError) -> None:
        if error.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise error
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:  # what the stream still buffers now goes to /dev/null
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def survive_closed_output() -> None:
    """Wraps `sys.stdout`, `sys.stderr` and the logging handlers writing to them (a `StreamHandler`'s stream; a rich
    console's file, as Prefect's console handler holds one) in `ClosedSafe`; calling it again changes nothing."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ClosedSafe) and _has_fd(stream):
            setattr(sys, name, ClosedSafe(stream))
    originals = {id(s._stream): s for s in (sys.stdout, sys.stderr) if isinstance(s, ClosedSafe)}
    for handler in _handlers():
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in originals:
            handler.setStream(originals[id(handler.stream)])
        console = getattr(handler, "console", None)  # rich.console.Console: its `file` is public and settable
        if console is not None and id(console.file) in originals:
            console.file = originals[id(console.file)]


def _has_fd(stream) -> bool:
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    return True


def _handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    return list({id(h): h for logger in loggers for h in getattr(logger, "handlers", [])}.values())
