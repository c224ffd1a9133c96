"""OpenAI's fine-tuning API as the `openai` client calls it: files in, reinforcement fine-tuning jobs out.

    POST /v1/files                          multipart: file, purpose=fine-tune -> a `file` object
    GET  /v1/files, /v1/files/{id}
    POST /v1/fine_tuning/jobs               model, training_file, method {type: reinforcement, reinforcement:
                                            {grader, hyperparameters}}, suffix, seed, metadata -> a `fine_tuning.job`
    GET  /v1/fine_tuning/jobs, /v1/fine_tuning/jobs/{id}, /v1/fine_tuning/jobs/{id}/events, .../checkpoints
    POST /v1/fine_tuning/jobs/{id}/cancel, .../pause, .../resume    (pause: the run cancelled, its checkpoints kept;
                                                                     resume: a new run from the last checkpoint)

A job is a grpoflow spec made from the request (`openai_spec`, the mapping of docs/design.md): the grader becomes a
`grader:` reward, the training file's rows the dataset (its `messages` the prompt, the other fields the grader's
`item`), and each hyperparameter its grpoflow equivalent (`eval_samples` -> `evaluation.samples`, ...); a field with
none is a 400 naming it. Its id is grpoflow's job id, so Veri's `/v1/training_jobs/{id}/metrics` and `/model` read
the same job. The team's webhooks in the operator's policy (`teams.NAME.webhooks`) become the job's, with
`openai_events: only`: they get the job's end as OpenAI's `fine_tuning.job.succeeded|failed|cancelled` event.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from grpoflow.api.errors import ApiError, not_found
from grpoflow.api.jobs import JobState, cancel_job, checked_spec, job_state, pause_job, resume_job, start_job
from grpoflow.api.store import TeamStore, public_file
from grpoflow.api.training_jobs import Store, fine_tuned_model
from grpoflow.core.policy import PolicyError, load_policy
from grpoflow.core.spec import Hyperparameters
from grpoflow.trainers.metrics import read_metrics

files = APIRouter(prefix="/v1/files")
jobs = APIRouter(prefix="/v1/fine_tuning/jobs")

# OpenAI's job statuses for grpoflow's: a job waiting for a person's approval is still running to OpenAI's client.
STATUSES = {"queued": "queued", "running": "running", "awaiting_approval": "running", "succeeded": "succeeded",
            "failed": "failed", "rejected": "failed", "cancelled": "cancelled", "paused": "paused"}  # fmt: skip
REQUEST_FIELDS = ("model", "training_file", "validation_file", "method", "suffix", "seed", "metadata")
# OpenAI's reinforcement hyperparameters with a grpoflow equivalent: the grpoflow setting each one sets.
SAME_SETTING = {"batch_size": "prompts_per_step", "n_epochs": "max_steps", "compute_multiplier": "rollouts_per_prompt",
                "learning_rate_multiplier": "learning_rate"}  # fmt: skip
NO_EQUIVALENT = {
    "reasoning_effort": "grpoflow's models have no reasoning effort setting",
}
# OpenAI's hyperparameters that are grpoflow's `evaluation:` settings.
EVALUATION = {"eval_interval": "every", "eval_samples": "samples"}
# The rates the multiplier scales, as the learning_rate field's description gives them: full fine-tuning, LoRA.
FULL_RATE, LORA_RATE = Hyperparameters.model_fields["learning_rate"].default, 2e-5
DEFAULT_GROUP = Hyperparameters.model_fields["rollouts_per_prompt"].default


# --- files -----------------------------------------------------------------------------------------------------------


UPLOAD_FORM = {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["fine-tune"]}},
}}}}  # fmt: skip
MAX_FIELD_BYTES = 4096  # a form field beside the file (purpose)
MAX_PARTS = 8  # file, purpose and a few a client may add


@files.post("", openapi_extra={"requestBody": UPLOAD_FORM})
async def upload(request: Request, store: Store) -> dict:
    """Uploads a file of training rows (multipart: file, purpose=fine-tune), streamed to the team's files folder: never
    whole in memory, refused (413) as soon as it passes the API's limit, and nothing of it kept when refused."""
    received = store.upload_path()
    try:
        form = await receive_form(request, received, request.app.state.settings.max_upload_bytes)
        if (purpose := form.get("purpose")) != "fine-tune":
            raise ApiError(400, f"purpose {purpose!r}: this API takes fine-tune files only", param="purpose")
        if "filename" not in form:
            raise ApiError(400, "file: no file part in the form", param="file")
        return public_file(store.add_file(form["filename"] or "upload.jsonl", received, purpose))
    finally:
        received.unlink(missing_ok=True)  # renamed into place once recorded; anything else received goes


