"""Who may run what: the code a spec may name, by where the spec came from (shared/DESIGN.md, "Who may run what" and
"Sandbox").

A spec given on the user's own command line (`grpoflow validate`, `run`, `sweep`) may name any importable module: the
user is the operator of their machine. A spec that arrives any other way (a deployment's parameter from the Prefect
UI form, `grpoflow submit`, an event, a watcher) comes from whoever may launch a run, and may name only callables the
work pool allows: the project's own modules (found under the flow run's working folder, the project), `trl.rewards`,
the modules listed in the pool's environment, `GRPOFLOW_REWARD_MODULES` (comma-separated; a package allows its
submodules), and what grpoflow ships as rewards (`grpoflow.trainers.rewards.builtin`, and `grpoflow.examples`); no
other grpoflow callable, since a factory of grpoflow's that takes a grader or code in its kwargs would carry spec
code past these rules. The check reads only the spec and where each module's files are: it imports nothing.

Code carried inside a spec (a `python` grader's source, in a `grader:` or anywhere in a `kwargs`) runs in the sandbox
(`grpoflow.trainers.graders.sandbox`), wherever the spec came from. Where no sandbox can start, it runs in a bare
process only on the user's own command line (with one warning) or where the pool sets
`GRPOFLOW_ALLOW_SPEC_CODE=unsandboxed`; a spec from a deployment is refused otherwise, and `GRPOFLOW_ALLOW_SPEC_CODE=0`
refuses such code from a deployment even with the sandbox.

Local paths: where the work pool sets `GRPOFLOW_DEPLOYED_PATHS` (folders, separated by `os.pathsep`; relative ones
are the project folder's), every local path a spec from a deployment names (`dataset.uri`, a local `base_model` or
reward model, `output_uri`, an event's spec file, a watcher's folders) must resolve, symbolic links followed, inside
the project folder or one of them; unset, the worker's file system is the boundary.

The CLI marks its commands with `command_line()`; every flow that takes a spec checks it with `deployment_problems`
first, before any stage imports a reward or reads a path, and ends `Rejected` naming the setting that would allow it.
The training children learn where their spec came from through `SPEC_ORIGIN_ENV` (`origin_env`).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from grpoflow.trainers.graders import CODE_GRADERS
from grpoflow.trainers.uris import LOCAL_SCHEMES, file_path, url_scheme

if TYPE_CHECKING:  # the CLI imports this module at its start: no pydantic models then
    from grpoflow.trainers.spec import JobSpec

REWARD_MODULES_ENV = "GRPOFLOW_REWARD_MODULES"
SPEC_CODE_ENV = "GRPOFLOW_ALLOW_SPEC_CODE"
PATHS_ENV = "GRPOFLOW_DEPLOYED_PATHS"  # the folders a deployment's spec may name local paths in
SPEC_ORIGIN_ENV = "GRPOFLOW_SPEC_ORIGIN"  # set by the launcher for its children: command_line or deployment
# What grpoflow ships as rewards, tools and environments (no factory of them takes code), and TRL's rewards.
ALWAYS_ALLOWED = ("grpoflow.trainers.rewards.builtin", "grpoflow.examples", "trl.rewards")

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
    """Where the spec carries code of its own: each `python` grader, in a `grader:` (a multi grader's sub-graders
    included) or anywhere in a `kwargs` (a factory named by `function:` that takes a grader)."""
    entries = [(f"rewards[{i}]", r) for i, r in enumerate(spec.rewards)]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None):
        entries.append(("evaluation.metric", metric))
    places = []
    for where, entry in entries:
        places += _python_graders(getattr(entry, "grader", None), f"{where}.grader")
        places += _python_graders(getattr(entry, "kwargs", None), f"{where}.kwargs")
    return places


def _python_graders(value: object, where: str) -> list[str]:
    """The places under `value` (a grader, kwargs, any nesting of mappings and lists) that hold a python grader."""
    if isinstance(value, dict):
        found = [where] if value.get("type") in CODE_GRADERS else []
        return found + [p for k, v in value.items() for p in _python_graders(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _python_graders(v, f"{where}[{i}]")]
    return []


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
        if any(module == a or module.startswith(a + ".") for a in allowed):
            continue
        if _in_project(module, project) and module.split(".")[0] != "grpoflow":  # grpoflow's checkout as a project
            continue
        problems.append(
            f"{where}: module {module!r} is not allowed for a run launched from a deployment (the UI form, submit, "
            f"an event): a spec from there may name the project's own modules, {', '.join(ALWAYS_ALLOWED)} and "
            f"those the work pool lists in {REWARD_MODULES_ENV}" + _how_to_allow(module)
        )
    return problems + _spec_code_problems(spec)


def deployment_problems(spec: JobSpec, project: Path | None = None) -> list[str]:
    """What a spec from outside the command line may not do: name a module the pool does not allow, carry code that
    may not run here, or name a local path outside the pool's `GRPOFLOW_DEPLOYED_PATHS`; empty when none (or when the
    spec came from the command line)."""
    return untrusted_code(spec, project) + untrusted_paths(spec, project)


def local_paths(spec: JobSpec) -> list[tuple[str, str]]:
    """Every local path the spec names, with where: (location, path as given); URLs of a store and Hub ids are not
    paths."""
    from grpoflow.trainers.model.gguf import is_gguf
    from grpoflow.trainers.model.load import is_local_model

    found = [("dataset.uri", spec.dataset.uri), ("output_uri", spec.output_uri)]
    models = [("base_model", spec.base_model)] + [(f"rewards[{i}].model", r.model) for i, r in enumerate(spec.rewards)]
    metric = spec.evaluation.metric
    if not isinstance(metric, str | None):
        models.append(("evaluation.metric.model", metric.model))
    found += [
        (where, model)
        for where, model in models
        if model and not model.startswith("builtin:") and (is_local_model(model) or is_gguf(model))
    ]
    return [(where, path) for where, path in found if url_scheme(path) in LOCAL_SCHEMES]


def untrusted_paths(spec: JobSpec, project: Path | None = None) -> list[str]:
    """The spec's local paths outside the project folder and the folders the pool allows a deployment's spec
    (`GRPOFLOW_DEPLOYED_PATHS`); empty when it sets none, or when the spec came from the command line."""
    return [problem for where, path in local_paths(spec) if (problem := path_outside(where, path, project))]


def allowed_roots(project: Path | None = None) -> list[Path] | None:
    """The project folder and the folders of `GRPOFLOW_DEPLOYED_PATHS`, resolved (relative ones against the project
    folder); None when the pool sets none."""
    listed = [p.strip() for p in os.environ.get(PATHS_ENV, "").split(os.pathsep) if p.strip()]
    if not listed:
        return None
    project = Path(project or os.getcwd())
    return list(dict.fromkeys((project / Path(p).expanduser()).resolve() for p in [".", *listed]))


def path_outside(where: str, path: str, project: Path | None = None) -> str | None:
    """Why the local `path` (a spec's `where`) may not be used by a run from a deployment, or None: it resolves, its
    symbolic links followed, outside the project folder and every folder of `GRPOFLOW_DEPLOYED_PATHS`."""
    roots = allowed_roots(project)
    if roots is None or from_command_line() or url_scheme(path) not in LOCAL_SCHEMES:
        return None
    try:
        resolved = (Path(project or os.getcwd()) / Path(file_path(path)).expanduser()).resolve()
    except ValueError as e:  # a file:// URL of another host
        return f"{where}: {e}"
    if any(resolved.is_relative_to(root) for root in roots):
        return None
    return (
        f"{where}: {path} is outside the folders this work pool lets a run from a deployment read and write "
        f"(the project and {PATHS_ENV}: {os.pathsep.join(map(str, roots))}); put it under one of them, or add its "
        f"folder to {PATHS_ENV} in the pool's environment"
    )


def _spec_code_problems(spec: JobSpec) -> list[str]:
    """Why the spec's own code may not run for a spec from a deployment: refused by the pool, or no sandbox here."""
    places = spec_code(spec)
    allowance = os.environ.get(SPEC_CODE_ENV, "sandboxed")
    if not places or allowance == "unsandboxed":
        return []
    if allowance == "0":
        return [
            f"{where}: a python grader is code carried inside the spec, which this work pool refuses from a "
            f"deployment ({SPEC_CODE_ENV}=0 in its environment)"
            for where in places
        ]
    from grpoflow.trainers.graders.sandbox import sandbox_problem

    problem = sandbox_problem()
    return [f"{where}: {unsandboxed_refusal(problem)}" for where in places] if problem else []


def spec_from_command_line() -> bool:
    """Whether the spec being run came from the user's own command line: this process's, or the launcher's that
    started it (`origin_env`)."""
    return from_command_line() or os.environ.get(SPEC_ORIGIN_ENV) == "command_line"


def unsandboxed_allowed() -> bool:
    """Whether spec code may run without the sandbox where none can start: the user's own command line, or the work
    pool's `GRPOFLOW_ALLOW_SPEC_CODE=unsandboxed`."""
    return os.environ.get(SPEC_CODE_ENV) == "unsandboxed" or spec_from_command_line()


def unsandboxed_refusal(problem: str) -> str:
    """The message for spec code that would have to run without the sandbox, and may not."""
    return (
        "a python grader is code carried inside the spec and runs only in the sandbox, which cannot start on this "
        f"worker ({problem}); install bubblewrap where the job runs (docs/guides/security.md), or set "
        f"{SPEC_CODE_ENV}=unsandboxed in the work pool's environment to run it without one"
    )


def origin_env() -> dict[str, str]:
    """The variable that tells a child process where the spec it runs came from (see `unsandboxed_allowed`)."""
    return {SPEC_ORIGIN_ENV: "command_line" if from_command_line() else "deployment"}


def _how_to_allow(module: str) -> str:
    if module == "grpoflow" or module.startswith("grpoflow."):
        return (
            "; no other grpoflow module (its factories can carry a grader or code past these rules): name a built-in "
            "reward by its name, or give a grader in the entry's `grader:`"
        )
    return f" (set {REWARD_MODULES_ENV}={module} in its environment to allow this one)"
