"""Every third-party package grpoflow's modules import is one pyproject.toml declares: a dependency, or an extra for
the optional features (a package installed only because another one brings it can leave with that one's upgrade)."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Modules whose distribution is not installed here (CUDA-only extras): the distribution each comes from.
NOT_INSTALLED_HERE = {"unsloth": "unsloth", "liger_kernel": "liger-kernel", "vllm": "vllm", "deepspeed": "deepspeed"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imported_modules() -> set[str]:
    folders = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"grpoflow"}


def test_every_imported_package_is_declared():
    declared = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    declared |= {_name(r) for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra}
    declared.add("torch")  # installed first, pinned by the Makefile and the Dockerfile (see pyproject.toml)
    distributions = packages_distributions()
    missing = {}
    for module in sorted(_imported_modules()):
        names = distributions.get(module) or [NOT_INSTALLED_HERE.get(module, module)]
        if not {_name(n) for n in names} & declared:
            missing[module] = names
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"
    assert "torch" in _imported_modules() and "prefect" in _imported_modules()  # the walk found the imports
