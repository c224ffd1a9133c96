"""Tests for tasks/publish.py: the real huggingface_hub client against a Hub-compatible server on loopback.

Nothing in huggingface_hub is patched; only its import-time settings are (HF_HUB_OFFLINE, which conftest sets for
the offline tests, HF_HUB_DISABLE_XET, to run both of upload_folder's code paths, and the token file's path, derived
from HF_HOME at import, so that no test sees the token of whoever runs the tests).
"""

import hashlib
import json
import logging
import re
import shutil
import traceback
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import HfApi, constants
from safetensors.torch import save_file

import tasks.publish as publish_module
from tasks.publish import NO_TOKEN, PublishError, is_user_error, model_card, publish, publish_task
from tests.hub_server import HubServer
from trainers.jobdir import JobDir
from trainers.spec import PublishSpec, load_spec, to_yaml
from trainers.tiny import build_tiny

TOKEN = "hf_TestTokenThatMustNeverLeak0123456789"
READ_ONLY = "hf_ReadOnlyTokenThatMustNeverLeak98765"
WRONG = "hf_WrongTokenThatMustNeverLeak55555555"
REPO = "grpo-org/arith-tiny"
METRICS = [
    {"step": 1, "values": {"reward": 0.25, "reward_std": 0.4, "loss": 0.01, "entropy": 2.1, "kl": 0.0}},
    {"step": 2, "values": {"reward": 0.75, "reward_std": 0.3, "loss": 0.02, "entropy": 1.9, "kl": 0.004}},
    {"step": 3, "values": {"reward": 0.5, "reward_std": 0.2, "loss": 0.03, "entropy": 1.7, "kl": 0.008}},
]


@pytest.fixture(autouse=True)
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
        monkeypatch.setattr(publish_module, "RETRY_DELAYS_S", (0.05, 0.05))
        yield server


def make_job(root: Path, base_model: str = "builtin:tiny", dataset_uri: str = "data/arith.jsonl") -> JobDir:
    """A finished job folder: merged weights (the tiny model), a LoRA adapter, spec, metrics and evaluation."""
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
def job(tmp_path) -> JobDir:
    return make_job(tmp_path)


def folder_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def front_matter(readme: bytes) -> dict:
    return yaml.safe_load(readme.decode().split("---\n")[1])


def assert_no_token_in(root: Path, *texts: str) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    for text in texts:
        for token in (TOKEN, READ_ONLY, WRONG):
            assert token not in text


# --- publishing ------------------------------------------------------------------------------------------------


def test_publish_merged_makes_one_commit_in_a_private_repo(hub, job):
    before = folder_digest(job.root)

    result = publish(job, PublishSpec(repo_id=REPO))

    repo = hub.repos[REPO]
    assert repo.private
    # The Hub's initial .gitattributes commit, then exactly one commit of ours.
    assert len(repo.commits) == 2 and hub.hits("POST", r"/commit/") == 1
    commit = repo.head
    assert result == {
        "repo_id": REPO,
        "url": f"{hub.url}/{REPO}",
        "commit": commit.oid,
        "revision": commit.oid,
        "changed": True,
        "artifact": "merged",
    }
    merged_files = sorted(p.name for p in job.merged.iterdir())
    assert commit.added == sorted(["README.md", *merged_files])
    for name in merged_files:
        assert commit.files[name] == (job.merged / name).read_bytes(), name
    # What a user sees through the client: the commit history and the file list.
    api = HfApi(endpoint=hub.url, token=TOKEN)
    assert [c.commit_id for c in api.list_repo_commits(REPO)] == [commit.oid, repo.commits[0].oid]
    assert sorted(api.list_repo_files(REPO)) == sorted([".gitattributes", "README.md", *merged_files])
    # The artifact and everything else in the job folder are untouched.
    assert folder_digest(job.root) == before


