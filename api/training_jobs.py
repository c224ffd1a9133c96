"""Veri's API (the seed): a job spec in, the job's status, metrics, events and model out.

POST /v1/training_jobs                  a job spec as JSON -> 201 {id, status, created_at, ...}
GET  /v1/training_jobs                  {"object": "list", "data": [...]}
GET  /v1/training_jobs/{id}             status: queued | running | awaiting_approval | succeeded | failed |
                                        cancelled | rejected | paused (through OpenAI's pause)
GET  /v1/training_jobs/{id}/metrics?keys=reward,loss    {"metrics": [{"step", "values"}]}
GET  /v1/training_jobs/{id}/events      {"object": "list", "data": [events.jsonl's records]}
GET  /v1/training_jobs/{id}/model       {"artifact_type", "files", "merged_files"}
POST /v1/training_jobs/{id}/cancel
POST /v1/training_jobs/{id}/pause       a running job's run cancelled, its checkpoints kept: status paused
POST /v1/training_jobs/{id}/resume      a paused job's new run, from its last checkpoint: queued, then running
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel

from grpoflow.api.errors import ApiError, not_found
from grpoflow.api.jobs import JobState, cancel_job, checked_spec, job_state, pause_job, resume_job, start_job
from grpoflow.api.store import TeamStore
from grpoflow.trainers.metrics import read_metrics
from grpoflow.trainers.rollouts import rollout_record, select_rollouts

router = APIRouter(prefix="/v1/training_jobs")


def fine_tuned_model(state: JobState, team: str) -> str | None:
    """`ft:<base>:<team>:<name>:<job id>` for a succeeded job (its merged model, published or not), else None."""
    if state.status != "succeeded":
        return None
    spec = state.record.get("spec") or {}
    return f"ft:{spec.get('base_model', '')}:{team}:{spec.get('name', '')}:{state.record['id']}"


def training_job(state: JobState, team: str) -> dict:
    """A job as Veri's API shows it."""
    job, model = state.job, _read_json(state.job.model_json)
    return {
        "id": state.record["id"],
        "object": "training_job",
        "status": state.status,
        "created_at": state.record["created_at"],
        "finished_at": state.finished_at,
        "error": state.error,
        "evaluation": _read_json(job.evaluation),
        "fine_tuned_model": fine_tuned_model(state, team),
        "parent": state.record.get("parent") or (model or {}).get("parent"),
        "flow_run_id": state.record["flow_run_id"],
    }


def _read_json(path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


async def _found(store: TeamStore, job_id: str) -> JobState:
    state = await job_state(store, job_id)
    if state is None:
        raise not_found("training job", job_id)
    return state


def team_store(request: Request) -> TeamStore:
    """The request's team's store (`grpoflow.api.app.authenticated` found the team)."""
    return request.state.store


Store = Annotated[TeamStore, Depends(team_store)]


@router.post("", status_code=201)
async def create(request: Request, spec: Annotated[dict, Body()], store: Store) -> dict:
    """Starts a job from a spec (Veri's hyperparameter names; `dataset` may name an uploaded file id)."""
    checked, parent = checked_spec(spec, request.app.state.settings, store)
    record = await start_job(checked, request.app.state.settings, store, parent)
    return training_job(await _found(store, record["id"]), store.team)


@router.get("")
async def list_jobs(store: Store) -> dict:
    """The team's jobs, newest first."""
    states = [await job_state(store, record["id"]) for record in store.jobs()]
    return {"object": "list", "data": [training_job(s, store.team) for s in states if s is not None]}


@router.get("/{job_id}")
async def get(job_id: str, store: Store) -> dict:
    """One job: its status, error, held-out scores, fine_tuned_model and parent."""
    return training_job(await _found(store, job_id), store.team)


@router.get("/{job_id}/metrics")
async def metrics(job_id: str, store: Store, keys: str | None = None) -> dict:
    """The job's metrics by step (`keys=reward,loss,...`; default all)."""
    state = await _found(store, job_id)
    records = read_metrics(state.job.metrics)
    if not keys:
        return {"metrics": records}
    wanted = [k for k in keys.split(",") if k]
    logged = {k for r in records for k in r["values"]}
    if records and (unknown := [k for k in wanted if k not in logged]):
        raise ApiError(400, f"keys: no metric {', '.join(unknown)} in this job's metrics", param="keys")
    return {"metrics": [{"step": r["step"], "values": {k: r["values"].get(k) for k in wanted}} for r in records]}


@router.get("/{job_id}/events")
async def events(job_id: str, store: Store) -> dict:
    """The job's events, as its events.jsonl holds them."""
    return {"object": "list", "data": (await _found(store, job_id)).events}


@router.get("/{job_id}/model")
async def model(job_id: str, store: Store) -> dict:
    """The job's trained model: adapter or full, its files and the merged model's."""
    state = await _found(store, job_id)
    found = _read_json(state.job.model_json)
    if found is None:
        raise ApiError(409, f"job {job_id} has no trained model yet (status {state.status})", code="model_not_ready")
    return found


@router.get("/{job_id}/rollouts")
async def rollouts(
    job_id: str,
    store: Store,
    step: int | None = None,
    best: int | None = None,
    worst: int | None = None,
    reward: str | None = None,
) -> dict:
    """What the model wrote: the job's kept rollouts (`grpoflow rollouts JOB_ID`), by `reward` (default the total)."""
    state = await _found(store, job_id)
    if best is not None and worst is not None:
        raise ApiError(400, "best, worst: give one of them", param="best")
    try:
        rows = select_rollouts(state.job.rollouts, step=step, best=best, worst=worst, reward=reward)
    except ValueError as e:
        raise ApiError(400, str(e).replace("--", ""), param="step" if "step" in str(e) else "reward") from None
    return {"rollouts": [rollout_record(r) for r in rows]}


class Decision(BaseModel):
    approve: bool
    note: str = ""


@router.post("/{job_id}/approve")
async def approve(job_id: str, decision: Decision, store: Store) -> dict:
    """A person's decision on a job waiting for one (evaluation.gate.approval): the paused flow run resumes with it."""
    from prefect.flow_runs import resume_flow_run

    state = await _found(store, job_id)
    if state.status != "awaiting_approval":
        raise ApiError(409, f"job {job_id} is not awaiting approval (status {state.status})", code="not_paused")
    await resume_flow_run(state.record["flow_run_id"], run_input=decision.model_dump())
    return training_job(await _found(store, job_id), store.team)


@router.post("/{job_id}/cancel")
async def cancel(job_id: str, store: Store) -> dict:
    """Cancels the job (a paused one for good)."""
    state = await _found(store, job_id)
    await cancel_job(state, store)
    return training_job(await _found(store, job_id), store.team)


@router.post("/{job_id}/pause")
async def pause(job_id: str, store: Store) -> dict:
    """Pauses a running job (409 else): its run cancelled, its checkpoints kept; status `paused`."""
    await pause_job(await _found(store, job_id), store)
    return training_job(await _found(store, job_id), store.team)


@router.post("/{job_id}/resume")
async def resume(request: Request, job_id: str, store: Store) -> dict:
    """Resumes a paused job (409 else, or `still_stopping` while its run ends): a new run from its last checkpoint."""
    await resume_job(await _found(store, job_id), request.app.state.settings, store)
    return training_job(await _found(store, job_id), store.team)
