"""The image the Kubernetes deployments run (Dockerfile) and the prefect.yaml steps that build and push it. No Docker
daemon or registry is reachable here, so the image is never built: the Dockerfile is linted (hadolint, every finding
fails), its install step is shown to be CI's own (scripts/install.sh, which `make install` runs), the script's pip
commands are read back through a stand-in python, and the build/push steps are checked for the shape prefect-docker
takes and templated the way `prefect deploy` templates them."""

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from prefect.utilities.templating import apply_values

from grpoflow.flows.deployments import PREFECT_FILE, PROJECT_DIR, image_deployments
from grpoflow.flows.project import TEMPLATE
from tests.deployments.test_prefect_yaml import prefect_file_of

HADOLINT = Path(sys.executable).parent / "hadolint"
DOCKERFILE = PROJECT_DIR / "Dockerfile"
INSTALL = PROJECT_DIR / "scripts" / "install.sh"
K8S = {"retrain-k8s", "nightly-k8s", "on-new-data-k8s"}
BUILD = "prefect_docker.deployments.steps.build_docker_image"
PUSH = "prefect_docker.deployments.steps.push_docker_image"


def instructions(path: Path) -> list[tuple[str, str]]:
    """The Dockerfile's (INSTRUCTION, arguments), continuation lines joined, comments left out."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def args(path: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in instructions(path) if i == "ARG")


def makefile_torch() -> str:
    return re.search(r"^TORCH_VERSION \?= (\S+)$", (PROJECT_DIR / "Makefile").read_text(), re.M).group(1)


# --- lint ----------------------------------------------------------------------------------------------------------


def hadolint(path: Path) -> subprocess.CompletedProcess:
    command = [HADOLINT, "--config", PROJECT_DIR / ".hadolint.yaml", "--no-color", path]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", [DOCKERFILE, TEMPLATE / "Dockerfile"], ids=["checkout", "init-template"])
def test_hadolint_finds_nothing(path):
    lint = hadolint(path)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize(
    "dockerfile, rule",
    [
        ("FROM ubuntu\nUSER 1000\n", "DL3006"),  # untagged base image (a warning)
        ("FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y curl\nUSER 1000\n", "DL3008"),  # unpinned apt
        ("FROM ubuntu:24.04\nRUN cd /tmp && echo hi\nUSER 1000\n", "DL3003"),  # cd instead of WORKDIR
        ("FROM quay.io/some/image:1.0\nUSER 1000\n", "DL3026"),  # a registry .hadolint.yaml does not trust
    ],
)
def test_hadolint_fails_on_a_finding(tmp_path, dockerfile, rule):
    (tmp_path / "Dockerfile").write_text(dockerfile)
    lint = hadolint(tmp_path / "Dockerfile")
    assert lint.returncode != 0 and rule in lint.stdout, lint.stdout


# --- the install step is CI's --------------------------------------------------------------------------------------


def test_dockerfile_installs_with_the_ci_script():
    steps = instructions(DOCKERFILE)
    runs = [a for i, a in steps if i == "RUN"]
    assert 'bash scripts/install.sh python "$EXTRAS"' in runs
    # No other package install in the image: everything goes through the script and constraints.txt.
    assert not [r for r in runs if re.search(r"\b(pip|conda|apt-get|apt)\b", r)]
    # The project is copied in before the script runs from it.
    names = [i for i, _ in steps]
    assert names.index("COPY") < [n for n, (i, a) in enumerate(steps) if "install.sh" in a][0]


@pytest.mark.parametrize("target", ["install", "test"])  # .ci/run runs `make test`, which installs first
def test_make_installs_with_the_same_script(tmp_path, target):
    assert re.search(r"^make test$", (PROJECT_DIR / ".ci" / "run").read_text(), re.M)
    venv = tmp_path / "venv"  # missing: make plans the whole install
    dry = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=PROJECT_DIR, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert f"TORCH_VERSION={makefile_torch()} scripts/install.sh {venv}/bin/python dev,qlora,math" in dry.stdout
    assert "pip install" not in dry.stdout  # only the script installs


def fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in interpreter that records each command line it gets, one per line, and installs nothing."""
    log = tmp_path / "pip.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    python.chmod(0o755)
    return python, log


def install(cwd: Path, python: Path, extras: str, **env) -> subprocess.CompletedProcess:
    script = cwd / "scripts" / "install.sh"
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_VERSION", "GRPOFLOW_VERSION")} | env
    return subprocess.run(["bash", script, python, extras], cwd=cwd, env=environ, capture_output=True, text=True)


def test_install_script_in_the_checkout(tmp_path):
    python, log = fake_python(tmp_path)
    assert install(PROJECT_DIR, python, "dev,qlora,math").returncode == 0
    assert log.read_text().splitlines() == [
        "-m pip install --quiet --upgrade pip",
        f"-m pip install --quiet -c constraints.txt torch=={makefile_torch()}",  # the script's default = Makefile's
        "-m pip install --quiet -c constraints.txt -e .[dev,qlora,math]",
        # dev only: the tracker the tests read back, without the dependencies that would change the suite's servers
        "-m pip install --quiet --no-deps -c constraints.txt trackio gradio_client brotli python-multipart",
    ]


