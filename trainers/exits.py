"""Ending a grpoflow process without Python's teardown of its modules.

A process that imported Prefect, datasets and matplotlib (the CLI), or torch, transformers and TRL (a training child),
spends 1-3 s after its last line of work tearing those modules down, object by object, before the OS could have
freed it all at once. `exit_now(code)` does what the interpreter's own exit does that anything could depend on, then
ends the process: threading's exit hooks (a ThreadPoolExecutor's workers are told to finish) and the join of every
non-daemon thread, the atexit handlers (Prefect's log and event workers send what they queued, logging flushes its
handlers, trackers close their runs), and a flush of stdout and stderr. What it skips is the module and object
teardown, and the finalizers that only it would run.

Only the top of a process calls it (the `grpoflow` command, the training children's `__main__`), after its work
returned normally; an exception still takes the ordinary path and prints its traceback.
"""

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    """Ends the process with `code` (None is 0, as for `sys.exit`) after the interpreter's exit work, without its
    module teardown. Call it from the main thread only."""
    # What Py_FinalizeEx does first: threading's exit hooks, then a join of the non-daemon threads (private: see
    # tests/test_private_apis.py).
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader went away
            pass
    os._exit(code or 0)
