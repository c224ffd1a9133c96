"""Deployment registration: a named serving deployment of a job's merged weights, `ready` only after a smoke test.

The registry is one JSON file per deployment under `<output_root>/deployments/<name>.json`, written atomically, so
registering is idempotent per name (registering the name again points it at the new job and keeps `created`) and
two registrations never clobber each other's files. A LoRA job deploys like a full fine-tune: from `merged/`.

    grpoflow deploy JOB_ID --name arithmetic
    grpoflow serve arithmetic --port 8000

No Prefect: `tasks/register.py` wraps `register` as the pipeline's task.
"""

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from trainers.jobdir import JobDir, write_json_atomic


class RegistrationError(RuntimeError):
    """The job cannot be deployed (no merged weights yet, unknown deployment)."""


def registry_dir(output_root: Path) -> Path:
    return Path(output_root) / "deployments"


def read_deployment(output_root: Path, name: str) -> dict:
    path = registry_dir(output_root) / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in registry_dir(output_root).glob("*.json"))
        raise RegistrationError(f"unknown deployment {name!r}; registered: {', '.join(known) or 'none'}")
    return json.loads(path.read_text())


def smoke_prompt(job: JobDir):
    """A prompt from the job's own data (held-out first), as the model will see it, for the smoke inference."""
    from datasets import load_from_disk

    from trainers.modeling import to_prompt
    from trainers.spec import load_spec

    spec, _ = load_spec(job.spec)
    splits = load_from_disk(str(job.dataset))
    rows = splits["eval"] if "eval" in splits else splits["train"]
    return to_prompt(rows[0][spec.dataset.prompt_column], spec.hyperparameters.system_prompt)


def smoke_test(model_dir: Path, prompt, max_new_tokens: int = 16) -> dict:
    """Loads the weights and generates one completion: the proof a deployment can serve."""
    from trainers.evaluate import generate

    started = time.monotonic()
    completion = generate(str(model_dir), [prompt], max_new_tokens)[0]
    text = completion[0]["content"] if isinstance(completion, list) else completion
    return {"prompt": prompt, "completion": text, "seconds": round(time.monotonic() - started, 3)}


def register(job: JobDir, name: str) -> dict:
    """Registers (or re-points) deployment `name` at `job`'s merged weights; `ready` once a smoke test passed.

    Args:
        job (`JobDir`): a finished job (it has `merged/`).
        name (`str`): the deployment's name (DeploySpec rules: lowercase slug).
    """
    if not (job.merged / "config.json").exists():
        raise RegistrationError(f"job {job.job_id} has no merged weights yet (merged/ is missing); train it first")
    path = registry_dir(job.root.parent) / f"{name}.json"
    now = datetime.now(UTC).isoformat()
    previous = json.loads(path.read_text()) if path.exists() else {}
    info = json.loads(job.model_json.read_text()) if job.model_json.exists() else {}
    record = {
        "name": name,
        "job_id": job.job_id,
        "artifact_path": str(job.merged),
        "artifact_type": info.get("artifact_type", "full"),
        "created": previous.get("created", now),
        "updated": now,
        "status": "registering",
    }
    write_json_atomic(path, record)
    try:
        record["smoke"] = smoke_test(job.merged, smoke_prompt(job))
        record["status"] = "ready"
    except Exception as e:
        record.update(status="failed", error=f"{type(e).__name__}: {e}")
        write_json_atomic(path, record)
        raise RegistrationError(f"deployment {name!r}: the smoke inference failed: {e}") from e
    write_json_atomic(path, record)
    return record