def test_merged_card_metadata_and_body(hub, job):
    publish(job, PublishSpec(repo_id=REPO))

    readme = hub.repos[REPO].files["README.md"]
    meta = front_matter(readme)
    # builtin:tiny is not a Hub repo, so there is no base_model to link; a local dataset has no Hub id.
    assert "base_model" not in meta and "datasets" not in meta
    assert meta["library_name"] == "transformers"
    assert meta["tags"] == ["grpo", "trl", "grpoflow"]
    body = readme.decode()
    assert "| learning_rate | 1e-05 |" in body and "| max_steps | 3 |" in body
    # Final is step 3; the best reward (0.75) was at step 2, shown with the other metrics at that step.
    assert "| metric | final (step 3) | best reward (step 2) |" in body
    assert "| `reward` | 0.5 | 0.75 |" in body and "| `kl` | 0.008 | 0.004 |" in body
    assert "| `exact_answer` | 8 | 0.25 | 0.625 | 0.375 |" in body


def test_publish_adapter(hub, tmp_path):
    job = make_job(tmp_path, base_model="Qwen/Qwen2.5-0.5B-Instruct", dataset_uri="hf://datasets/openai/gsm8k/train")

    result = publish(job, PublishSpec(repo_id=REPO, artifact="adapter", private=False))

    repo = hub.repos[REPO]
    assert result["artifact"] == "adapter" and result["changed"] and not repo.private
    assert repo.head.added == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert repo.files["adapter_model.safetensors"] == (job.adapter / "adapter_model.safetensors").read_bytes()
    meta = front_matter(repo.files["README.md"])
    assert meta["library_name"] == "peft"
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert meta["datasets"] == ["openai/gsm8k"]
    # PEFT's own placeholder card is replaced on the Hub, and left alone in the job folder.
    assert b"placeholder" not in repo.files["README.md"]
    assert (job.adapter / "README.md").read_text() == "PEFT's own placeholder card\n"


def test_republishing_unchanged_makes_no_commit(hub, job):
    first = publish(job, PublishSpec(repo_id=REPO))
    commits = len(hub.repos[REPO].commits)

    again = publish(job, PublishSpec(repo_id=REPO))

    assert len(hub.repos[REPO].commits) == commits
    assert hub.hits("POST", r"/commit/") == 1
    assert again["changed"] is False and again["commit"] is None
    assert again["revision"] == first["commit"]


def test_changed_artifact_makes_a_new_commit_with_only_the_difference(hub, job):
    publish(job, PublishSpec(repo_id=REPO))
    (job.merged / "generation_config.json").write_text(json.dumps({"max_new_tokens": 7}))
    (job.merged / "chat_template.jinja").unlink()

    result = publish(job, PublishSpec(repo_id=REPO))

    head = hub.repos[REPO].head
    assert result["changed"] and result["commit"] == head.oid and len(hub.repos[REPO].commits) == 3
    assert head.added == ["generation_config.json"]
    # The repo mirrors the artifact: a file gone from it is deleted, .gitattributes stays.
    assert head.deleted == ["chat_template.jinja"]
    assert "chat_template.jinja" not in head.files and ".gitattributes" in head.files


def test_model_card_needs_no_metrics_or_evaluation(tmp_path):
    job = make_job(tmp_path)
    job.metrics.unlink()
    job.evaluation.unlink()
    spec, _ = load_spec(job.spec)

    card = model_card(job, spec, "merged")

    assert "No training steps were logged." in card.text
    assert "Held-out evaluation" not in card.text
    assert card.data.library_name == "transformers" and "base_model" not in card.data.to_dict()


# --- mistakes and failures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("repo_id", "artifact", "token", "message"),
    [
        (REPO, "merged", None, re.escape(NO_TOKEN)),  # no HF_TOKEN, no token file, no argument, no Secret block
        ("just-a-name", "merged", TOKEN, "invalid repo id 'just-a-name'"),  # the owner is required
        ("a--b/model", "merged", TOKEN, "invalid repo id 'a--b/model'"),  # the Hub forbids "--"
        ("org/model/extra", "merged", TOKEN, "invalid repo id"),  # a path, not a repo id
        (REPO, "adapter", TOKEN, "publish the merged weights with --artifact merged"),  # a full fine-tune
    ],
)
def test_user_errors_fail_before_any_request(hub, tmp_path, monkeypatch, repo_id, artifact, token, message):
    job = make_job(tmp_path)
    if artifact == "adapter":
        shutil.rmtree(job.adapter)
    monkeypatch.delenv("HF_TOKEN")
    # A session-wide Prefect server from other tests must not lend this test a token block.
    monkeypatch.setattr(publish_module, "TOKEN_SECRET_BLOCK", "hf-token-absent-in-tests")
    target = PublishSpec.model_construct(repo_id=repo_id, artifact=artifact, private=True)

    with pytest.raises(PublishError, match=message) as caught:
        publish(job, target, token=token)

    assert is_user_error(caught.value)
    assert hub.requests == []


