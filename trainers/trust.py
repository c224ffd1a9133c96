"""Who may run what: the code a spec may name, by where the spec came from (shared/DESIGN.md, "Who may run what").

A spec given on the user's own command line (`grpoflow validate`, `run`, `sweep`) may name any importable module: the
user is the operator of their machine. A spec that arrives any other way (a deployment's parameter from the Prefect
UI form, `grpoflow submit`, an event, a watcher) comes from whoever may launch a run, and may name only modules the
work pool allows: the project's own (found under the flow run's working folder, the project), grpoflow's,
`trl.rewards`, and those listed in the pool's environment, `GRPOFLOW_REWARD_MODULES` (comma-separated; a package
allows its submodules); and it may carry code of its own (a `python` grader's source) only where the pool's
environment sets `GRPOFLOW_ALLOW_SPEC_CODE=1`. The check reads only the spec and where each module's files are: it
imports nothing.

The CLI marks its commands with `command_line()`; every flow that takes a spec checks it with `untrusted_code`
first, before any stage imports a reward, and ends `Rejected` naming the setting that would allow it.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module at its start: no pydantic models then
    from grpoflow.trainers.spec import JobSpec

REWARD_MODULES_ENV = "GRPOFLOW_REWARD_MODULES"
SPEC_CODE_ENV = "GRPOFLOW_ALLOW_SPEC_CODE"
ALWAYS_ALLOWED = ("grpoflow", "trl.rewards")

_command_line = 0  # commands of the user's own command line running in this process
_guard = threading.Lock()


@contextlib.contextmanager
def command_line():
    """Marks what runs inside as the user's own command (its specs may name any module), threads included."""
    global _command_line
    with _guard:
        _command_line += 1
    try:
        yield
    finally:
        with _guard:
            _command_line -= 1


def from_command_line() -> bool:
    """Whether the spec being run came from the user's own command line in this process."""
    return _command_line > 0


def code_references(spec: JobSpec) -> list[tuple[str, str]]:
    """Every `package.module:callable` the spec names, with where: (location, reference)."""
    refs = [(f"rewards[{i}].function", r.function) for i, r in enumerate(spec.rewards) if r.function]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None) and metric.function:
        refs.append(("evaluation.metric.function", metric.function))
    refs += [(f"tools[{i}]", tool) for i, tool in enumerate(spec.tools)]
    if spec.environment:
        refs.append(("environment", spec.environment))
    return refs


def spec_code(spec: JobSpec) -> list[str]:
    """Where the spec carries code of its own: each `python` grader (a multi grader's sub-graders included)."""
    entries = [(f"rewards[{i}]", r) for i, r in enumerate(spec.rewards)]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None):
        entries.append(("evaluation.metric", metric))
    places = []
    for where, entry in entries:
        grader = getattr(entry, "grader", None) or {}
        subs = grader.get("graders") if grader.get("type") == "multi" else None
        named = {} if not isinstance(subs, dict) else {"": subs} if "type" in subs else subs
        if grader.get("type") == "python":
            places.append(f"{where}.grader")
        places += [f"{where}.grader.graders" + (f".{n}" if n else "") for n, g in named.items() if _is_python(g)]
    return places


def _is_python(grader: object) -> bool:
    return isinstance(grader, dict) and grader.get("type") == "python"


def allowed_modules() -> list[str]:
    """The module prefixes allowed besides the project's own: grpoflow's, trl.rewards, and the pool's list."""
    listed = [m.strip() for m in os.environ.get(REWARD_MODULES_ENV, "").split(",") if m.strip()]
    return [*ALWAYS_ALLOWED, *listed]


def _in_project(module: str, project: Path) -> bool:
    """Whether `module`'s top-level package or module lives under `project`, looked up as its import would find it
    (the project folder after sys.path, as trainers/rewards/build.py imports it), without importing anything."""
    top = module.split(".")[0]
    if top in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(top) is not None:
        return False  # os, sys, ...: no file, never the project's
    found = importlib.machinery.PathFinder.find_spec(top, [*sys.path, str(project)])
    if found is None:
        return False
    places = [found.origin] if found.has_location and found.origin else []
    places += list(found.submodule_search_locations or [])
    root = project.resolve()
    return bool(places) and all(Path(p).is_absolute() and Path(p).resolve().is_relative_to(root) for p in places)


def untrusted_code(spec: JobSpec, project: Path | None = None) -> list[str]:
    """The spec's references to modules a spec from outside the command line may not name; empty when allowed (or
    when the spec came from the command line)."""
    if from_command_line():
        return []
    project = Path(project or os.getcwd())
    allowed = allowed_modules()
    problems = []
    for where, ref in code_references(spec):
        module = ref.partition(":")[0]
        if any(module == a or module.startswith(a + ".") for a in allowed) or _in_project(module, project):
            continue
        problems.append(
            f"{where}: module {module!r} is not allowed for a run launched from a deployment (the UI form, submit, "
            f"an event): a spec from there may name the project's own modules, {', '.join(ALWAYS_ALLOWED)} and "
            f"those the work pool lists in {REWARD_MODULES_ENV} (set {REWARD_MODULES_ENV}={module} in its "
            "environment to allow this one)"
        )
    if os.environ.get(SPEC_CODE_ENV) != "1":
        problems += [
            f"{where}: a python grader is code carried inside the spec, which a run launched from a deployment (the "
            f"UI form, submit, an event) may carry only where the work pool's environment sets {SPEC_CODE_ENV}=1"
            for where in spec_code(spec)
        ]
    return problems