async def receive_form(request: Request, to: Path, limit: int) -> dict[str, str]:
    """Reads the multipart body of `request` as it arrives: its `file` part written to `to` (a 413 as soon as it
    passes `limit` bytes), the other fields kept as text; returns {name: text}, and the file's name as `filename`."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or not options.get(b"boundary"):
        raise ApiError(400, "the body must be multipart/form-data: file, and purpose=fine-tune", param="file")
    fields: dict[str, bytearray] = {}
    part = {"header": b"", "value": b"", "disposition": b"", "name": ""}
    written = parts = 0
    with to.open("wb") as out:

        def on_part_begin() -> None:
            nonlocal parts
            parts += 1
            if parts > MAX_PARTS:
                raise ApiError(400, f"the form has over {MAX_PARTS} parts: file, and purpose=fine-tune", param="file")
            part.update(header=b"", value=b"", disposition=b"", name="")

        def on_header_field(data: bytes, start: int, end: int) -> None:
            part["header"] += data[start:end]  # python-multipart bounds a header's size

        def on_header_value(data: bytes, start: int, end: int) -> None:
            part["value"] += data[start:end]

        def on_header_end() -> None:
            if part["header"].lower() == b"content-disposition":
                part["disposition"] = part["value"]
            part.update(header=b"", value=b"")

        def on_headers_finished() -> None:
            _, disposition = parse_options_header(part["disposition"])
            part["name"] = disposition.get(b"name", b"").decode(errors="replace")
            if part["name"] == "file":
                fields["filename"] = bytearray(disposition.get(b"filename", b""))

        def on_part_data(data: bytes, start: int, end: int) -> None:
            nonlocal written
            if part["name"] == "file":
                written += end - start
                if written > limit:
                    raise ApiError(413, f"file: over the API's limit of {limit:,} bytes", param="file")
                out.write(data[start:end])
                return
            field = fields.setdefault(part["name"], bytearray())
            field += data[start:end]
            if len(field) > MAX_FIELD_BYTES:
                raise ApiError(400, f"{part['name']}: over {MAX_FIELD_BYTES} bytes", param=part["name"])

        callbacks = {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                     "on_header_value": on_header_value, "on_header_end": on_header_end,
                     "on_headers_finished": on_headers_finished, "on_part_data": on_part_data}  # fmt: skip
        parser = MultipartParser(options[b"boundary"], callbacks)
        try:
            async for chunk in request.stream():
                parser.write(chunk)
            parser.finalize()
        except MultipartParseError as e:
            raise ApiError(400, f"the multipart body is malformed ({e})", param="file") from None
    return {name: value.decode(errors="replace") for name, value in fields.items()}


@files.get("")
async def list_files(store: Store) -> dict:
    """The team's uploaded files."""
    return {"object": "list", "data": [public_file(r) for r in store.files()], "has_more": False}


@files.get("/{file_id}")
async def get_file(file_id: str, store: Store) -> dict:
    """One uploaded file's record."""
    if (record := store.file(file_id)) is None:
        raise not_found("file", file_id)
    return public_file(record)


# --- the request as a spec -------------------------------------------------------------------------------------------


