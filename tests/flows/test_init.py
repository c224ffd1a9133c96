"""`grpoflow init` and a grpoflow installed as a user installs it: not editable, into a fresh venv, run from elsewhere.

The fast tests write a project here and check its files. The slow one builds a wheel of this checkout and installs
it into a new venv (`python -m venv --without-pip`; the dependencies come from this venv's site-packages through a
.pth file, so nothing is downloaded), proves `flows` and `examples` resolve into that venv, then from a folder
outside the checkout: `grpoflow demo`; `grpoflow init proj`; in proj `grpoflow validate spec.yaml`, `grpoflow
deployments apply` against a real loopback server, a worker, a run started the way the UI starts it, and the job
folder lands in proj/runs. Every process it starts is stopped.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from grpoflow.core.spec import load_spec
from grpoflow.flows import project
from grpoflow.flows.deployments import PROJECT_DIR
from grpoflow.flows.project import CHECKOUT_PREFECT_FILE, init_project
from tests.conftest import cli
from tests.flows.test_deployments import free_port, stop, wait_healthy

# --- init, without a server ----------------------------------------------------------------------------------------


def test_init_writes_a_working_project(tmp_path):
    proj = tmp_path / "proj"
    code, out, err = cli("init", proj)
    assert code == 0, err
    for name in ("prefect.yaml", "spec.yaml", "rewards.py", "README.md", "data/arithmetic.jsonl",
                 "work-pools/pools.yaml", "work-pools/kubernetes-gpu.json"):  # fmt: skip
        assert (proj / name).is_file(), name
    assert (proj / "data" / "incoming").is_dir()
    assert (proj / "data" / "arithmetic.jsonl").read_bytes() == (
        PROJECT_DIR / "examples" / "data" / "arithmetic.jsonl"
    ).read_bytes()
    readme = (proj / "README.md").read_text()
    assert f"cd {proj.resolve()}" in readme and "grpoflow validate spec.yaml" in readme and "{project" not in readme

    config = yaml.safe_load((proj / "prefect.yaml").read_text())
    assert config["name"] == "proj"
    assert config["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $PWD }}"}}]
    deployments = {d["name"]: d for d in config["deployments"]}
    assert deployments["nightly"]["parameters"] == {"spec": "spec.yaml"}
    assert deployments["on-new-data"]["parameters"] == {"default_spec": "spec.yaml"}
    assert deployments["watch"]["parameters"]["uri"] == "data/incoming"
    # The retrain form's default is the project's spec, as written.
    assert deployments["retrain"]["parameters"]["spec"] == {
        k: v for k, v in yaml.safe_load((proj / "spec.yaml").read_text()).items()
    }


def test_init_project_spec_validates_with_its_reward(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    init_project(proj)
    monkeypatch.chdir(proj)  # a spec's reward module is found from the folder grpoflow runs in
    spec, _ = load_spec(proj / "spec.yaml")
    assert [r.name for r in spec.rewards] == ["exact_answer", "close_answer_reward"]
    code, out, err = cli("validate", "spec.yaml")
    assert code == 0, err


def test_init_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "notes.txt").write_text("mine")
    code, out, err = cli("init", tmp_path / "proj")
    assert code == 2 and "not empty" in err
    assert [p.name for p in (tmp_path / "proj").iterdir()] == ["notes.txt"]  # nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("init", empty)[0] == 0


def test_apply_outside_a_project(tmp_path):
    code, out, err = cli("deployments", "apply", "--project", tmp_path)
    assert code == 2 and "grpoflow init" in err


# --- a project with its own tasks.py, flows/ and trainers/ -----------------------------------------------------------

USER_TASKS = """
\"\"\"The user's own tasks.py (the commonest module name in Prefect projects), with a reward that logs through a
buffered file it never flushes.\"\"\"
from pathlib import Path

LOG = open(Path(__file__).with_name("reward-calls.log"), "a")


def my_reward(completions, trainer_state=None, **kwargs):
    LOG.write("dry-run\\n" if trainer_state is None else "training\\n")
    return [0.0] * len(completions)
