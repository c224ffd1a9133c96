"""Fixtures and helpers for the publishing tests (tests/trainers/test_publish.py, tests/tasks/test_publish.py): the
loopback Hub, an HF_HOME with no stored token, a finished job folder. Loaded for every test by tests/conftest.py."""

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import load_spec, to_yaml
from grpoflow.trainers.model.tiny import build_tiny
from tests.hub_server import HubServer

TOKEN = "hf_TestTokenThatMustNeverLeak0123456789"
READ_ONLY = "hf_ReadOnlyTokenThatMustNeverLeak98765"
WRONG = "hf_WrongTokenThatMustNeverLeak55555555"
REPO = "grpo-org/arith-tiny"
METRICS = [
    {"step": 1, "values": {"reward": 0.25, "reward_std": 0.4, "loss": 0.01, "entropy": 2.1, "kl": 0.0}},
    {"step": 2, "values": {"reward": 0.75, "reward_std": 0.3, "loss": 0.02, "entropy": 1.9, "kl": 0.004}},
    {"step": 3, "values": {"reward": 0.5, "reward_std": 0.2, "loss": 0.03, "entropy": 1.7, "kl": 0.008}},
]


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """An empty HF_HOME: `hf auth login` has stored no token, whatever the machine's own ~/.cache/huggingface holds."""
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    # Read once, at import, from HF_HOME: set what huggingface_hub derived from it.
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    for name in ("HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(params=["xet-pipeline", "single-commit"])
def hub(request, monkeypatch):
    """The fake Hub, with HF_ENDPOINT and HF_TOKEN pointing at it; run once per upload_folder code path."""
    with HubServer(accepted_token=TOKEN, read_only_token=READ_ONLY) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        # With hf_xet installed (as in production), upload_folder takes its streamed pipeline; without, create_commit.
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", request.param == "single-commit")
        monkeypatch.setattr("grpoflow.jobs.publish.RETRY_DELAYS_S", (0.05, 0.05))
        yield server


GGUF_REPO = "grpo-org/tiny-GGUF"
GGUF_URI = f"hf://{GGUF_REPO}/tiny.Q8_0.gguf"


@pytest.fixture
def gguf_hub(tmp_path, hf_home, monkeypatch):
    """The fake Hub holding a tiny GGUF model (tests/gguf_files.py) at `GGUF_URI`, reached as a Hub file is: its
    endpoint in huggingface_hub's constants (and HF_ENDPOINT, for child processes), HF_TOKEN, online, and an empty Hub
    cache in `hf_home`."""
    from tests.gguf_files import write_gguf

    with HubServer(accepted_token=TOKEN) as server:
        content = write_gguf(tmp_path / "tiny.Q8_0.gguf").read_bytes()
        server._commit(server._create(GGUF_REPO, private=False), "add the GGUF", "", {"tiny.Q8_0.gguf": content}, [])
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        # Read once, at import, from HF_ENDPOINT: set what huggingface_hub derived from it.
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield server


def make_job(root: Path, base_model: str = "builtin:tiny", dataset_uri: str = "data/arith.jsonl") -> JobDir:
    """A finished job folder: merged weights (the tiny model), a LoRA adapter, spec, metrics and evaluation."""
    import torch
    from safetensors.torch import save_file

    job = JobDir(root / "arith-20250101-000000")
    job.root.mkdir(parents=True)
    shutil.copytree(build_tiny(), job.merged)
    job.adapter.mkdir()
    adapter_config = {"peft_type": "LORA", "r": 4, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}
    (job.adapter / "adapter_config.json").write_text(json.dumps(adapter_config))
    save_file({"base_model.model.lora_A.weight": torch.ones(4, 8)}, job.adapter / "adapter_model.safetensors")
    (job.adapter / "README.md").write_text("PEFT's own placeholder card\n")
    spec, _ = load_spec(
        {
            "name": "arith",
            "base_model": base_model,
            "dataset": {"uri": dataset_uri},
            "rewards": [{"name": "exact_answer"}],
            "hyperparameters": {"max_steps": 3, "learning_rate": 1e-5},
        }
    )
    job.spec.write_text(to_yaml(spec))
    job.metrics.write_text("".join(json.dumps(r) + "\n" for r in METRICS))
    job.evaluation.write_text(json.dumps({"metric": "exact_answer", "n": 8, "before": 0.25, "after": 0.625}))
    return job


@pytest.fixture
def published_job(tmp_path) -> JobDir:
    """A finished job folder to publish (see `make_job`)."""
    return make_job(tmp_path)


def assert_no_token_in(root: Path, *texts: str) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    for text in texts:
        for token in (TOKEN, READ_ONLY, WRONG):
            assert token not in text