# Where a spec's problem is in OpenAI's request (the problems of a spec made from one are named so).
REQUEST_NAMES = {"dataset.uri": "training_file", "base_model": "model", "name": "suffix",
                 "rewards[0].grader": "method.reinforcement.grader"}  # fmt: skip


def openai_spec(body: dict, store: TeamStore) -> tuple[dict, list[str]]:
    """The grpoflow spec of a `POST /v1/fine_tuning/jobs` request, and the fields it cannot map (the spec's own
    problems, its training file's included, are `checked_spec`'s, named by `REQUEST_NAMES`)."""
    problems = [f"{key}: no equivalent in grpoflow; leave it out" for key in body if key not in REQUEST_FIELDS
                and body[key] is not None]  # fmt: skip
    method = body.get("method") or {}
    if method.get("type") != "reinforcement":
        problems.append(f"method.type: {method.get('type')!r}; this API runs reinforcement fine-tuning only")
    reinforcement = method.get("reinforcement") or {}
    problems += [f"method.reinforcement.{k}: no equivalent in grpoflow" for k in reinforcement
                 if k not in ("grader", "hyperparameters")]  # fmt: skip
    if body.get("validation_file") is not None:
        problems.append("validation_file: no equivalent yet; grpoflow holds rows of training_file out instead")
    training_file = str(body.get("training_file") or "")
    if not training_file.startswith("file-"):  # never a path: the rows are a file the team uploaded
        problems.append(f"training_file: {training_file!r} is no file id; upload the rows with POST /v1/files")
    training = store.file(training_file)
    hyperparameters, evaluation, more = _hyperparameters(
        reinforcement.get("hyperparameters") or {}, _rows(store, training) if training else 0
    )
    if body.get("seed") is not None:
        hyperparameters["seed"] = body["seed"]
    spec = {
        "name": body.get("suffix") or "ft",
        "base_model": body.get("model"),
        "dataset": {"uri": training_file, "prompt_column": "messages"},
        "rewards": [{"grader": reinforcement.get("grader") or {}}],
        "hyperparameters": hyperparameters,
        "evaluation": evaluation,
    }
    return spec, problems + more


def _rows(store: TeamStore, record: dict) -> int:
    with store.file_path(record).open("rb") as f:
        return sum(1 for line in f if line.strip())


def _hyperparameters(given: dict, rows: int) -> tuple[dict, dict, list[str]]:
    """grpoflow's hyperparameters and evaluation settings for OpenAI's (and grpoflow's own names, Veri's), with the
    problems: a field with no equivalent, or one setting given both ways."""
    where = "method.reinforcement.hyperparameters"
    given = {k: v for k, v in given.items() if v is not None and v != "auto"}
    ours = {k: v for k, v in given.items() if k in Hyperparameters.model_fields}
    problems = [f"{where}.{k}: {NO_EQUIVALENT[k]}" for k in given if k in NO_EQUIVALENT]
    known = {*ours, *NO_EQUIVALENT, *SAME_SETTING, *EVALUATION}
    problems += [f"{where}.{k}: neither an OpenAI reinforcement hyperparameter nor a grpoflow one" for k in given
                 if k not in known]  # fmt: skip
    problems += [f"{where}.{k}: sets {SAME_SETTING[k]}, given too; give one of them" for k in given
                 if k in SAME_SETTING and SAME_SETTING[k] in ours]  # fmt: skip
    hp = dict(ours)
    if "batch_size" in given:
        hp["prompts_per_step"] = given["batch_size"]
    if "n_epochs" in given:
        hp["max_steps"] = max(1, math.ceil(given["n_epochs"] * rows / hp.get("prompts_per_step", 1)))
    if "compute_multiplier" in given:
        hp["rollouts_per_prompt"] = round(DEFAULT_GROUP * given["compute_multiplier"])
    if "learning_rate_multiplier" in given:
        rate = LORA_RATE if hp.get("lora_rank") else FULL_RATE
        hp["learning_rate"] = given["learning_rate_multiplier"] * rate
    evaluation = {setting: given[k] for k, setting in EVALUATION.items() if k in given}
    return hp, evaluation, problems


