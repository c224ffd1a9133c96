"""Publishing: pushes a job's merged weights or LoRA adapter to the Hugging Face Hub, with a generated model card.

`publish` creates the repository (`exist_ok`, private unless the spec says otherwise), stages the artifact folder
(`merged/` or `adapter/`) and a generated README.md in a temporary folder, and commits it with one
`HfApi.upload_folder` call. The repository mirrors the artifact: files that are no longer in it are deleted in the
same commit (`.gitattributes` is always kept).

Re-publishing an unchanged artifact makes no commit. huggingface_hub does the check itself: its preupload call
returns the Hub's oid of each path, files whose local oid matches are dropped, and when nothing is left it makes no
commit and returns the current head. `publish` compares that head with the one it saw before uploading, so the
result says whether anything changed. The same check makes retries safe: a retry after a lost response commits
nothing twice.

The token comes from the `token` argument, else wherever huggingface_hub finds one (`get_token`: `HF_TOKEN`, then
the token file `hf auth login` stores under `HF_HOME`); `tasks/publish.py` adds the Prefect Secret block `hf-token`
as a last resort. It is only ever handed to `HfApi`: never a task parameter, never written to a file, a log line or
an event. No Prefect here.

Transient failures (connection errors, 5xx, 429) are retried by one layer, `publish` itself, for both ways in: the
CLI's `grpoflow publish` (no Prefect) and the pipeline's `publish_task` (which therefore declares no retries).

    grpoflow publish JOB_ID --repo-id my-org/my-model [--artifact merged|adapter]
"""

import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, ModelCard, ModelCardData, get_token
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from grpoflow.core.jobdir import JobDir, parent_of
from grpoflow.core.scores import change
from grpoflow.core.spec import REPO_ID_PATTERN, JobSpec, PublishSpec, load_spec, resolved_dict
from grpoflow.core.spec.markdown import cell, number, table
from grpoflow.core.uris import is_gguf
from grpoflow.jobs.report import selection_line
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.model.tiny import is_builtin

logger = logging.getLogger(__name__)