@pytest.mark.parametrize(
    ("token", "status"),
    [
        (WRONG, "401"),  # an unknown or revoked token
        (READ_ONLY, "403"),  # a valid token without write access
    ],
)
def test_rejected_token_fails_at_once_without_leaking_it(hub, job, caplog, token, status):
    caplog.set_level(logging.DEBUG)

    with pytest.raises(PublishError) as caught:
        publish(job, PublishSpec(repo_id=REPO), token=token)

    assert is_user_error(caught.value)
    assert status in str(caught.value)
    # Not in the message, nor anywhere in the traceback a user would see.
    assert token not in "".join(traceback.format_exception(caught.value))
    # One attempt only: a rejected token is never retried, and nothing reached the commit endpoint.
    assert hub.hits("POST", r"/api/repos/create") == 1
    assert hub.hits("POST", r"/commit/") == 0 and REPO not in hub.repos
    assert_no_token_in(job.root, caplog.text)


def test_transient_503s_are_retried(hub, job):
    hub.fail_next(2)

    result = publish(job, PublishSpec(repo_id=REPO))

    # Each attempt starts with create_repo; the third one, after two 503s, goes through.
    assert [status for _, _, status in hub.requests[:3]] == [503, 503, 200]
    assert [status for _, _, status in hub.requests].count(503) == 2
    assert hub.hits("POST", r"/api/repos/create") == 3
    assert result["changed"] and len(hub.repos[REPO].commits) == 2


def test_persistent_5xx_gives_up_after_three_attempts(hub, job):
    hub.fail_always(status=502)

    with pytest.raises(PublishError, match="502") as caught:
        publish(job, PublishSpec(repo_id=REPO))

    # Not the user's fault: the CLI exits 1.
    assert not is_user_error(caught.value)
    assert hub.requests == [("POST", "/api/repos/create", 502)] * 3


