"""The serving registry: a job's merged weights registered under a name to serve, `ready` only after a smoke test;
every version of a name kept with its score and job, so a worse model can be rolled back; and the promotion gate.
("Deployment" in grpoflow means a Prefect deployment; the spec's `deploy:` section, the event
`grpoflow.deployment.registered` and the registry's folder keep their names: specs, automations and existing
registries rely on them.)

The registry is one JSON file per name under `<output_root>/deployments/<name>.json`, written atomically under a lock
on the folder, so two registrations never clobber each other's versions:

    {"name", "owner", "current": 2, "versions": [{"version": 1, "job_id", "artifact_path", "artifact_type", "metric",
     "score", "status", "registered", "smoke"}, ...],
     "job_id", "artifact_path", "artifact_type", "status", "created", "updated", ...}   # the current version's fields

The top-level fields repeat the current version's, so a reader of the old one-record files (`grpoflow serve`) reads
the new ones unchanged; an old file reads as a name with one version. Registering the job that is already current
again re-tests it in place (idempotent, `created` kept); another job becomes a new version, current once its smoke
test passed (a failed one is kept, marked `failed`, and the name keeps serving what it served). A LoRA job deploys
like a full fine-tune: from `merged/`.

    grpoflow serving register JOB_ID --name arithmetic
    grpoflow serving list
    grpoflow serving rollback arithmetic      # the previous ready version becomes current again
    grpoflow serve arithmetic --port 8000

No Prefect: `tasks/register.py` wraps `register` as the pipeline's task, `tasks/gate.py` wraps `gate_decision`.
"""

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.scores import SCORE_TOLERANCE, beats, change, gain_line
from grpoflow.core.spec import load_spec
from grpoflow.trainers.evaluate import generate
from grpoflow.trainers.model.load import to_prompt

# The version fields repeated at the top level of `<name>.json`, where the one-record files had them.
CURRENT_FIELDS = ("job_id", "artifact_path", "artifact_type", "metric", "score", "status", "smoke", "error")


class RegistrationError(RuntimeError):
    """The job cannot be registered (no merged weights yet), an unknown name, nothing to roll back to."""


def registry_dir(output_root: Path) -> Path:
    return Path(output_root) / "deployments"


@contextlib.contextmanager
def _locked(output_root: Path) -> Iterator[None]:
    """An exclusive lock on the registry folder itself (no lock file beside the records), for read-modify-write."""
    folder = registry_dir(output_root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _normalized(record: dict) -> dict:
    """A registry record with `versions` and `current`: an old one-record file becomes a name with one version."""
    if "versions" in record:
        return record
    version = {"version": 1, "metric": None, "score": None, **{k: record[k] for k in CURRENT_FIELDS if k in record}}
    version["registered"] = record.get("updated") or record.get("created")
    return {**record, "current": 1 if record.get("status") == "ready" else None, "versions": [version]}


def _with_current(record: dict) -> dict:
    """`record` with the current version's fields at the top level (the latest version's when none is current)."""
    versions = record["versions"]
    shown = next((v for v in versions if v["version"] == record["current"]), versions[-1] if versions else {})
    for key in CURRENT_FIELDS:
        record.pop(key, None)
    record.update({k: shown[k] for k in CURRENT_FIELDS if k in shown})
    return record


def read_serving_record(output_root: Path, name: str) -> dict:
    """The serving registry's record of `name` (old one-record files read as one version); `RegistrationError`
    naming the registered names when there is none."""
    path = registry_dir(output_root) / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in registry_dir(output_root).glob("*.json"))
        raise RegistrationError(f"unknown serving name {name!r}; registered: {', '.join(known) or 'none'}")
    return _normalized(json.loads(path.read_text()))


def list_serving_records(output_root: Path) -> list[dict]:
    """Every name's record in the serving registry (see `read_serving_record`), by name."""
    return [read_serving_record(output_root, p.stem) for p in sorted(registry_dir(output_root).glob("*.json"))]


def served_score(output_root: Path, name: str) -> float | None:
    """The held-out score of the version `name` serves now; None when it serves none or has no score."""
    try:
        record = read_serving_record(output_root, name)
    except RegistrationError:
        return None
    current = [v for v in record["versions"] if v["version"] == record["current"]]
    return current[0].get("score") if current else None


def rollback(output_root: Path, name: str) -> tuple[dict, dict]:
    """Makes the ready version before the current one current again; returns (restored, replaced) versions.

    Args:
        output_root (`Path`): the folder holding `deployments/`.
        name (`str`): the name in the serving registry.
    """
    with _locked(output_root):
        record = read_serving_record(output_root, name)
        versions, current = record["versions"], record["current"]
        position = next((i for i, v in enumerate(versions) if v["version"] == current), None)
        if position is None:
            raise RegistrationError(f"serving name {name!r} serves no version: nothing to roll back from")
        earlier = [v for v in versions[:position] if v.get("status") == "ready"]
        if not earlier:
            job_id = versions[position]["job_id"]
            raise RegistrationError(
                f"serving name {name!r} has no ready version before version {current} (job {job_id})"
            )
        record["current"], record["updated"] = earlier[-1]["version"], datetime.now(UTC).isoformat()
        write_json_atomic(registry_dir(output_root) / f"{name}.json", _with_current(record))
    return earlier[-1], versions[position]


