"""Shared fixtures: a small arithmetic dataset, spec files, and a real Prefect server for pipeline tests."""

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

# Keep CPU runs quiet and reproducible across machines with different core counts.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
# Prefect state of the test session (its SQLite database above all) lives apart from the user's ~/.prefect, so a
# `grpoflow run` going on beside the tests never locks it. Set before anything imports prefect.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="grpoflow-tests-prefect-")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
# The migrated Prefect database the tests' new Prefect homes start from (tests/prefect_home.py): set in the controller,
# before the xdist workers start, so they share one.
if "TESTS_MIGRATED_PREFECT_DB" not in os.environ:  # the workers inherit the controller's
    os.environ["TESTS_MIGRATED_PREFECT_DB"] = os.path.join(tempfile.mkdtemp(prefix="grpoflow-tests-db-"), "prefect.db")
# The tests' jobs are indexed apart from the user's (`grpoflow.core.jobdir`).
os.environ["GRPOFLOW_JOB_INDEX"] = tempfile.mkdtemp(prefix="grpoflow-tests-job-index-")
# The flows the tests call, and the test stacks' workers, run specs as a deployment's, under this policy: any path,
# model and trl: key, the tests' loopback receivers as webhooks (tests/core/test_policy.py tests the defaults).
os.environ["GRPOFLOW_POLICY"] = os.path.join(tempfile.mkdtemp(prefix="grpoflow-tests-policy-"), "policy.yaml")
with open(os.environ["GRPOFLOW_POLICY"], "w") as _policy:
    _trl = json.loads((Path(__file__).parents[1] / "core" / "spec" / "trl_fields.json").read_text())["fields"]
    _from = {
        "paths": ["/", "s3://", "gs://", "gcs://", "az://", "abfs://", "hf://"],
        "models": ["*"],
        "trl_keys": sorted(_trl),
        "webhooks": ["127.0.0.1", "localhost"],
    }
    _from["secret_env"] = ["GRPOFLOW_WEBHOOK_SECRET", "GRPOFLOW_TEST_WEBHOOK_SECRET", "GRPOFLOW_TEST_SECRET"]
    yaml.safe_dump({"from_deployments": _from}, _policy)
# A retried stage retries at once: what a test checks is that it retries, never how long it waited (grpoflow.tasks).
os.environ["GRPOFLOW_RETRY_DELAY_S"] = "0"


# The publishing fixtures (the loopback Hub, an empty HF_HOME, a finished job folder), for tests in any folder.
pytest_plugins = ["tests.publishing"]


def pytest_configure(config):
    # absl's logging (rouge_score's, imported by the rouge text_similarity graders) writes to the stderr of the moment
    # it is imported: under a test's capture, pytest's capture file. Its handler closes a stream that is not
    # sys.stderr when a later logging.config.dictConfig (Prefect's, in a `grpoflow run` of the `cli` helper, which
    # redirects sys.stderr) shuts every handler down: pytest's capture file then, and each test after fails with
    # "I/O operation on closed file". Pointed at the real stderr, which it never closes.
    import sys

    with contextlib.suppress(ModuleNotFoundError):  # absent: nothing holds such a stream
        import absl.logging

        absl.logging.get_absl_handler().python_handler.setStream(sys.__stderr__)


def pytest_collection_modifyitems(config, items):
    from grpoflow.trainers.child import visible_gpus

    if visible_gpus():  # found without importing torch, so collecting a module that needs none stays fast
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def standin_env() -> dict:
    """The environment that makes the processes started with it run the stand-in (tests/standin_child.py) in place
    of the training children, from any working directory."""
    from grpoflow.jobs.launch import STANDIN_ENV

    root = str(Path(__file__).resolve().parent.parent)
    return {
        STANDIN_ENV: "tests.standin_child",
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }


@pytest.fixture
def standin(monkeypatch):
    """The training children replaced by the stand-in (tests/standin_child.py) for this test, in this process and
    every process it starts; returns `ask(**request)`, which sets what the stand-in is to do (its docstring)."""
    from tests.standin_child import REQUEST_ENV

    for name, value in standin_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(REQUEST_ENV, raising=False)

    def ask(**request):
        monkeypatch.setenv(REQUEST_ENV, json.dumps(request))

    return ask