def test_unreachable_hub_is_a_transient_failure(job, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(publish_module, "RETRY_DELAYS_S", (0.01, 0.01))
    # A port nothing listens on: bound, then closed.
    server = HubServer(accepted_token=TOKEN)
    url = server.url
    server.stop()
    monkeypatch.setenv("HF_ENDPOINT", url)

    with pytest.raises(PublishError) as caught:
        publish(job, PublishSpec(repo_id=REPO), token=TOKEN)

    assert not is_user_error(caught.value) and "ConnectError" in str(caught.value)


@pytest.mark.parametrize(
    ("env", "stored", "accepted"),
    [
        (None, TOKEN, True),  # no HF_TOKEN: the token `hf auth login` stored under HF_HOME
        (TOKEN, WRONG, True),  # HF_TOKEN comes first...
        (WRONG, TOKEN, False),  # ...even a wrong one (401), as for huggingface_hub itself
    ],
    ids=["token-file", "env-first", "env-wrong"],
)
def test_token_as_huggingface_hub_finds_it(hub, job, hf_home, monkeypatch, caplog, capsys, env, stored, accepted):
    caplog.set_level(logging.DEBUG)
    (hf_home / "token").write_text(stored + "\n")  # as `hf auth login` writes it
    if env is None:
        monkeypatch.delenv("HF_TOKEN")
    else:
        monkeypatch.setenv("HF_TOKEN", env)
    monkeypatch.setattr(publish_module, "TOKEN_SECRET_BLOCK", "hf-token-absent-in-tests")

    if accepted:
        result = publish(job, PublishSpec(repo_id=REPO))
        assert result["changed"] and hub.repos[REPO].head.oid == result["commit"]
    else:
        with pytest.raises(PublishError, match="401"):
            publish(job, PublishSpec(repo_id=REPO))

    out, err = capsys.readouterr()
    assert_no_token_in(job.root, caplog.text, out, err)


def test_token_never_reaches_files_or_logs(hub, job, caplog, capsys):
    caplog.set_level(logging.DEBUG)

    publish(job, PublishSpec(repo_id=REPO))
    publish(job, PublishSpec(repo_id=REPO))
    with pytest.raises(PublishError):
        publish(job, PublishSpec(repo_id=REPO), token=WRONG)

    out, err = capsys.readouterr()
    assert_no_token_in(job.root, caplog.text, out, err)
    assert all(TOKEN.encode() not in content for content in hub.repos[REPO].files.values())


# --- the Prefect task ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_publish_task_uses_the_secret_block_and_emits_the_event(hub, job, monkeypatch, capsys, caplog):
    from prefect.blocks.system import Secret

    monkeypatch.delenv("HF_TOKEN")
    spec = load_spec(job.spec, [f"publish.repo_id={REPO}"])[0]
    Secret(value=TOKEN).save("hf-token", overwrite=True)
    try:
        result = publish_task(job, spec)
    finally:
        Secret.delete("hf-token")

    assert result["changed"] and hub.repos[REPO].head.oid == result["commit"]
    published = json.loads((job.root / "published.json").read_text())
    assert {k: published[k] for k in result} == result
    events = [json.loads(line) for line in job.events.read_text().splitlines()]
    assert [e["event"] for e in events] == ["grpoflow.model.published"]
    assert events[0]["payload"] == result
    out, err = capsys.readouterr()
    assert_no_token_in(job.root, caplog.text, out, err)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_publish_task_does_not_retry_a_rejected_token(hub, job, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", WRONG)
    spec = load_spec(job.spec, [f"publish.repo_id={REPO}"])[0]

    with pytest.raises(PublishError, match="401"):
        publish_task(job, spec)

    # One attempt: a rejected token is not retried (and the task has no Prefect retries on top).
    assert hub.hits("POST", r"/api/repos/create") == 1
    assert not (job.root / "published.json").exists() and not job.events.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_cli_publish_exit_codes(hub, job, monkeypatch):
    from tests.conftest import cli

    root, job_id = job.root.parent, job.job_id
    code, out, err = cli("--output-uri", root, "publish", job_id, "--repo-id", REPO, "--json")
    assert code == 0, err
    assert json.loads(out)["repo_id"] == REPO and (job.root / "published.json").exists()
    code, _, err = cli("--output-uri", root, "publish", job_id, "--repo-id", "not a repo")
    assert code == 2 and "--repo-id" in err
    code, _, _ = cli("--output-uri", root, "publish", "no-such-job", "--repo-id", REPO)
    assert code == 1
    monkeypatch.delenv("HF_TOKEN")
    code, _, err = cli("--output-uri", root, "publish", job_id, "--repo-id", REPO)
    assert code == 2 and "HF_TOKEN" in err and TOKEN not in err


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
@pytest.mark.parametrize(
    ("outage", "failed", "published"),
    [
        (2, 2, True),  # two 503s, then the Hub is back: the third attempt publishes
        (None, 3, False),  # the Hub stays down: three attempts in all, not three per Prefect retry
    ],
    ids=["transient", "permanent"],
)
def test_publish_task_attempts_for_a_503(hub, job, outage, failed, published):
    spec = load_spec(job.spec, [f"publish.repo_id={REPO}"])[0]
    hub.fail_always() if outage is None else hub.fail_next(outage)

    try:
        publish_task(job, spec)
    except PublishError as exc:
        assert not published and "503" in str(exc)

    # One retry layer: 3 attempts, each starting with create_repo (a failed one ends there). With Prefect's task
    # retries on top of publish's own, a Hub that stays down used to get 9.
    assert [status for _, _, status in hub.requests].count(503) == failed
    assert hub.hits("POST", r"/api/repos/create") == 3
    assert (REPO in hub.repos and len(hub.repos[REPO].commits) == 2) is published
    if not published:
        assert hub.requests == [("POST", "/api/repos/create", 503)] * 3
