"""The layers import one way (docs/design.md, "Layers"): each folder imports only the layers below it, checked
statically over every import in its modules (those inside functions included), and the ML never imports Prefect."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Bottom to top: a layer may import itself and the layers before it.
ORDER = ["trainers", "jobs", "integrations", "cluster", "tasks", "flows"]
OUTSIDE = {"examples": {"trainers"}}  # the demo's reward modules and agents use the built-in helpers only


def grpoflow_imports(path: Path) -> set[str]:
    """The grpoflow layers a module imports (`grpoflow.trainers.x` -> `trainers`), and `prefect` if it does."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "grpoflow"]
        for name in names:
            parts = name.split(".")
            if parts[0] == "grpoflow" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] == "prefect":
                found.add("prefect")
    return found


def allowed(layer: str) -> set[str]:
    return OUTSIDE.get(layer) or set(ORDER[: ORDER.index(layer) + 1])


@pytest.mark.parametrize("layer", ORDER + list(OUTSIDE))
def test_a_layer_imports_only_the_layers_below_it(layer):
    wrong = {}
    for path in sorted((ROOT / layer).rglob("*.py")):
        if "templates" in path.parts:
            continue
        upward = grpoflow_imports(path) - allowed(layer) - {"prefect", "__version__"}
        if upward:
            wrong[str(path.relative_to(ROOT))] = sorted(upward)
    assert wrong == {}, f"{layer}/ imports layers above it: {wrong}"


@pytest.mark.parametrize("layer", ["trainers", "jobs"])
def test_the_ml_and_the_job_service_run_without_prefect(layer):
    users = [str(p.relative_to(ROOT)) for p in (ROOT / layer).rglob("*.py") if "prefect" in grpoflow_imports(p)]
    assert users == []


def test_the_walk_sees_imports():
    assert grpoflow_imports(ROOT / "flows" / "pipeline.py") >= {"tasks", "trainers", "prefect"}