"""
# The user's own packages named as grpoflow's layers: importing either is a bug of grpoflow's (or of Prefect's
# entrypoint loading), and fails loudly.
USER_PACKAGE = 'raise ImportError("the user\'s own {name}/ was imported")\n'
USER_REWARD = {"function": "tasks:my_reward", "weight": 0.1}


def add_users_own_modules(proj: Path) -> None:
    """`tasks.py`, `flows/` and `trainers/` of the user's, and the project's spec naming `tasks:my_reward`."""
    (proj / "tasks.py").write_text(USER_TASKS)
    for name in ("flows", "trainers"):
        (proj / name).mkdir()
        (proj / name / "__init__.py").write_text(USER_PACKAGE.format(name=name))
    spec = yaml.safe_load((proj / "spec.yaml").read_text())
    spec["rewards"].append(USER_REWARD)
    (proj / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


LOAD_ENTRYPOINTS = """
import json, sys, yaml
from prefect.flows import load_flow_from_entrypoint
entrypoints = sorted({d["entrypoint"] for d in yaml.safe_load(open("prefect.yaml"))["deployments"]})
print(json.dumps({e: load_flow_from_entrypoint(e).name for e in entrypoints}))
"""


def run_in(proj: Path, *argv) -> subprocess.CompletedProcess:
    """A command in the project folder, as the user (or the worker's pull step) runs it: no path to this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PREFECT_API_URL")}
    return subprocess.run([str(a) for a in argv], cwd=proj, env=env, capture_output=True, text=True, timeout=300)


def test_a_project_with_its_own_tasks_flows_and_trainers_validates_and_loads_every_entrypoint(tmp_path):
    proj = tmp_path / "proj"
    init_project(proj)
    add_users_own_modules(proj)
    bin_dir = Path(sys.executable).parent
    validated = run_in(proj, bin_dir / "grpoflow", "validate", "spec.yaml")
    assert validated.returncode == 0, validated.stderr
    assert "my_reward" in validated.stdout + validated.stderr
    assert set((proj / "reward-calls.log").read_text().split()) == {"dry-run"}  # the user's module, dry-run
    loaded = run_in(proj, sys.executable, "-c", LOAD_ENTRYPOINTS)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    flows = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert set(flows) == {
        "grpoflow.flows.pipeline:grpo_pipeline",
        "grpoflow.flows.triggered:grpo_pipeline_from_file",
        "grpoflow.flows.watch:watch_new_data",
        "grpoflow.flows.sweep:grpo_sweep",
        "grpoflow.flows.resume:resume_crashed",
    }
    assert flows["grpoflow.flows.pipeline:grpo_pipeline"] == "grpo-pipeline"
    assert flows["grpoflow.flows.resume:resume_crashed"] == "grpo-pipeline"  # grpo-pipeline/resume


def test_only_grpoflow_is_a_top_level_name_from_a_users_folder(tmp_path):
    found = run_in(tmp_path, sys.executable, "-c", WHERE)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)[1] == []


# --- a non-editable install into a fresh venv ------------------------------------------------------------------------