# --- the promotion gate


def gate_decision(evaluation: dict | None, gate, deployed: float | None) -> dict:
    """Whether the GRPO result may be published and deployed, by the spec's `evaluation.gate`.

    Args:
        evaluation (`dict`, *optional*): evaluation.json (`metric`, `before`, `after`, and `ci`, the intervals with
            their `confidence`); None when nothing was held out.
        gate (`GateSpec`, *optional*): `min_gain` (after - before must reach it; 0 or more also needs after to beat
            before: a model no better than its start is not promoted), `significant` (the lower bound of the gain's
            interval must exceed `min_gain`) and `beat_deployed` (after must reach `deployed`); None, or neither
            `min_gain` nor `beat_deployed` set, promotes every model.
        deployed (`float`, *optional*): the score the serving name (deploy.name) serves now; None when it serves
            nothing scored.

    Returns:
        `dict`: `promote`, `reason` (every unmet condition, "; "-joined), `kind` (the first one's, as
        `grpoflow.model.rejected` names it: `not_scored`, `no_improvement`, `below_min_gain`, `not_significant`,
        `below_deployed`; None when promoted), and the figures judged: `metric`, `before`, `after`, `gain`, `gain_ci`
        (its interval, `[low, high]`, or None), `confidence`, `deployed_score`, `min_gain`, `significant`,
        `beat_deployed`.
    """
    evaluation = evaluation or {}
    before, after = evaluation.get("before"), evaluation.get("after")
    gain = after - before if before is not None and after is not None else None
    gain_ci, confidence = (evaluation.get("ci") or {}).get("gain"), evaluation.get("confidence")
    min_gain = gate.min_gain if gate else None
    beat_deployed, significant = bool(gate and gate.beat_deployed), bool(gate and gate.significant)
    gated = min_gain is not None or beat_deployed
    problems = [] if not gated else _unmet(before, after, min_gain, beat_deployed, deployed)
    if (
        significant
        and min_gain is not None
        and not {"not_scored", "no_improvement", "below_min_gain"} & {kind for kind, _ in problems}
    ):
        problems = _not_significant(evaluation, min_gain) + problems  # before below_deployed, as min_gain's are
    passed = "passed evaluation.gate" + (
        f": {gain_line(evaluation.get('metric'), before, after, gain_ci, confidence)}" if gain is not None else ""
    )
    return {
        "promote": not problems,
        "reason": "; ".join(text for _, text in problems) or (passed if gated else "no gate"),
        "kind": problems[0][0] if problems else None,
        "metric": evaluation.get("metric"),
        "before": before,
        "after": after,
        "gain": gain,
        "gain_ci": gain_ci,
        "confidence": confidence,
        "deployed_score": deployed,
        "min_gain": min_gain,
        "significant": significant,
        "beat_deployed": beat_deployed,
    }


def _not_significant(evaluation: dict, min_gain: float) -> list[tuple]:
    """`evaluation.gate.significant`'s unmet condition, as a (kind, sentence) pair, when the lower bound of the gain's
    interval does not exceed `min_gain`."""
    before, after, ci = evaluation["before"], evaluation["after"], (evaluation.get("ci") or {}).get("gain")
    if ci is None:
        text = (
            "the gain has no interval to judge (evaluation.confidence: null, or the job was evaluated without one); "
            "evaluation.gate.significant promotes only a gain whose interval's lower bound exceeds min_gain"
        )
        return [("not_significant", text)]
    if ci[0] > min_gain:
        return []
    line = gain_line(evaluation.get("metric"), before, after, ci, evaluation.get("confidence"))
    text = f"{line}: the gain's lower bound {ci[0]:+.4g} does not exceed evaluation.gate.min_gain {min_gain:g}"
    return [("not_significant", f"{text}, so it may be chance (evaluation.gate.significant)")]


def _unmet(before, after, min_gain: float | None, beat_deployed: bool, deployed: float | None) -> list[tuple]:
    """The gate's unmet conditions, as (kind, sentence) pairs."""
    if after is None:
        return [("not_scored", "the GRPO result has no held-out score to judge (nothing held out, or nothing scored)")]
    problems = []
    if min_gain is not None and before is None:
        problems.append(("not_scored", f"the start model was not scored: no gain to judge by min_gain {min_gain:g}"))
    elif min_gain is not None and min_gain >= 0 and not beats(after, before):
        wanted = "a gain" if min_gain == 0 else f"a gain of at least {min_gain:g}"
        scores = f"{before:.4g} -> {after:.4g}, {change(before, after)}"
        text = f"no checkpoint beat the starting model ({scores}); evaluation.gate.min_gain {min_gain:g} promotes only"
        problems.append(("no_improvement", f"{text} {wanted} (null turns the gate off)"))
    elif min_gain is not None and after - before + SCORE_TOLERANCE < min_gain:
        text = f"gain {after - before:+.4g} ({before:.4g} -> {after:.4g}) is below evaluation.gate.min_gain"
        problems.append(("below_min_gain", f"{text} {min_gain:g}"))
    if beat_deployed and deployed is not None and after + SCORE_TOLERANCE < deployed:
        text = f"score {after:.4g} is below the deployed version's {deployed:.4g} (evaluation.gate.beat_deployed)"
        problems.append(("below_deployed", text))
    return problems


