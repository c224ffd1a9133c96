"""A grpoflow project of the user's own (`grpoflow init DIR`), and where a project keeps its Prefect files.

`init` writes a working project from the templates shipped in the package (flows/templates/project/): prefect.yaml
(the four deployments, run in the project folder), work-pools/, spec.yaml on builtin:tiny with the shipped
arithmetic data copied into data/, rewards.py (the custom reward spec.yaml uses), data/incoming/ and a README.md
with the project's own commands. The image's files (Dockerfile, .dockerignore, constraints.txt, scripts/install*.sh)
are the repository's own: the template links them, and the wheel and `init` carry the files linked to.

    grpoflow init my-project
"""

import shutil
from importlib.resources import files
from pathlib import Path

TEMPLATE = Path(str(files("grpoflow.flows") / "templates" / "project"))
EXAMPLES = Path(str(files("grpoflow.examples")))
# The files whose `{project_name}` / `{project_dir}` are filled in (the others are copied as they are).
FILLED = ("README.md", "prefect.yaml")


class ProjectError(Exception):
    """The user's mistake about a project folder: one message, exit code 2."""


def project_files(project_dir: Path) -> tuple[Path, Path]:
    """The project's prefect.yaml and work-pools/pools.yaml: at its top (`grpoflow init`), or under deployments/
    (grpoflow's own checkout)."""
    for prefect_file in (project_dir / "prefect.yaml", project_dir / "deployments" / "prefect.yaml"):
        if prefect_file.is_file():
            return prefect_file, prefect_file.parent / "work-pools" / "pools.yaml"
    raise ProjectError(
        f"{project_dir} has no prefect.yaml: run this in a grpoflow project, give --project DIR, "
        "or start one with `grpoflow init DIR`"
    )


def init_project(project_dir: Path) -> list[Path]:
    """Writes a new project into `project_dir` (created if missing; it must be empty); returns the files written.

    Args:
        project_dir (`Path`): the folder to write; a non-empty one is refused with `ProjectError`.
    """
    if project_dir.exists() and (not project_dir.is_dir() or any(project_dir.iterdir())):
        raise ProjectError(f"{project_dir} exists and is not empty: give a new or empty folder")
    project_dir = project_dir.resolve()
    shutil.copytree(TEMPLATE, project_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FILLED:
        path = project_dir / name
        text = path.read_text().replace("{project_name}", project_dir.name).replace("{project_dir}", str(project_dir))
        path.write_text(text)
    (project_dir / "data" / "incoming").mkdir(parents=True)
    shutil.copyfile(EXAMPLES / "data" / "arithmetic.jsonl", project_dir / "data" / "arithmetic.jsonl")
    return sorted(p for p in project_dir.rglob("*") if p.is_file())