# The folders the build backend maps onto `grpoflow.*` (pyproject.toml's package-dir): what a wheel is built from.
PACKAGE_DIRS = tomllib.loads((PROJECT_DIR / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
SOURCES = ("pyproject.toml", "README.md", *sorted(set(PACKAGE_DIRS.values())))


# Run from a folder of the user's: grpoflow's modules come from the install, and no layer is a top-level name.
WHERE = """
import importlib.util, json
import grpoflow.examples, grpoflow.flows
bare = ["core", "flows", "tasks", "trainers", "examples", "integrations", "cluster"]
found = [grpoflow.flows.__file__, grpoflow.examples.__file__]
print(json.dumps([found, [n for n in bare if importlib.util.find_spec(n)]]))
"""


def fresh_venv(tmp: Path) -> Path:
    """A venv with grpoflow installed from a wheel of this checkout; its dependencies are this venv's."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = PROJECT_DIR / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "wheels", src],
                           capture_output=True, text=True, check=True, cwd=tmp, timeout=120)  # fmt: skip
    assert "Warning" not in built.stderr, built.stderr  # a newcomer's install prints no build backend warnings
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())  # fmt: skip
    # A plain path in a .pth: its directory is appended to sys.path, but its own .pth files (this venv's editable
    # grpoflow finder among them) are not run, so grpoflow can only come from the wheel.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    [wheel] = (tmp / "wheels").glob("grpoflow-*.whl")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", wheel], check=True, cwd=tmp, timeout=120)
    # Prefect's console script, on this venv's python: the worker starts its flow runs with `prefect` from PATH.
    script = (Path(sys.executable).parent / "prefect").read_text().split("\n", 1)[1]
    (venv / "bin" / "prefect").write_text(f"#!{python}\n{script}")
    (venv / "bin" / "prefect").chmod(0o755)
    return venv


@pytest.mark.slow
def test_installed_grpoflow_runs_a_project_of_its_own(tmp_path):
    started = time.monotonic()
    venv = fresh_venv(tmp_path)
    bin_dir = venv / "bin"
    home = tmp_path / "home"  # outside the checkout: nothing is found from the working directory
    home.mkdir()
    api_url = f"http://127.0.0.1:{free_port()}/api"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",  # the worker starts `prefect` from PATH
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "VIRTUAL_ENV": str(venv),
    }
    env.pop("PYTHONPATH", None)
    env.pop("GRPOFLOW_POLICY")  # the project's own .grpoflow/policy.yaml, as `grpoflow init` wrote it, applies

    def run(*argv, cwd=home, timeout=300, **extra):
        proc = subprocess.run([str(a) for a in argv], cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        assert proc.returncode == 0, f"{argv}: {proc.stdout}\n{proc.stderr}"
        return proc

    where = run(bin_dir / "python", "-c", WHERE)
    site = str(venv / "lib")
    found, bare = json.loads(where.stdout)
    assert all(path.startswith(site) for path in found), where.stdout
    assert bare == [], where.stdout  # only `grpoflow` is a top-level name
    print(f"fresh venv with a non-editable grpoflow: {time.monotonic() - started:.1f} s")

    run(bin_dir / "grpoflow", "init", "proj")
    proj = home / "proj"
    add_users_own_modules(proj)
    run(bin_dir / "grpoflow", "validate", "spec.yaml", cwd=proj)

    procs = []
    try:
        port = api_url.split(":")[2][:-4]
        with (tmp_path / "server.log").open("wb") as log:
            server = subprocess.Popen([bin_dir / "prefect", "server", "start", "--host", "127.0.0.1", "--port", port],
                                      cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(server)
        wait_healthy(api_url, server)
        # The embedded default, its spec and data found as package data (against this server: a run without one
        # starts a temporary server, tests/test_docs.py's tour and tests/integrations/test_prefect_server.py).
        demo = run(bin_dir / "grpoflow", "demo", "--set", "sft.enabled=false", "--set", "hyperparameters.max_steps=2",
                   "--json", timeout=600, PREFECT_API_URL=api_url)  # fmt: skip
        result = json.loads(demo.stdout.strip().splitlines()[-1])
        assert result["status"] == "completed" and Path(result["output_dir"]).is_relative_to(home / "runs")
        applied = run(bin_dir / "grpoflow", "deployments", "apply", cwd=proj, PREFECT_API_URL=api_url)
        assert "grpo-pipeline/retrain" in applied.stdout

        # The run the UI's "Run" starts: the deployment's default spec, here shortened to two SFT and two GRPO steps.
        start_run = (
            "import json, sys\n"
            "from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as client:\n"
            "    d = client.read_deployment_by_name('grpo-pipeline/retrain')\n"
            "    spec = d.parameters['spec']\n"
            "    spec['hyperparameters']['max_steps'] = 2\n"
            "    spec['sft']['max_steps'] = 2\n"
            "    spec['evaluation']['holdout'] = 4\n"
            f"    spec['rewards'].append({USER_REWARD!r})\n"
            "    run = client.create_flow_run_from_deployment(d.id, parameters={'spec': spec})\n"
            "    print(json.dumps({'id': str(run.id), 'pull': d.pull_steps, 'job_variables': d.job_variables}))\n"
        )
        started_run = json.loads(run(bin_dir / "python", "-c", start_run, PREFECT_API_URL=api_url).stdout)
        assert started_run["pull"] == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(proj.resolve())}}
        ]
        assert started_run["job_variables"] == {"gpu_count": 1}

        with (tmp_path / "worker.log").open("wb") as log:
            worker = subprocess.Popen([bin_dir / "prefect", "worker", "start", "--pool", "grpo-gpu", "--run-once"],
                                      cwd=home, env={**env, "PREFECT_API_URL": api_url}, stdout=log,
                                      stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(worker)
        wait_state = (
            "import sys, time\n"
            "from prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as client:\n"
            "    for _ in range(240):\n"
            "        state = client.read_flow_run(sys.argv[1]).state\n"
            "        if state and state.is_final():\n"
            "            break\n"
            "        time.sleep(2)\n"
            "    print(state.type.value, state.message)\n"
        )
        final = run(bin_dir / "python", "-c", wait_state, started_run["id"], PREFECT_API_URL=api_url, timeout=540)
        assert final.stdout.startswith("COMPLETED"), final.stdout + (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        stop(procs)

    [job] = [p for p in (proj / "runs").iterdir() if (p / "spec.yaml").exists()]
    assert job.name.startswith("arithmetic-")
    assert [json.loads(line)["step"] for line in (job / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert "rewards/close_answer_reward/mean" in (job / "metrics.jsonl").read_text()  # the project's own reward
    # The user's tasks.py reward ran in the training child, and its buffered writes survived the child's end.
    assert "rewards/my_reward/mean" in (job / "metrics.jsonl").read_text()
    assert "training" in (proj / "reward-calls.log").read_text().split()
    print(f"whole test: {time.monotonic() - started:.1f} s")


# --- the project's image and Kubernetes deployments ------------------------------------------------------------------


def test_init_writes_the_image_files(tmp_path, monkeypatch):
    """The project builds the same image as grpoflow's checkout (tests/deployments/test_image.py) and runs on the
    grpo-k8s pool with its own spec (tests/deployments/test_k8s.py renders the checkout's Jobs)."""
    proj = tmp_path / "proj"
    init_project(proj)
    for name in ("Dockerfile", ".dockerignore", "constraints.txt", "scripts/install.sh", "k8s-spec.yaml"):
        assert (proj / name).read_bytes() == (PROJECT_DIR / "flows" / "templates" / "project" / name).read_bytes()
    assert os.access(proj / "scripts" / "install.sh", os.X_OK)
    config = yaml.safe_load((proj / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in config["deployments"]}
    assert deployments["nightly-k8s"]["parameters"] == {"spec": "k8s-spec.yaml"}
    assert deployments["on-new-data-k8s"]["parameters"] == {"default_spec": "k8s-spec.yaml"}
    assert deployments["retrain-k8s"]["parameters"]["spec"]["output_uri"].startswith("s3://")
    monkeypatch.chdir(proj)  # the reward module, as in the image's project folder
    spec, _ = load_spec(proj / "k8s-spec.yaml")
    assert spec.output_uri.startswith("s3://") and (proj / spec.dataset.uri).is_file()
    assert [r.name for r in spec.rewards] == ["exact_answer", "close_answer_reward"]


def test_the_template_keeps_no_copy_of_the_repositorys_own_files():
    """The image files a project gets are the checkout's own, linked: a change to the Dockerfile or the constraints
    is made once, and `grpoflow init` (and the wheel) carry the file the link points to."""
    template = PROJECT_DIR / "flows" / "templates" / "project"
    for name in ("Dockerfile", ".dockerignore", "constraints.txt", "scripts/install.sh", "scripts/install_sandbox.sh"):
        assert (template / name).is_symlink(), name
        assert (template / name).resolve() == (PROJECT_DIR / name).resolve(), name
    # The deployments and the pools too: the project's prefect.yaml is written from the checkout's at init.
    for name in ("prefect.yaml", "work-pools/pools.yaml", "work-pools/kubernetes-gpu.json"):
        assert (template / name).resolve() == (PROJECT_DIR / "deployments" / name).resolve(), name


def test_a_change_to_the_checkouts_deployments_reaches_a_new_project(tmp_path, monkeypatch):
    """A schedule, a trigger or a deployment added to deployments/prefect.yaml is in the next project `init` writes,
    on the project's own files; a path of the checkout's that no project has stops `init` with its name."""
    text = CHECKOUT_PREFECT_FILE.read_text()
    changed = tmp_path / "prefect.yaml"
    changed.write_text(
        text.replace('cron: "0 2 * * *"', 'cron: "30 3 * * *"')
        + "\n  - name: weekly\n    entrypoint: grpoflow.flows.triggered:grpo_pipeline_from_file\n"
        '    parameters:\n      spec: deployments/nightly.yaml\n    schedules:\n      - cron: "0 4 * * 0"\n'
        "    work_pool: *training\n"
    )
    monkeypatch.setattr(project, "CHECKOUT_PREFECT_FILE", changed)
    init_project(tmp_path / "proj")
    config = yaml.safe_load((tmp_path / "proj" / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in config["deployments"]}
    assert deployments["nightly"]["schedules"] == [{"cron": "30 3 * * *", "timezone": "UTC"}]
    assert deployments["weekly"]["parameters"] == {"spec": "spec.yaml"}
    assert deployments["weekly"]["work_pool"] == deployments["nightly"]["work_pool"]
    assert "deployments/" not in (tmp_path / "proj" / "prefect.yaml").read_text()

    changed.write_text(text.replace("spec: deployments/nightly.yaml", "spec: deployments/hourly.yaml"))
    with pytest.raises(ValueError, match="deployments/hourly.yaml"):
        init_project(tmp_path / "other")


def test_the_wheel_carries_the_image_files(tmp_path):
    """`grpoflow init` from a non-editable install finds them too (package data, dotfile included)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = PROJECT_DIR / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "wheels", src],
                   check=True, cwd=tmp_path, timeout=120)  # fmt: skip
    [wheel] = (tmp_path / "wheels").glob("grpoflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("Dockerfile", ".dockerignore", "constraints.txt", "scripts/install.sh", "k8s-spec.yaml"):
        assert f"grpoflow/flows/templates/project/{name}" in names, name
    # The checkout's deployments and pools, which `init` writes a project's prefect.yaml and work-pools/ from.
    for name in ("prefect.yaml", "work-pools/pools.yaml", "work-pools/kubernetes-gpu.json"):
        shipped = zipfile.ZipFile(wheel).read(f"grpoflow/flows/templates/project/{name}")
        assert shipped == (PROJECT_DIR / "deployments" / name).read_bytes(), name
    # One import root: the wheel puts `grpoflow` on sys.path and nothing else (no flows, tasks, trainers, examples).
    assert {name.split("/")[0] for name in names} == {"grpoflow", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "grpoflow/examples/data/arithmetic.jsonl" in names
    # Every module of every mapped folder is in the wheel (a subpackage missing from pyproject.toml's `packages`
    # would install without its modules).
    modules = {
        f"{package.replace('.', '/')}/{path.relative_to(PROJECT_DIR / folder).as_posix()}"
        for package, folder in PACKAGE_DIRS.items()
        for path in (PROJECT_DIR / folder).rglob("*.py")
        if (path.parent / "__init__.py").exists()  # a package's module, not a script beside data
        and ("." in package or path.parent == PROJECT_DIR / folder)  # grpoflow's own folder: its __init__ only
    }
    assert modules - names == set()