def test_install_script_in_an_init_project(tmp_path):
    from tests.conftest import cli

    proj = tmp_path / "proj"
    assert cli("init", proj)[0] == 0
    python, log = fake_python(tmp_path)
    done = install(proj, python, "qlora,math", GRPOFLOW_VERSION="0.1.0", TORCH_VERSION="2.13.0")
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines()[1:] == [
        "-m pip install --quiet -c constraints.txt torch==2.13.0",
        "-m pip install --quiet -c constraints.txt --find-links wheels grpoflow[qlora,math]==0.1.0",
    ]
    # Without the version it says what to set, and installs no grpoflow.
    log.unlink()
    refused = install(proj, python, "qlora,math")
    assert refused.returncode != 0 and "GRPOFLOW_VERSION" in refused.stderr
    assert "grpoflow" not in log.read_text()


def test_dockerfile_versions_match():
    [(_, base)] = [(i, a) for i, a in instructions(DOCKERFILE) if i == "FROM"]
    torch = makefile_torch()
    assert re.fullmatch(rf"pytorch/pytorch:{re.escape(torch)}-cuda12\.\d+-cudnn9-runtime", base), base
    values = args(DOCKERFILE)
    assert values["TORCH_VERSION"] == torch and values["GRPOFLOW_VERSION"] == version("grpoflow")
    # Each default extra is pinned by constraints.txt (vllm and deepspeed are not, so they are opt-in).
    extras = tomllib.loads((PROJECT_DIR / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = {line.split("==")[0].lower() for line in (PROJECT_DIR / "constraints.txt").read_text().splitlines()}
    for extra in values["EXTRAS"].split(","):
        for requirement in extras[extra]:
            assert re.split(r"[<>=\[ ]", requirement)[0].lower() in pinned, requirement


def test_dockerfile_runs_as_a_user_in_the_project_folder():
    steps = instructions(DOCKERFILE)
    [user] = [a for i, a in steps if i == "USER"]
    assert steps[-2] == ("USER", user) and re.fullmatch(r"[1-9]\d*:[1-9]\d*", user)  # numeric: runAsNonRoot works
    [workdir] = [a for i, a in steps if i == "WORKDIR"]
    config = yaml.safe_load(PREFECT_FILE.read_text())
    for deployment in config["deployments"]:
        if deployment["name"] in K8S:  # the pods' flows run in the image's project folder
            assert deployment["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": workdir}}]


def test_dockerignore_keeps_secrets_and_environments_out():
    ignored = (PROJECT_DIR / ".dockerignore").read_text().splitlines()
    assert {".git", ".venv", ".env", "runs", "**/__pycache__"} <= set(ignored)
    assert not {"examples", "deployments", "constraints.txt", "scripts"} & set(ignored)  # what the image needs


@pytest.mark.parametrize(
    "name", ["Dockerfile", ".dockerignore", "scripts/install.sh", "scripts/install_sandbox.sh", "constraints.txt"]
)
def test_init_template_carries_the_same_files(name):
    """`grpoflow init` writes the same image files (a project's image installs grpoflow==GRPOFLOW_VERSION): the
    template links the repository's."""
    assert (TEMPLATE / name).read_bytes() == (PROJECT_DIR / name).read_bytes(), name


# --- the build and push steps --------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["checkout", "init"])
def test_build_and_push_steps(which, monkeypatch, tmp_path):
    prefect_file = prefect_file_of(which, tmp_path)
    config = yaml.safe_load(prefect_file.read_text())
    assert not config.get("build") and not config.get("push")  # one-machine deployments build nothing
    assert set(image_deployments(prefect_file)) == K8S
    for deployment in config["deployments"]:
        if deployment["name"] not in K8S:
            assert "build" not in deployment and "push" not in deployment
            continue
        [build], [push] = deployment["build"], deployment["push"]
        assert build[BUILD]["id"] == "build-image" and build[BUILD]["requires"].startswith("prefect-docker")
        assert (PROJECT_DIR / build[BUILD]["dockerfile"]).is_file()
        assert push[PUSH] == {
            "requires": build[BUILD]["requires"],
            "image_name": "{{ build-image.image_name }}",
            "tag": "{{ build-image.tag }}",
        }
        assert deployment["work_pool"]["name"] == "grpo-k8s"

        # `prefect deploy`: environment placeholders first, then the build step's outputs.
        monkeypatch.setenv("GRPOFLOW_IMAGE", "registry.example.com/ml/grpoflow")
        resolved = apply_values(deployment, os.environ, remove_notset=False)
        assert resolved["build"][0][BUILD]["image_name"] == "registry.example.com/ml/grpoflow"
        outputs = {"build-image": {"image": "registry.example.com/ml/grpoflow:t1", "image_name": "r", "tag": "t1"}}
        resolved = apply_values(resolved, outputs, skip_prefixes=["ctx."])
        assert resolved["push"][0][PUSH] | {"requires": None} == {"requires": None, "image_name": "r", "tag": "t1"}
        assert resolved["work_pool"]["job_variables"]["image"] == "registry.example.com/ml/grpoflow:t1"
