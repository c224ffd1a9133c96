"""A grpoflow project of the user's own (`grpoflow init DIR`), and where a project keeps its Prefect files.

`init` writes a working project from the templates shipped in the package (flows/templates/project/): prefect.yaml,
work-pools/, spec.yaml on builtin:tiny with the shipped arithmetic data copied into data/, rewards.py (the custom
reward spec.yaml uses), data/incoming/ and a README.md with the project's own commands. What the repository has
already is not copied: the template links the image's files (Dockerfile, .dockerignore, constraints.txt,
scripts/install*.sh), the work pools (deployments/work-pools/) and deployments/prefect.yaml, and the wheel and `init`
carry the files linked to. The project's prefect.yaml is the repository's, its deployments, schedules and triggers
unchanged, with the project's own paths and spec (`project_prefect_yaml`).

    grpoflow init my-project
"""

import json
import re
import shutil
from importlib.resources import files
from pathlib import Path

import yaml

TEMPLATE = Path(str(files("grpoflow.flows") / "templates" / "project"))
EXAMPLES = Path(str(files("grpoflow.examples")))
# The files whose `{project_name}` / `{project_dir}` are filled in (the others are copied as they are).
FILLED = ("README.md",)
# The repository's deployments/prefect.yaml (a link in the template), which `project_prefect_yaml` rewrites.
CHECKOUT_PREFECT_FILE = TEMPLATE / "prefect.yaml"
# The repository's files a project has under other names: its specs are the project's spec.yaml and k8s-spec.yaml,
# its data under data/, and its prefect.yaml at its top.
PROJECT_PATHS = {
    "deployments/nightly.yaml": "spec.yaml",
    "deployments/default-spec.yaml": "spec.yaml",
    "deployments/k8s-spec.yaml": "k8s-spec.yaml",
    "examples/data/": "data/",
    " --prefect-file deployments/prefect.yaml": "",
}
PROJECT_TITLE = "# The Prefect deployments of this project, written by `grpoflow init` from grpoflow's own."
# A path into the repository that no project has: left after PROJECT_PATHS, it needs an entry there.
_CHECKOUT_PATH = re.compile(r"(?<![\w/])(?:deployments|examples)/[\w./-]*")
# A deployment's spec given inline (a mapping under `spec:`, the form's default), with its indent.
_INLINE_SPEC = re.compile(r"^( +)spec:\n((?:\1  .*\n)+)", re.MULTILINE)


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


class _Indented(yaml.SafeDumper):
    """YAML with a list's items indented under their key, as the repository's prefect.yaml writes them."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def project_prefect_yaml(checkout: str, name: str, spec: dict) -> str:
    """A project's prefect.yaml: the repository's (`checkout`, deployments/prefect.yaml), its deployments, schedules,
    triggers, pools and comments as they are, with the project's name, its files for the repository's (`PROJECT_PATHS`)
    and its spec as every inline spec (each keeping its own `output_uri`: runs/ here, a bucket on Kubernetes).

    Args:
        checkout (`str`): the text of the repository's prefect.yaml.
        name (`str`): the project's name (its folder's).
        spec (`dict`): the project's spec.yaml, read.
    Raises:
        ValueError: the repository's file has no title line or top-level `name:`, or names a path of the repository
            that `PROJECT_PATHS` does not map: a change there that this function must learn.
    """
    title, sep, rest = checkout.partition("\n")
    if not title.startswith("# ") or not re.search(r"^name: .*$", rest, re.MULTILINE):
        raise ValueError("deployments/prefect.yaml: expected a title comment line and a top-level `name:`")
    text = PROJECT_TITLE + sep + re.sub(r"^name: .*$", f"name: {json.dumps(name)}", rest, count=1, flags=re.MULTILINE)
    for path, own in PROJECT_PATHS.items():
        text = text.replace(path, own)
    if left := sorted(set(_CHECKOUT_PATH.findall(text))):
        raise ValueError(f"deployments/prefect.yaml names {', '.join(left)}: add the project's own to PROJECT_PATHS")

    def inline(match: re.Match) -> str:
        indent, block = match.group(1), match.group(2)
        own = {**spec, "output_uri": yaml.safe_load(block).get("output_uri", spec.get("output_uri"))}
        dumped = yaml.dump(own, Dumper=_Indented, sort_keys=False, width=119)
        return f"{indent}spec:\n" + "".join(f"{indent}  {line}\n" for line in dumped.splitlines())

    return _INLINE_SPEC.sub(inline, text)


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
    spec = yaml.safe_load((project_dir / "spec.yaml").read_text())
    prefect_yaml = project_prefect_yaml(CHECKOUT_PREFECT_FILE.read_text(), project_dir.name, spec)
    (project_dir / "prefect.yaml").write_text(prefect_yaml)
    (project_dir / "data" / "incoming").mkdir(parents=True)
    shutil.copyfile(EXAMPLES / "data" / "arithmetic.jsonl", project_dir / "data" / "arithmetic.jsonl")
    return sorted(p for p in project_dir.rglob("*") if p.is_file())
