"""`exit_now`: the process ends with its code after everything the interpreter's own exit does that work depends on."""

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, logging, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from grpoflow.trainers.exits import exit_now

    out = sys.argv[1]
    logging.basicConfig(filename=out + ".log", level=logging.INFO)
    atexit.register(lambda: open(out + ".atexit", "w").write("ran"))

    def late_write():
        time.sleep(0.5)
        open(out + ".thread", "w").write("joined")

    threading.Thread(target=late_write).start()  # non-daemon: the exit waits for it
    ThreadPoolExecutor(1).submit(time.sleep, 0.1)  # its worker must not hang the exit
    logging.getLogger("x").info("logged before the exit")
    print("buffered stdout", end="")  # no newline, no flush: exit_now flushes it
    exit_now(int(sys.argv[2]) if sys.argv[2] != "none" else None)
    """
)


def run(tmp_path, code):
    out = tmp_path / "out"
    return out, subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), code], capture_output=True, text=True, timeout=60
    )


def test_exit_now_keeps_the_code_and_the_exit_work(tmp_path):
    out, proc = run(tmp_path, "7")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "buffered stdout"
    assert (tmp_path / "out.atexit").read_text() == "ran"
    assert (tmp_path / "out.thread").read_text() == "joined"
    assert "logged before the exit" in (tmp_path / "out.log").read_text()


def test_exit_now_none_is_zero(tmp_path):
    _, proc = run(tmp_path, "none")
    assert proc.returncode == 0, proc.stderr


def test_the_grpoflow_command_exits_through_it():
    # The console script's target; `grpoflow --help` exits 0 by argparse, an unknown command 2.
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "grpoflow"]
    assert script.value == "grpoflow.flows.cli:entry"
    proc = subprocess.run(
        [sys.executable, "-m", "grpoflow.flows.cli", "jobs", "--json", "--output-uri", "/nonexistent-grpoflow"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"jobs": []}  # the whole output, flushed
