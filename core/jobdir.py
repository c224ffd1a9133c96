"""The job folder layout (`<output_uri>/<job_id>/`, docs/design.md): one place that names every file in it."""

import json
import os
import secrets
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


def check_job_id(job_id: str) -> str:
    """`job_id` when it can name a job folder (one path segment); else `ValueError` saying so.

    >>> check_job_id("arithmetic-demo-20261130-064628-4013d1")
    'arithmetic-demo-20261130-064628-4013d1'
    """
    if not isinstance(job_id, str) or "/" in job_id or "\\" in job_id or job_id in ("", ".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


def new_job_id(name: str, run_id: str | None = None, started: datetime | None = None) -> str:
    """`<name>-<UTC time>-<6 hex>`: sortable by time, unique even for two runs started in the same second.

    Given the flow run's id and start time, the id is the same on every retry of that flow run, so a retried flow
    finds its own job folder and skips the stages it already completed.
    """
    suffix = str(run_id).replace("-", "")[:6] if run_id else secrets.token_hex(3)
    return f"{name}-{(started or datetime.now(UTC)).astimezone(UTC):%Y%m%d-%H%M%S}-{suffix}"


def parent_of(base_model: str | None) -> str | None:
    """The job a model starts from when `base_model` is an earlier job's merged model (`<job folder>/merged`, as a
    warm start from a job's `fine_tuned_model` or `job:<id>` names it): that job's id; None for any other model.

    >>> parent_of("builtin:tiny") is None
    True
    """
    if not isinstance(base_model, str) or "://" in base_model or base_model.startswith("builtin:"):
        return None
    folder = Path(base_model).expanduser()
    if folder.name != "merged" or not (folder.parent / "model.json").is_file():
        return None
    return folder.parent.name


@dataclass(frozen=True)
class JobDir:
    """Paths of one job's folder. Every stage reads and writes through these names."""

    root: Path

    @property
    def job_id(self) -> str:
        return self.root.name

    spec = property(lambda self: self.root / "spec.yaml")
    dataset = property(lambda self: self.root / "dataset")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    checkpoints = property(lambda self: self.root / "checkpoints")
    sft = property(lambda self: self.root / "sft")
    sft_checkpoints = property(lambda self: self.root / "sft_checkpoints")
    adapter = property(lambda self: self.root / "adapter")
    merged = property(lambda self: self.root / "merged")
    model_json = property(lambda self: self.root / "model.json")
    events = property(lambda self: self.root / "events.jsonl")
    webhooks = property(lambda self: self.root / "webhooks.jsonl")
    evaluation = property(lambda self: self.root / "evaluation.json")
    rollouts = property(lambda self: self.root / "rollouts")  # step-NNNNNN.parquet: a kept step's completions
    evaluation_rollouts = property(lambda self: self.root / "evaluation")  # the same for each held-out evaluation
    report = property(lambda self: self.root / "report.md")
    suites = property(lambda self: self.root / "suites.json")
    suite_logs = property(lambda self: self.root / "suites")  # inspect-ai's logs of each suite's runs
    training_result = property(lambda self: self.root / "training.json")
    logs = property(lambda self: self.root / "logs")


# Every file and folder a job folder may hold, with what it holds: the docs' job-folder page is generated from it
# (docs/gen_reference.py), and tests/test_docs.py checks it against `JobDir`'s names and a real job's folder. A name
# ending in "/" is a folder; "*" matches any name. Hidden names (the lock, a lease, work folders) are left out.
FILES = {
    "spec.yaml": "The resolved spec, every default filled (secrets are never written).",
    "dataset/": "The ingested dataset (Arrow, `datasets.save_to_disk`): the training split and the held-out prompts.",
    "sft/": "The SFT warm-up's model (sft.enabled), the start of GRPO.",
    "sft_checkpoints/": "The SFT warm-up's checkpoints (`checkpoint-N/`, the newest), which a resumed warm-up goes "
    "on from; removed once sft/ is written.",
    "sft_metrics.jsonl": 'One line per SFT step: `{"step": n, "values": {...}}`.',
    "metrics.jsonl": 'One line per GRPO step: `{"step": n, "values": {...}}` with at least `reward`, '
    "`reward_std`, `loss`, `completions/mean_length`, `entropy`, and `kl` exactly when kl_coef > 0; plus every metric "
    "TRL logs and `eval/METRIC` at each held-out evaluation.",
    "checkpoints/": "Training checkpoints (`checkpoint-N/`); a retried or resumed training stage goes on from the "
    "newest intact one. Their trainer_state.json keeps the latest step's record in `log_history`: metrics.jsonl is "
    "the history.",
    "training.json": "What the training stage ended with: the artifact, steps, the selected step, times, the LoRA "
    "targets and parameter counts.",
    "budget.json": "The training seconds spent so far (budget.max_training_hours), which resumed attempts add to; "
    "rewritten every 5 s of training and at each checkpoint.",
    "canary.json": "The canary stage's result: passed or failed and why, one full-length step's peak memory, "
    "time and tokens per second on the job's devices, the projected training hours.",
    "adapter/": "LoRA jobs: the adapter (PEFT format) and the tokenizer.",
    "merged/": "The merged weights (LoRA jobs) or the full fine-tune, with the tokenizer; loads with "
    "`AutoModelForCausalLM.from_pretrained`.",
    "model.json": '`{"artifact_type": "adapter" or "full", "files": [...], "merged_files": [...]}`: what '
    "`grpoflow model JOB_ID` prints.",
    "evaluation.json": 'The held-out evaluation: `{"metric", "n", "before", "after", ...}`; before is the '
    "model GRPO started from, after the GRPO result (and the series of scores with evaluation.every).",
    "suites.json": 'The evaluation suites (evaluation.suites): `{"suites": [{"suite", "samples", "metrics": '
    '[{"scorer", "metric", "start", "kept", "change"}], "logs", "error"}], "seconds"}`, each inspect-ai metric of the '
    "model GRPO started from and of the kept model.",
    "suites/": "inspect-ai's logs of the suites' runs (`.eval` files, one per suite and model): `inspect view "
    "--log-dir JOB/suites` shows them.",
    "evaluation/": "`step-NNNNNN.parquet`: the held-out completions of each evaluation, with their scores.",
    "rollouts/": "`step-NNNNNN.parquet`: each kept GRPO step's completions with their prompt, every reward's score, "
    "the advantage and the length (rollouts.every); `grpoflow rollouts JOB_ID` reads them.",
    "gate.json": "The promotion gate's decision (evaluation.gate), and the approver's answer with gate.approval.",
    "published.json": "The Hub push (publish): the repository, its URL and the commit.",
    "report.md": "The human summary: hyperparameters, metric plots, held-out before/after, health verdict.",
    "*.png": "The report's plots: reward, reward_std, entropy, completion length, held-out score.",
    "events.jsonl": "Every event the job emitted, in order (see the events page).",
    "webhooks.jsonl": "One line per webhook delivery attempt: the event, the URL (no credentials), the outcome "
    "(retrying, delivered, failed, dropped), the HTTP status.",
    "webhooks-outbox.jsonl": "One line per queued webhook delivery with its exact body; those never delivered are "
    "what `grpoflow webhooks retry JOB_ID` sends.",
    "logs/": "The children's logs: `train.log`, `sft.log`, `canary.log`, `vllm.log`.",
    "stages/": "One record per finished stage (`ingest.json`, `train.json`, ...): what a resumed run skips.",
    "flow_run.json": "The Prefect flow run working on the job, and its process (id, host, start).",
    "tracking/": "TensorBoard event files (tracking.report_to: [tensorboard]).",
}


def write_json_atomic(path: Path, data) -> None:
    """Writes JSON to a temp file beside `path` and renames it, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def replace_dir(staged: Path, dest: Path) -> None:
    """Puts the finished folder `staged` at `dest`, keeping the old `dest` until the swap.

    `dest` is at every moment absent, the old folder or the complete new one; a failed rename puts the old one back.

    Args:
        staged (`Path`): the complete new folder, on the same filesystem as `dest` (written beside it).
        dest (`Path`): where it goes; an existing folder there is replaced.
    """
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex}")
    if dest.exists():
        dest.rename(old)
    try:
        staged.rename(dest)
    except OSError:
        if old.exists():
            old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


# --- the job index --------------------------------------------------------------------------------------------------
# Where jobs live: a small index of job locations, so a job id alone finds its job from any folder.
#
# `grpoflow run` (the job's create stage) records `<job_id> -> <output_uri>/<job_id>` as one file per job under
# `GRPOFLOW_JOB_INDEX` (default `~/.grpoflow/jobs`); `grpoflow jobs|metrics|model|publish|deploy JOB_ID` look there
# when the job is not under `--output-uri` (or `./runs`). One file per job, written atomically, so concurrent runs
# never race on a shared file; a location whose job folder is gone is skipped by the readers.

INDEX_ENV = "GRPOFLOW_JOB_INDEX"


def index_dir() -> Path:
    """The index folder: `GRPOFLOW_JOB_INDEX`, else `~/.grpoflow/jobs`."""
    return Path(os.environ.get(INDEX_ENV) or "~/.grpoflow/jobs").expanduser()


def remember(job_id: str, location: str) -> None:
    """Records that job `job_id` lives at `location` (a local folder or a URL such as `s3://bucket/runs/<job_id>`).

    An index that cannot be written (a read-only home) costs only the lookup, never the job.
    """
    try:
        write_text_atomic(index_dir() / check_job_id(job_id), location + "\n")
    except OSError:
        pass


def locate(job_id: str) -> str | None:
    """Where job `job_id` was recorded, or None."""
    try:
        return (index_dir() / check_job_id(job_id)).read_text().strip() or None
    except (OSError, ValueError):
        return None


def known_roots() -> list[str]:
    """The output roots of every indexed job (the folders or URLs holding job folders), each once, newest first."""
    folder = index_dir()
    entries = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
    roots = []
    for entry in entries:
        try:
            location = entry.read_text().strip()
        except OSError:
            continue
        roots.append(location.rstrip("/").rsplit("/", 1)[0])
    return list(dict.fromkeys(roots))
