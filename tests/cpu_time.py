"""Where the suite's CPU goes, file by file: a pytest plugin for `make test-cpu`.

The suite is CPU-bound on a small machine (its CPU seconds over the cores are about its wall time), so a test's wall
time says little: three workers share two cores, and a test that waits on a server is charged the others' work. This
plugin records, per test (its setup, call and teardown), the CPU seconds of the test's own process and of the child
processes that ended and were waited for meanwhile (`RUSAGE_CHILDREN`: a child's own waited-for children included).
A module's servers are charged to the test whose teardown stops them (the module's last), and a session fixture's
processes to the test that runs last on that worker: read a file's total, not a single test's, for those.

Each worker appends its records to `--cpu-time PATH` (JSON lines); at the end, the controller prints the files by
CPU seconds and their total, which `time`'s user + sys for the whole run exceeds by what no test was charged (the
workers' own start, a session fixture's processes still running at the end).
"""

import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--cpu-time", metavar="PATH", help="append each test's CPU seconds to PATH (JSON lines)")


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("cpu_time")
    if not path:
        yield
        return
    own, children, started = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    record = {
        "test": item.nodeid,
        "own": round(_cpu(resource.RUSAGE_SELF) - own, 3),
        "children": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
        "wall": round(time.monotonic() - started, 3),
    }
    with open(path, "a") as f:  # one short line per write: workers' lines do not interleave
        f.write(json.dumps(record) + "\n")


def summary(records: list[dict], top: int = 20) -> list[str]:
    """The lines `make test-cpu` prints: the `top` files by CPU seconds, then the total."""
    files = collections.defaultdict(lambda: {"own": 0.0, "children": 0.0, "wall": 0.0, "tests": 0})
    for record in records:
        totals = files[record["test"].split("::")[0]]
        for key in ("own", "children", "wall"):
            totals[key] += record[key]
        totals["tests"] += 1
    ranked = sorted(files.items(), key=lambda kv: -(kv[1]["own"] + kv[1]["children"]))
    total = sum(t["own"] + t["children"] for t in files.values()) or 1e-9  # a run of nothing but instant tests
    lines = [f"{'CPU s':>7} {'share':>6} {'own':>7} {'children':>8} {'wall s':>7} {'tests':>5}  file"]
    for name, t in ranked[:top]:
        cpu = t["own"] + t["children"]
        shares = f"{cpu:7.0f} {cpu / total:6.1%} {t['own']:7.0f} {t['children']:8.0f}"
        lines.append(f"{shares} {t['wall']:7.0f} {t['tests']:5d}  {name}")
    lines.append(f"{total:7.0f} in all, {len(records)} tests in {len(files)} files")
    return lines


def pytest_sessionfinish(session):
    path = session.config.getoption("cpu_time")
    if not path or os.environ.get("PYTEST_XDIST_WORKER") or not Path(path).exists():
        return
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reporter.write_sep("=", f"CPU seconds by test file (from {path})")
    for line in summary(records):
        reporter.write_line(line)
