"""Python's cyclic garbage collector paused while a grpoflow process imports its heavy modules.

Importing Prefect or datasets makes hundreds of thousands of long-lived objects and almost no garbage, and the
collector walks all of them again and again while they accumulate: its passes are a fifth to a quarter of the
imports' time (measured: `grpoflow run` to its flow run's start 3.3 s -> 2.95 s). `pause()` before the imports;
`resume()` after them freezes what exists then out of later passes (it stays alive for the process anyway) and turns
the collector back on.

The `grpoflow` command (`grpoflow.flows.cli.entry`) pauses it first thing; `run` and `demo` resume it once their flow's
modules are imported, every other command as it starts. `main()` called in a process of its own choosing (a test)
finds it running and leaves it so.
"""

import gc


def pause() -> None:
    gc.disable()


def resume() -> None:
    """Ends a `pause()`; a second call, or one without a pause, changes nothing."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