def team_webhooks(settings, team: str) -> list[dict]:
    """The team's webhooks the operator's policy lists (`teams.NAME.webhooks`), as a job's webhooks that get OpenAI's
    `fine_tuning.job.*` events only: OpenAI's request has no webhook field, and OpenAI's webhooks are the project's."""
    try:
        own = load_policy(settings.project).policy.teams.get(team)
    except PolicyError:
        return []  # the job's check names the policy's mistake
    return [{"url": h.url, "secret_env": h.secret_env, "openai_events": "only"} for h in (own.webhooks if own else [])]


# --- jobs ------------------------------------------------------------------------------------------------------------


def fine_tuning_job(state: JobState, team: str) -> dict:
    """A job as OpenAI's `fine_tuning.job` object."""
    request = state.record.get("openai") or {}
    hyperparameters = ((request.get("method") or {}).get("reinforcement") or {}).get("hyperparameters") or {}
    status = STATUSES[state.status]
    error = state.error if status == "failed" else None
    return {
        "id": state.record["id"],
        "object": "fine_tuning.job",
        "created_at": state.record["created_at"],
        "error": error,
        "fine_tuned_model": fine_tuned_model(state, team),
        "finished_at": state.finished_at,
        "hyperparameters": {
            k: hyperparameters.get(k, "auto") for k in ("batch_size", "learning_rate_multiplier", "n_epochs")
        },  # fmt: skip
        "model": request.get("model") or state.record.get("spec", {}).get("base_model"),
        "organization_id": f"org-{team}",
        "result_files": [],
        "seed": request["seed"] if request.get("seed") is not None else Hyperparameters.model_fields["seed"].default,
        "status": status,
        "trained_tokens": None,
        "training_file": request.get("training_file") or "",
        "validation_file": request.get("validation_file"),
        "estimated_finish": None,
        "integrations": None,
        "metadata": request.get("metadata"),
        "method": request.get("method"),
    }


async def _found(store: TeamStore, job_id: str) -> JobState:
    state = await job_state(store, job_id)
    if state is None:
        raise not_found("fine-tuning job", job_id)
    return state


@jobs.post("")
async def create(request: Request, body: Annotated[dict, Body()], store: Store) -> dict:
    """Starts a reinforcement fine-tuning job from OpenAI's request (a 400 names each field without an equivalent)."""
    settings = request.app.state.settings
    data, problems = openai_spec(body, store)
    data["webhooks"] = team_webhooks(settings, store.team)
    spec, parent = checked_spec(data, settings, store, problems, REQUEST_NAMES)
    asked = {k: body.get(k) for k in REQUEST_FIELDS}
    record = await start_job(spec, settings, store, parent, openai=asked)
    return fine_tuning_job(await _found(store, record["id"]), store.team)


@jobs.get("")
async def list_jobs(store: Store, after: str | None = None, limit: int = 20) -> dict:
    """The team's jobs as OpenAI's `fine_tuning.job` objects."""
    records = store.jobs()
    if after is not None:
        ids = [r["id"] for r in records]
        records = records[ids.index(after) + 1 :] if after in ids else []
    page = [s for r in records[:limit] if (s := await job_state(store, r["id"])) is not None]
    return {"object": "list", "data": [fine_tuning_job(s, store.team) for s in page],
            "has_more": len(records) > limit}  # fmt: skip


@jobs.get("/{job_id}")
async def get(job_id: str, store: Store) -> dict:
    """One job as OpenAI's `fine_tuning.job`."""
    return fine_tuning_job(await _found(store, job_id), store.team)