# --- registering


def smoke_prompt(job: JobDir):
    """A prompt from the job's own data (held-out first), as the model will see it, for the smoke inference."""
    from datasets import load_from_disk

    spec, _ = load_spec(job.spec)
    splits = load_from_disk(str(job.dataset))
    rows = splits["eval"] if "eval" in splits else splits["train"]
    return to_prompt(rows[0][spec.dataset.prompt_column], spec.hyperparameters.system_prompt)


def smoke_test(model_dir: Path, prompt, max_new_tokens: int = 16) -> dict:
    """Loads the weights and generates one completion: the proof the weights can be served."""
    started = time.monotonic()
    completion = generate(str(model_dir), [prompt], max_new_tokens)[0]
    text = completion[0]["content"] if isinstance(completion, list) else completion
    return {"prompt": prompt, "completion": text, "seconds": round(time.monotonic() - started, 3)}


def owner_problem(output_root: Path, name: str, owner: str) -> str | None:
    """Why the job name `owner` may not register `name` in the serving registry under `output_root`: the name
    belongs to the job name that registered it first (its record's `owner`; a record from before owners were kept
    belongs to none)."""
    path = registry_dir(output_root) / f"{name}.json"
    if not path.exists():
        return None
    first = json.loads(path.read_text()).get("owner")
    if first in (None, owner):
        return None
    return (
        f"deploy.name: serving name {name!r} belongs to the jobs named {first!r}, which registered it first; name "
        "another"
    )


def register(job: JobDir, name: str, owner: str | None = None) -> dict:
    """Registers `job`'s merged weights as a version of `name` in the serving registry, current once a smoke test
    passed.

    Args:
        job (`JobDir`): a finished job (it has `merged/`).
        name (`str`): the name to serve it under (DeploySpec rules: lowercase slug).
        owner (`str`, *optional*): the job name registering it (the spec's `name`); a name registered first by
            another job name is refused (`owner_problem`). None (`grpoflow serving register` by hand) checks no owner.

    Returns:
        `dict`: the name's record, the new (or re-tested) version's fields at the top level, `version` its number.
    """
    if not (job.merged / "config.json").exists():
        raise RegistrationError(f"job {job.job_id} has no merged weights yet (merged/ is missing); train it first")
    root, now = job.root.parent, datetime.now(UTC).isoformat()
    if owner is not None and (problem := owner_problem(root, name, owner)):
        raise RegistrationError(problem)
    info = json.loads(job.model_json.read_text()) if job.model_json.exists() else {}
    evaluation = json.loads(job.evaluation.read_text()) if job.evaluation.exists() else {}
    version = {
        "job_id": job.job_id,
        "artifact_path": str(job.merged),
        "artifact_type": info.get("artifact_type", "full"),
        "metric": evaluation.get("metric"),
        "score": evaluation.get("after"),
        "status": "registering",
        "registered": now,
    }
    number = _add_version(root, name, version, now, owner=owner)
    try:
        version.update(smoke=smoke_test(job.merged, smoke_prompt(job)), status="ready")
    except Exception as e:
        version.update(status="failed", error=f"{type(e).__name__}: {e}")
        _add_version(root, name, version, now, number)
        raise RegistrationError(f"serving name {name!r}: the smoke inference failed: {e}") from e
    record = _add_version(root, name, version, now, number, make_current=True)
    return {**record, "version": number}


def _add_version(
    root: Path, name: str, version: dict, now: str, number: int | None = None, make_current=False, owner=None
):
    """Writes `version` into `name`'s record, as version `number`, or as a new one (the current version when its job
    is the same: a re-registration); returns its number, or the record once `make_current` made it current."""
    path = registry_dir(root) / f"{name}.json"
    with _locked(root):
        record = read_serving_record(root, name) if path.exists() else {"name": name, "created": now, "versions": []}
        if owner is not None and (problem := owner_problem(root, name, owner)):  # another job took it meanwhile
            raise RegistrationError(problem)
        record.setdefault("owner", owner)
        record.setdefault("current", None)
        versions = record["versions"]
        if number is None:
            same = [v for v in versions if v["version"] == record["current"] and v["job_id"] == version["job_id"]]
            number = same[0]["version"] if same else max((v["version"] for v in versions), default=0) + 1
        versions[:] = [v for v in versions if v["version"] != number] + [{"version": number, **version}]
        versions.sort(key=lambda v: v["version"])
        if make_current:
            record["current"] = number
        record.update(name=name, updated=now)
        write_json_atomic(path, _with_current(record))
    return record if make_current else number
