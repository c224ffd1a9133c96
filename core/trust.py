"""Who may run what: a spec given on the user's own command line against one that comes from a deployment.

A spec given on the user's own command line (`grpoflow validate`, `run`, `sweep`) may name any importable module and
any path: the user is the operator of their machine. A spec that arrives any other way (a deployment's parameter from
the Prefect UI form, `grpoflow submit`, an event, a watcher, the jobs API) comes from whoever may launch a run: the
operator's policy (`grpoflow.core.policy`) says what it may name, and everything else is refused.

Code carried inside a spec (a `python` grader's source, in a `grader:` or anywhere in a `kwargs`) runs in the sandbox
(`grpoflow.trainers.graders.sandbox`), wherever the spec came from. Where no sandbox can start, it runs in a bare
process only on the user's own command line (with one warning); from a deployment it is refused.

The CLI marks its commands with `command_line()`; every flow that takes a spec checks it with `deployment_problems`
first, before any stage imports a reward or reads a path, and ends `Rejected` naming the policy line that would allow
it. The training children learn where their spec came from through `SPEC_ORIGIN_ENV` (`origin_env`), which the
launcher sets for them whatever the flow's own environment held.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from grpoflow.core.uris import LOCAL_SCHEMES, file_path, url_scheme

if TYPE_CHECKING:  # the CLI imports this module at its start: no pydantic models then
    from grpoflow.core.spec import JobSpec

SPEC_ORIGIN_ENV = "GRPOFLOW_SPEC_ORIGIN"  # set by the launcher for its children: command_line or deployment

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


def deployment_problems(spec: JobSpec, project: Path | None = None, team: str | None = None) -> list[str]:
    """What the operator's policy refuses `spec` from a deployment (`grpoflow.core.policy.deployment_check`);
    empty when allowed, or when the spec came from the user's own command line."""
    if from_command_line():
        return []
    os.environ.pop(SPEC_ORIGIN_ENV, None)  # a flow run's environment says nothing of where its spec came from
    from grpoflow.core.policy import deployment_check  # every command imports this module; the policy, seldom

    return deployment_check(spec, project, team)


def path_outside(where: str, path: str, project: Path | None = None) -> str | None:
    """Why the local `path` (a watcher's or an event's `where`) may not be used by a run from a deployment, or None:
    it resolves, its symbolic links followed, outside the project folder and the policy's `from_deployments.paths`."""
    if from_command_line() or url_scheme(path) not in LOCAL_SCHEMES:
        return None
    from grpoflow.core.policy import PolicyError, load_policy

    project = Path(project or os.getcwd())
    try:
        loaded = load_policy(project)
        resolved = (project / Path(file_path(path)).expanduser()).resolve()
    except (PolicyError, ValueError) as e:  # ValueError: a file:// URL of another host
        return f"{where}: {e}"
    listed = [p for p in loaded.policy.from_deployments.paths if url_scheme(p) in LOCAL_SCHEMES]
    roots = [project.resolve(), *((project / Path(file_path(p)).expanduser()).resolve() for p in listed)]
    if any(resolved.is_relative_to(root) for root in roots):
        return None
    return (
        f"{where}: {path} is outside the folders a run from a deployment may use (the project and the policy's "
        f"paths: {os.pathsep.join(map(str, roots))}); the policy ({loaded.source}) allows it with "
        f"`from_deployments.paths: [{resolved.parent}]`"
    )


def spec_from_command_line() -> bool:
    """Whether the spec being run came from the user's own command line: this process's, or the launcher's that
    started it (`origin_env`)."""
    return from_command_line() or os.environ.get(SPEC_ORIGIN_ENV) == "command_line"


def unsandboxed_allowed() -> bool:
    """Whether spec code may run without the sandbox where none can start: only for the user's own command line."""
    return spec_from_command_line()


def unsandboxed_refusal(problem: str) -> str:
    """The message for spec code that would have to run without the sandbox, and may not."""
    return (
        "a python grader is code carried inside the spec and, from a deployment, runs only in the sandbox, which "
        f"cannot start on this worker ({problem}); install bubblewrap where the job runs (docs/guides/security.md)"
    )


def origin_env() -> dict[str, str]:
    """The variable that tells a child process where the spec it runs came from (see `unsandboxed_allowed`)."""
    return {SPEC_ORIGIN_ENV: "command_line" if from_command_line() else "deployment"}