@jobs.get("/{job_id}/events")
async def events(job_id: str, store: Store, after: str | None = None, limit: int = 20):
    """The job's events as OpenAI's `fine_tuning.job.event` objects, newest first."""
    state = await _found(store, job_id)
    created = {"id": f"ftevent-{job_id}-created", "object": "fine_tuning.job.event", "level": "info",
               "type": "message", "created_at": state.record["created_at"], "message": "Created fine-tuning job",
               "data": {}}  # fmt: skip
    listed = [*(job_event(r) for r in reversed(state.events)), created]  # newest first, as OpenAI lists them
    if after is not None:
        ids = [e["id"] for e in listed]
        listed = listed[ids.index(after) + 1 :] if after in ids else []
    return {"object": "list", "data": listed[:limit], "has_more": len(listed) > limit}


def job_event(record: dict) -> dict:
    """One record of the job's events.jsonl as a `fine_tuning.job.event`."""
    name, payload = record["event"], record.get("payload") or {}
    level = "error" if name == "grpoflow.job.failed" else "warn" if name == "grpoflow.training.alert" else "info"
    said = payload.get("error") or payload.get("message") or ""
    return {
        "id": f"ftevent-{record.get('id')}",
        "object": "fine_tuning.job.event",
        "created_at": int(datetime.fromisoformat(record["occurred"]).timestamp()) if record.get("occurred") else 0,
        "level": level,
        "message": f"{name.removeprefix('grpoflow.')}{': ' + str(said) if said else ''}",
        "data": payload,
        "type": "metrics" if name == "grpoflow.training.progress" else "message",
    }


@jobs.get("/{job_id}/checkpoints")
async def checkpoints(job_id: str, store: Store, after: str | None = None, limit: int = 10) -> dict:
    """The job's kept checkpoints and, once it succeeded, its final model, newest first (OpenAI's
    `fine_tuning.job.checkpoint` objects, each with its step's loss and reward)."""
    state = await _found(store, job_id)
    steps = {r["step"]: r["values"] for r in read_metrics(state.job.metrics)}
    folders = state.job.checkpoints.glob("checkpoint-*") if state.job.checkpoints.is_dir() else []
    kept = sorted(int(f.name.rsplit("-", 1)[1]) for f in folders if f.name.rsplit("-", 1)[1].isdigit())
    model = fine_tuned_model(state, store.team)
    listed = [_checkpoint(state, f"{model or 'ft:' + job_id}:ckpt-step-{n}", n, steps.get(n, {})) for n in kept]
    if model is not None and steps:
        last = max(steps)
        listed = [c for c in listed if c["step_number"] != last] + [_checkpoint(state, model, last, steps[last])]
    listed.reverse()
    if after is not None:
        ids = [c["id"] for c in listed]
        listed = listed[ids.index(after) + 1 :] if after in ids else []
    return {"object": "list", "data": listed[:limit], "has_more": len(listed) > limit}


def _checkpoint(state: JobState, name: str, step: int, values: dict) -> dict:
    return {
        "id": f"ftckpt-{state.record['id']}-{step}",
        "object": "fine_tuning.job.checkpoint",
        "created_at": state.finished_at or state.record["created_at"],
        "fine_tuned_model_checkpoint": name,
        "fine_tuning_job_id": state.record["id"],
        "metrics": {"step": step, "train_loss": values.get("loss"), "reward": values.get("reward")},
        "step_number": step,
    }


@jobs.post("/{job_id}/cancel")
async def cancel(job_id: str, store: Store) -> dict:
    """Cancels the job (a paused one for good)."""
    await cancel_job(await _found(store, job_id), store)
    return fine_tuning_job(await _found(store, job_id), store.team)


@jobs.post("/{job_id}/pause")
async def pause(job_id: str, store: Store) -> dict:
    """Pauses a running job: its run cancelled, its checkpoints kept; status `paused`."""
    await pause_job(await _found(store, job_id), store)
    return fine_tuning_job(await _found(store, job_id), store.team)


@jobs.post("/{job_id}/resume")
async def resume(request: Request, job_id: str, store: Store) -> dict:
    """Resumes a paused job: a new run of it from its last checkpoint."""
    await resume_job(await _found(store, job_id), request.app.state.settings, store)
    return fine_tuning_job(await _found(store, job_id), store.team)
