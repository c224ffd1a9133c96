"""Tests for jobs/publish.py: the real huggingface_hub client against a Hub-compatible server on loopback.

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
import yaml
from huggingface_hub import HfApi, constants

import grpoflow.jobs.publish as publish_module
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import PublishSpec, load_spec
from grpoflow.jobs.publish import NO_TOKEN, PublishError, is_user_error, model_card, publish
from grpoflow.trainers.model.merge import write_model_json
from tests.hub_server import HubServer
from tests.publishing import READ_ONLY, REPO, TOKEN, WRONG, assert_no_token_in, make_job

pytestmark = pytest.mark.usefixtures("hf_home")


@pytest.fixture
def job(published_job) -> JobDir:
    return published_job


def folder_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def front_matter(readme: bytes) -> dict:
    return yaml.safe_load(readme.decode().split("---\n")[1])


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
    assert "| `exact_answer` | 8 | 0.25 | 0.625 | +37.5 points |" in body


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


def test_a_warm_started_jobs_card_names_the_job_it_started_from(tmp_path):
    first = make_job(tmp_path / "first")
    write_model_json(first)
    second = make_job(tmp_path / "second", base_model=str(first.merged))

    card = model_card(second, load_spec(second.spec)[0], "merged")

    assert f"- **Started from:** job `{first.job_id}` (its merged model" in card.text
    assert "Started from" not in model_card(first, load_spec(first.spec)[0], "merged").text


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