@pytest.fixture(scope="session")
def prefect_server():
    """A real, temporary Prefect server (SQLite) for the whole session; flows and events go to it."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def cli(*argv) -> tuple[int, str, str]:
    """`grpoflow ARGV...` in this process: (exit code, stdout, stderr).

    Redirects sys.stdout/sys.stderr rather than using capsys: Prefect's log handler keeps the first stderr it sees.
    """
    from grpoflow.flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def arithmetic_rows(n: int, start: int = 0) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        a, b = i % 10, (i * 7) % 10
        rows.append({"prompt": f"What is {a}+{b}?", "answer": str(a + b), "completion": str(a + b)})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def dataset_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "arith.jsonl", arithmetic_rows(24))


@pytest.fixture
def make_spec(tmp_path, dataset_file):
    """Writes a small, fast job spec (3 GRPO steps on builtin:tiny) with `changes` merged in; returns its path."""

    def make(name: str = "t", **changes) -> Path:
        spec = {
            "name": name,
            "base_model": "builtin:tiny",
            "dataset": {"uri": str(dataset_file)},
            "rewards": [{"name": "exact_answer"}, {"name": "length_penalty", "kwargs": {"max_chars": 4}}],
            "hyperparameters": {
                "max_steps": 3,
                "rollouts_per_prompt": 4,
                "max_response_length": 6,
                "learning_rate": 1e-3,
            },
            "evaluation": {"holdout": 4},
            "output_uri": str(tmp_path / "runs"),
        }
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return make


TRAINED_KINDS = {"lora": {"lora_rank": 4}, "full": {"lora_rank": None}}


def build_trained_jobs(root: Path) -> dict[str, Path]:
    """Runs the real pipeline (the real training children, even where a test set the stand-in) for a LoRA job and a
    full fine-tune under `root`."""
    from grpoflow.jobs.launch import STANDIN_ENV

    data = write_jsonl(root / "arith.jsonl", arithmetic_rows(24))
    standin, jobs = os.environ.pop(STANDIN_ENV, None), {}
    try:
        for kind, hp in TRAINED_KINDS.items():
            spec = {
                "name": f"trained-{kind}",
                "base_model": "builtin:tiny",
                "dataset": {"uri": str(data)},
                "rewards": [{"name": "exact_answer"}, {"name": "length_penalty", "kwargs": {"max_chars": 4}}],
                "hyperparameters": {"max_steps": 3, "rollouts_per_prompt": 4, "max_response_length": 6, **hp},
                "evaluation": {"holdout": 4},
                "output_uri": str(root / "runs"),
            }
            path = root / f"{kind}.yaml"
            path.write_text(yaml.safe_dump(spec))
            code, out, err = cli("run", path, "--json")
            assert code == 0, err[-3000:]
            jobs[kind] = Path(json.loads(out)["output_dir"])
    finally:
        if standin is not None:
            os.environ[STANDIN_ENV] = standin
    return jobs


@pytest.fixture(scope="session")
def trained_jobs(tmp_path_factory, prefect_server) -> dict[str, Path]:
    """A finished LoRA job and a finished full fine-tune ("lora", "full"), made by the real pipeline once per test
    run, shared by the xdist workers (the first to ask builds them under a lock): the starting point of the tests
    that read, publish, deploy, serve or resume a finished job. Copy one with `trained_job`; never change these."""
    from filelock import FileLock

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    root, done = shared / "trained-jobs", shared / "trained-jobs.json"
    with FileLock(str(shared / "trained-jobs.lock")):
        if not done.exists():
            root.mkdir(exist_ok=True)
            jobs = build_trained_jobs(root)
            done.write_text(json.dumps({kind: str(path) for kind, path in jobs.items()}))
    return {kind: Path(path) for kind, path in json.loads(done.read_text()).items()}


@pytest.fixture
def trained_job(trained_jobs, tmp_path):
    """`trained_job(kind="lora")`: a copy of a finished job of `trained_jobs` in this test's `tmp_path/runs/`, as
    `JobDir`; its spec.yaml is the job's own (its output_uri the original's: pass `--output-uri` to commands)."""
    from grpoflow.core.jobdir import JobDir

    def copy(kind: str = "lora") -> "JobDir":
        source = trained_jobs[kind]
        target = tmp_path / "runs" / source.name
        shutil.copytree(source, target)
        return JobDir(target)

    return copy


@pytest.fixture
def make_job(tmp_path, make_spec):
    """A job folder as create-job and ingest leave it (the resolved spec.yaml and dataset/) for `make_spec`'s spec
    with `changes`; returns (JobDir, JobSpec)."""
    from grpoflow.core.jobdir import JobDir
    from grpoflow.core.spec import load_spec, to_yaml
    from grpoflow.trainers.dataset import ingest_dataset

    def make(name: str = "j", **changes):
        spec, _ = load_spec(make_spec(name, **changes))
        job = JobDir(tmp_path / "runs" / f"{name}-20261130-000000-abcdef")
        job.root.mkdir(parents=True)
        job.spec.write_text(to_yaml(spec))
        ingest_dataset(
            spec.dataset.uri,
            job.dataset,
            prompt_column=spec.dataset.prompt_column,
            holdout=spec.evaluation.holdout,
            seed=spec.hyperparameters.seed,
        )
        return job, spec

    return make