TOKEN_SECRET_BLOCK = "hf-token"
NO_TOKEN = (
    f"no Hugging Face token: set HF_TOKEN, log in with `hf auth login`, or create a Prefect Secret block "
    f"'{TOKEN_SECRET_BLOCK}'"
)
CARD_TAGS = ["grpo", "trl", "grpoflow"]
LIBRARY_NAMES = {"merged": "transformers", "adapter": "peft"}
# The model card's loading snippet for each artifact.
USAGE = {
    "merged": 'from transformers import pipeline\n\ngenerator = pipeline("text-generation", model="{repo_id}")',
    "adapter": (
        'from peft import AutoPeftModelForCausalLM\n\nmodel = AutoPeftModelForCausalLM.from_pretrained("{repo_id}")'
    ),
}
CARD_METRICS = ("reward", "reward_std", "loss", "entropy", "completions/mean_length", "kl")
# The card's body, rendered by `ModelCard.from_template` (Jinja2); `card_data` is the YAML front matter it renders
# from the `ModelCardData`. The tables come from `grpoflow.core.spec.markdown`, like the report's.
CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A GRPO fine-tuned {{ what }} of `{{ base }}`, trained with [TRL](https://github.com/huggingface/trl) by grpoflow \
(job `{{ job_id }}`).

- **Dataset:** `{{ dataset }}`
- **Rewards:** {{ rewards }}
- **SFT warm-up:** {{ sft }}
{% if parent %}- **Started from:** job `{{ parent }}` (its merged model: a warm start)
{% endif %}{% if usage %}
## Usage

```python
{{ usage }}
```
{% endif %}
## Hyperparameters

{{ hyperparameters }}

## Training metrics

{{ metrics }}
{% if evaluation %}
## Held-out evaluation

{{ evaluation }}

before: the model GRPO started from; after: the GRPO result; both on prompts held out of training.
{% endif %}"""
# Waits between the attempts of one publish: len + 1 attempts in all. Long enough for a Hub blip (12 s), short
# enough for someone waiting at `grpoflow publish`.
RETRY_DELAYS_S = (2.0, 10.0)


class PublishError(RuntimeError):
    """Publishing failed. `user_error` is True when the user must change something (token, repo id, artifact): the
    CLI exits with code 2, and nothing was retried."""

    def __init__(self, message: str, *, user_error: bool = False):
        super().__init__(message)
        self.user_error = user_error


def is_user_error(exc: BaseException) -> bool:
    """Whether `exc` is a publishing mistake the user must fix (no token, bad repo id, rejected token, ...)."""
    return isinstance(exc, PublishError) and exc.user_error


# --- the model card ------------------------------------------------------------------------------------------------


def _card_base_model(base_model: str) -> str | None:
    # The Hub links `base_model` to a repo: a built-in model, a local folder or a GGUF file has none to link to.
    if is_builtin(base_model) or is_gguf(base_model) or Path(base_model).expanduser().exists():
        return None
    return base_model if re.fullmatch(REPO_ID_PATTERN, base_model) else None


def _card_datasets(uri: str) -> list[str] | None:
    if not uri.lower().startswith("hf://datasets/"):
        return None
    parts = [p for p in uri[len("hf://datasets/") :].split("/") if p]
    return [f"{parts[0]}/{parts[1].split('@')[0]}"] if len(parts) >= 2 else None


def _card_hyperparameters(spec: JobSpec) -> str:
    rows = [[name, cell(v)] for name, v in resolved_dict(spec)["hyperparameters"].items()]
    rows += [[f"trl.{name}", cell(v)] for name, v in spec.trl.items()]  # TRL options (trl.GRPOConfig), as given
    return table(["name", "value"], rows)


def _card_metrics(job: JobDir) -> str:
    records = [r for r in read_metrics(job.metrics) if isinstance(r.get("values"), dict)]
    if not records:
        return "No training steps were logged."
    final = records[-1]
    rewarded = [r for r in records if isinstance(r["values"].get("reward"), int | float)]
    # "Best" is the step with the highest mean reward; the other metrics are shown as they were at that step.
    best = max(rewarded, key=lambda r: r["values"]["reward"]) if rewarded else final
    keys = [k for k in CARD_METRICS if any(k in r["values"] for r in records)]
    rows = [[f"`{k}`", number(final["values"].get(k)), number(best["values"].get(k))] for k in keys]
    return table(["metric", f"final (step {final['step']})", f"best reward (step {best['step']})"], rows)


def _card_evaluation(job: JobDir) -> str | None:
    if not job.evaluation.exists():
        return None
    evaluation = json.loads(job.evaluation.read_text())
    before, after = evaluation.get("before"), evaluation.get("after")
    scored = isinstance(before, int | float) and isinstance(after, int | float)
    difference = change(before, after) if scored else "—"
    row = [f"`{evaluation.get('metric')}`", number(evaluation.get("n")), number(before), number(after), difference]
    rows = table(["metric", "prompts", "before", "after", "change"], [row])
    selection = selection_line(evaluation)
    return f"{rows}\n\n{selection}" if selection else rows


def model_card(job: JobDir, spec: JobSpec, artifact: str, repo_id: str | None = None) -> ModelCard:
    """The README.md pushed with the model: Hub metadata (YAML front matter), hyperparameters, metrics, evaluation.

    Args:
        job (`JobDir`): the job folder; `metrics.jsonl` and (when present) `evaluation.json` are read.
        spec (`JobSpec`): the job's resolved spec.
        artifact (`str`): `"merged"` (library `transformers`) or `"adapter"` (library `peft`).
        repo_id (`str`, *optional*): the target repository, for the title and the usage snippet.

    Returns:
        `ModelCard`: the card (`str(card)` is the README). `base_model` is omitted for `builtin:` and local models,
        `datasets` is set only for `hf://datasets/` sources. It holds no timestamp, so an unchanged job gives a
        byte-identical card.
    """
    data = ModelCardData(
        base_model=_card_base_model(spec.base_model),
        datasets=_card_datasets(spec.dataset.uri),
        library_name=LIBRARY_NAMES[artifact],
        pipeline_tag="text-generation",
        tags=list(CARD_TAGS),
    )
    return ModelCard.from_template(
        data,
        template_str=CARD_TEMPLATE,
        title=repo_id or spec.name,
        what="LoRA adapter (PEFT)" if artifact == "adapter" else "model (merged weights)",
        base=spec.base_model,
        job_id=job.job_id,
        dataset=spec.dataset.uri,
        rewards=", ".join(f"`{r.name}` (weight {r.weight:g})" for r in spec.rewards),
        sft=f"{spec.sft.max_steps} steps" if spec.sft.enabled else "none",
        parent=parent_of(spec.base_model),
        usage=USAGE[artifact].format(repo_id=repo_id) if repo_id else None,
        hyperparameters=_card_hyperparameters(spec),
        metrics=_card_metrics(job),
        evaluation=_card_evaluation(job),
    )


# --- token, checks, staging ----------------------------------------------------------------------------------------


def resolve_token(token: str | None = None) -> str:
    """The Hub token: `token`, else huggingface_hub's (`HF_TOKEN`, then `hf auth login`'s token file under
    `HF_HOME`).

    Raises:
        `PublishError`: (a user error) when none is set.
    """
    token = token or get_token()
    if not token:
        raise PublishError(NO_TOKEN, user_error=True)
    return token


def _check_repo_id(repo_id: str) -> None:
    if not isinstance(repo_id, str) or not re.fullmatch(REPO_ID_PATTERN, repo_id):
        raise PublishError(
            f"invalid repo id {repo_id!r}: must be 'owner/name', each 1-96 letters, digits, '-', '_' or '.', "
            "without '--' or '..', not starting or ending with '-' or '.'",
            user_error=True,
        )


def _artifact_folder(job: JobDir, artifact: str) -> Path:
    if artifact not in LIBRARY_NAMES:
        raise PublishError(f"artifact: must be 'merged' or 'adapter' (got {artifact!r})", user_error=True)
    folder = job.adapter if artifact == "adapter" else job.merged
    marker = "adapter_config.json" if artifact == "adapter" else "config.json"
    if not (folder / marker).is_file():
        hint = (
            "this job has no LoRA adapter (a full fine-tune); publish the merged weights with --artifact merged"
            if artifact == "adapter"
            else "the job has not produced merged weights yet; wait for its merge stage to finish"
        )
        raise PublishError(
            f"{folder}: no {marker}, so there is no {artifact} artifact to publish: {hint}", user_error=True
        )
    return folder


def _stage(folder: Path, staging: Path, card: ModelCard) -> None:
    """Lays the artifact out in `staging` as symlinks (no copy of multi-GB weights) plus the generated README.md."""
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        # Dotfiles are half-written temp files of atomic writes; PEFT's own README.md is replaced by the card.
        if not path.is_file() or any(p.startswith(".") for p in rel.parts) or rel.as_posix() == "README.md":
            continue
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            dest.symlink_to(path.resolve())
        except OSError:  # no symlinks on this filesystem (e.g. Windows without developer mode)
            shutil.copy2(path, dest)
    card.save(staging / "README.md")


# --- the push, with retries ----------------------------------------------------------------------------------------


def _push(api: HfApi, target: PublishSpec, folder: Path, card: ModelCard, job_id: str, heads: list[str]) -> dict:
    repo_url = api.create_repo(target.repo_id, private=target.private, exist_ok=True, repo_type="model")
    # Kept from the first attempt, so a retry after a lost commit response still reports the change.
    heads.append(api.repo_info(target.repo_id, repo_type="model").sha)
    with tempfile.TemporaryDirectory(prefix="grpoflow-publish-") as staging:
        _stage(folder, Path(staging), card)
        info = api.upload_folder(
            repo_id=target.repo_id,
            repo_type="model",
            folder_path=staging,
            commit_message=f"Publish the {target.artifact} model of grpoflow job {job_id}",
            delete_patterns="*",
        )
    changed = info.oid != heads[0]
    return {
        "repo_id": target.repo_id,
        "url": str(repo_url),
        "commit": info.oid if changed else None,
        "revision": info.oid,
        "changed": changed,
        "artifact": target.artifact,
    }


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None) if isinstance(exc, HfHubHTTPError) else None
    return getattr(response, "status_code", None)


def _is_transient(exc: BaseException) -> bool:
    status = _status(exc)
    if status is not None:
        return status == 429 or status >= 500
    return isinstance(exc, httpx2.TransportError | ConnectionError) and not isinstance(exc, OfflineModeIsEnabled)


def _failure(exc: BaseException, target: PublishSpec, token: str) -> PublishError:
    status, owner = _status(exc), target.repo_id.split("/")[0]
    if status == 401:
        message = (
            "the Hugging Face token was rejected (401 Unauthorized): check that HF_TOKEN (or the token of "
            f"`hf auth login`, or the Prefect Secret block '{TOKEN_SECRET_BLOCK}') is valid; create one at "
            "https://huggingface.co/settings/tokens"
        )
    elif status == 403:
        message = (
            f"the Hugging Face token may not write to {target.repo_id} (403 Forbidden): use a token with write "
            f"access to the '{owner}' namespace"
        )
    elif isinstance(exc, OfflineModeIsEnabled):
        message = "HF_HUB_OFFLINE is set, so the Hub cannot be reached: unset it to publish"
    else:
        detail = getattr(exc, "server_message", None) or (str(exc).strip().splitlines() or [""])[0]
        message = f"publishing to {target.repo_id} failed ({status or type(exc).__name__}): {detail}"
    # Anything but a transient failure is the Hub refusing the request as made: retrying cannot help.
    user_error = not _is_transient(exc)
    # A server could echo the token back in an error message; it must not reach a log or a traceback.
    return PublishError(message.replace(token, "***"), user_error=user_error)


def _with_retries(push, target: PublishSpec, token: str) -> dict:
    """`push()`, retried after a transient failure with the waits of `RETRY_DELAYS_S`; any failure as `PublishError`.

    The only retry layer of publishing. huggingface_hub retries some requests inside (the preupload call); the rest
    (create_repo, repo_info, the commit) it leaves to its caller.
    """
    attempts = len(RETRY_DELAYS_S) + 1
    for attempt in range(1, attempts + 1):
        try:
            return push()
        except (HfHubHTTPError, httpx2.TransportError, ConnectionError) as exc:
            if not _is_transient(exc) or attempt == attempts:
                raise _failure(exc, target, token) from None
            delay = RETRY_DELAYS_S[attempt - 1]
            logger.warning(
                "publishing to %s: transient failure (%s), retrying in %.1fs (attempt %d of %d)",
                target.repo_id,
                _status(exc) or type(exc).__name__,
                delay,
                attempt + 1,
                attempts,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")


def publish(job: JobDir, target: PublishSpec, token: str | None = None, *, spec: JobSpec | None = None) -> dict:
    """Pushes the job's artifact to the Hub repo `target.repo_id` with a generated model card, in one commit.

    Transient failures (connection errors, 5xx, 429) are retried, 3 attempts in all (`RETRY_DELAYS_S`); a rejected
    token (401/403) fails at once. Re-publishing an unchanged artifact makes no commit.

    Args:
        job (`JobDir`): the job folder; its `merged/` or `adapter/` is uploaded, never modified.
        target (`PublishSpec` or alike): `repo_id`, `artifact` (`"merged"` or `"adapter"`) and `private`.
        token (`str`, *optional*): the Hub token; default: `resolve_token`'s (`HF_TOKEN`, the `hf auth login` token
            file).
        spec (`JobSpec`, *optional*): the job's spec for the card; default: the job folder's `spec.yaml`.

    Returns:
        `dict`: `{"repo_id", "url", "commit", "revision", "changed", "artifact"}`; `commit` is the new commit's sha,
        None when nothing changed; `revision` is the sha the repo's main branch now points at.

    Raises:
        `PublishError`: `user_error` is True for a bad repo id, a missing artifact, no token or a rejected one.
    """
    _check_repo_id(target.repo_id)
    token = resolve_token(token)
    folder = _artifact_folder(job, target.artifact)
    spec = spec or load_spec(job.spec)[0]
    card = model_card(job, spec, target.artifact, repo_id=target.repo_id)
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT"), token=token, library_name="grpoflow")
    heads: list[str] = []
    result = _with_retries(lambda: _push(api, target, folder, card, job.job_id, heads), target, token)
    logger.info(
        "published %s to %s (%s)", target.artifact, result["url"], "new commit" if result["changed"] else "unchanged"
    )
    return result
