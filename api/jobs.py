"""What both APIs do with a job: check a spec as a team's deployment run would be checked, submit it to the team's
deployment, read its state back (the Prefect flow run's, and the job folder's events), cancel, pause and resume it.

A job's status is its flow run's state (`STATUSES`; a run that ended `Rejected` is `rejected`, a Paused one waits for
a person's approval), or, once the flow run is gone from the server, its job folder's last event.

Pausing a running job cancels its flow run (the training child stops; the job folder and its checkpoints stay, as
for any cancel) and marks the team's record `paused`; resuming submits a new run of the team's deployment with the
job's own spec.yaml and its job id, which skips the stages done and trains on from the last checkpoint (the steps
after it are done again). Prefect's own pause cannot stop a training child mid-step: it pauses a flow only between
tasks, from inside the flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Cancelling

from grpoflow.api.errors import ApiError, bad_spec
from grpoflow.api.graders import endpoint_kwargs
from grpoflow.api.store import TeamStore
from grpoflow.core.graders import needs_endpoint
from grpoflow.core.jobdir import JobDir
from grpoflow.core.policy import deployment_check
from grpoflow.core.spec import JobSpec, SpecError, load_spec
from grpoflow.flows.deployments import DeploymentError, submit, team_deployment
from grpoflow.integrations.stages import REJECTED
from grpoflow.trainers.graders.python import sandbox_refusals
from grpoflow.trainers.metrics import read_events

STATUSES = {
    StateType.SCHEDULED: "queued",
    StateType.PENDING: "queued",
    StateType.RUNNING: "running",
    StateType.PAUSED: "awaiting_approval",
    StateType.COMPLETED: "succeeded",
    StateType.FAILED: "failed",
    StateType.CRASHED: "failed",
    StateType.CANCELLING: "cancelled",
    StateType.CANCELLED: "cancelled",
}
FINAL = ("succeeded", "failed", "rejected", "cancelled")  # a paused job is not done


@dataclass(frozen=True)
class Settings:
    """What `grpoflow api` was started with."""

    keys: Path
    output_uri: Path  # the teams' folders: <output_uri>/<team>/ and <output_uri>/files/<team>/
    deployment: str = "retrain"  # the deployment the teams' own copy
    project: Path = Path(".")  # where the worker runs the flows: its .grpoflow/policy.yaml applies
    max_upload_bytes: int = 512 * 1024 * 1024  # the largest file POST /v1/files takes


# --- a spec in -------------------------------------------------------------------------------------------------------


def checked_spec(
    data: dict, settings: Settings, store: TeamStore, problems: list[str] = (), names: dict[str, str] | None = None
) -> tuple[JobSpec, str | None]:
    """The spec `data` as the team's deployment run will run it, and the job it starts from (None: none): its dataset
    may name an uploaded file of the team's, its base_model an earlier job's `fine_tuned_model` (or `job:<id>`), its
    output_uri is the API's. Every problem (`problems` already found in the request, the spec's rules, then the
    operator's policy with the team's paths, names and limits) in one `bad_spec` error, its locations named as
    `names` says (see `bad_spec`)."""
    data, problems = dict(data), list(problems)
    dataset = data.get("dataset")
    if isinstance(dataset, str):
        dataset = data["dataset"] = {"uri": dataset}
    if isinstance(dataset, dict) and isinstance(uri := dataset.get("uri"), str) and uri.startswith("file-"):
        record = store.file(uri)
        if record is None:
            problems.append(f"dataset.uri: no uploaded file {uri!r} (POST /v1/files)")
        else:
            data["dataset"] = {**dataset, "uri": str(store.file_path(record))}
    problems += _model_grader_endpoints(data, settings)
    parent = parent_job(data.get("base_model"), store.team)
    if parent is not None:
        merged = store.job_dir(parent).merged if store.job(parent) else None
        if merged is None or not merged.is_dir():
            problems.append(f"base_model: no job {parent!r} of yours with a trained model to start from")
        else:
            data["base_model"] = str(merged)
    if data.get("output_uri") not in (None, str(settings.output_uri)):
        problems.append(f"output_uri: set by the API ({settings.output_uri}/<team>); leave it out")
    data["output_uri"] = str(settings.output_uri)
    try:
        spec = load_spec(data)[0]
    except SpecError as e:
        raise bad_spec(problems + e.problems, names) from None
    problems += deployment_check(spec, settings.project, store.team) + sandbox_refusals(spec)
    if problems:
        raise bad_spec(problems, names)
    return spec, parent


def _model_grader_endpoints(data: dict, settings: Settings) -> list[str]:
    """Gives each rewards entry whose grader asks an endpoint (a model grader, cosine) and names none the operator's
    (the policy's `from_deployments.model_graders`); returns the problem of each such entry when the operator set
    none."""
    if not isinstance(rewards := data.get("rewards"), list):
        return []
    data["rewards"], problems = list(rewards), []
    for i, entry in enumerate(rewards):
        kwargs = entry.get("kwargs") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not needs_endpoint(entry.get("grader")) or "base_url" in (kwargs or {}):
            continue
        endpoint, why = endpoint_kwargs(settings)
        if why:
            problems.append(f"rewards[{i}].grader: {why}")
        else:
            data["rewards"][i] = {**entry, "kwargs": {**(kwargs if isinstance(kwargs, dict) else {}), **endpoint}}
    return problems


def parent_job(model, team: str) -> str | None:
    """The job id a base_model names, as `job:<id>` or as a job's `ft:<base>:<team>:<name>:<id>` (another team's
    name: the id alone, which the team then does not have); None for any other model."""
    if not isinstance(model, str):
        return None
    if model.startswith("job:"):
        return model.removeprefix("job:")
    if model.startswith("ft:") and model.count(":") >= 4:
        _, owner, _, job_id = model.rsplit(":", 3)
        return job_id if owner == team else f"{owner}:{job_id}"
    return None


async def start_job(
    spec: JobSpec, settings: Settings, store: TeamStore, parent: str | None = None, openai: dict | None = None
) -> dict:
    """Submits `spec` to the team's deployment; returns the team's record of the job (its id is the flow run's name,
    grpoflow's job id)."""
    try:
        deployment = await team_deployment(store.team, settings.deployment)
        flow_run = await submit(spec, deployment, team=store.team)
    except DeploymentError as e:
        raise ApiError(502, str(e), code="deployment_error") from None
    # A job started from an earlier one's model names the model that one started from (OpenAI's `ft:` names do).
    root = (store.job(parent) or {}).get("spec", {}).get("base_model") if parent else None
    summary = {"name": spec.name, "base_model": root or spec.base_model}
    return store.add_job(flow_run.name, str(flow_run.id), spec=summary, parent=parent, openai=openai)


# --- a job out -------------------------------------------------------------------------------------------------------


@dataclass
class JobState:
    """A job as the API reports it: its record, flow run (None when gone from the server) and job folder."""

    record: dict
    flow_run: object | None
    job: JobDir

    @property
    def events(self) -> list[dict]:
        return read_events(self.job.events)

    @property
    def status(self) -> str:
        status = self._run_status
        return "paused" if status == "cancelled" and self.record.get("paused") else status

    @property
    def _run_status(self) -> str:
        state = self.flow_run.state if self.flow_run is not None else None
        if state is not None:
            if state.type == StateType.FAILED and state.name == REJECTED:
                return "rejected"
            return STATUSES.get(state.type, "queued")
        return _status_from_events(self.events)

    @property
    def error(self) -> dict | None:
        """What ended a failed, rejected or cancelled job: {code, message}."""
        status = self.status
        if status not in ("failed", "rejected", "cancelled"):
            return None
        ended = [e["payload"] for e in self.events if e["event"] == "grpoflow.job.failed"]
        message = (ended[-1].get("error") if ended else None) or (self.flow_run and self.flow_run.state.message)
        return {"code": status, "message": message or status, "param": None}

    @property
    def finished_at(self) -> int | None:
        end = getattr(self.flow_run, "end_time", None)
        return int(end.timestamp()) if end is not None and self.status in FINAL else None


def _status_from_events(events: list[dict]) -> str:
    status = "queued"
    for record in events:
        if record["event"] == "grpoflow.job.started":
            status = "running"
        elif record["event"] == "grpoflow.job.completed":
            status = "succeeded"
        elif record["event"] == "grpoflow.job.failed":
            reason = (record.get("payload") or {}).get("reason")
            status = reason if reason in ("rejected", "cancelled") else "failed"
    return status


async def job_state(store: TeamStore, job_id: str) -> JobState | None:
    """The team's job `job_id`, or None when the team has none of that id."""
    record = store.job(job_id)
    if record is None:
        return None
    async with get_client() as client:
        try:
            flow_run = await client.read_flow_run(record["flow_run_id"])
        except ObjectNotFound:
            flow_run = None
    return JobState(record, flow_run, store.job_dir(job_id))


async def cancel_job(state: JobState, store: TeamStore) -> None:
    """Cancels the job's flow run through Prefect: one still waiting in its queue ends Cancelled at once; a running
    one goes Cancelling, and its worker stops its process (the job ends failed with reason `cancelled`). A paused job
    is cancelled for good (it can no longer be resumed)."""
    if state.record.get("paused"):
        state.record = store.update_job(state.record["id"], paused=False)
    await _cancel_run(state)


async def _cancel_run(state: JobState) -> None:
    run = state.flow_run
    if run is None or run.state is None or run.state.is_final():
        return
    waiting = run.state.type in (StateType.SCHEDULED, StateType.PENDING) and run.infrastructure_pid is None
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelled() if waiting else Cancelling(), force=True)


async def pause_job(state: JobState, store: TeamStore) -> None:
    """Pauses a running job: its flow run cancelled, its checkpoints kept, the record marked `paused`."""
    if state.status != "running":
        raise ApiError(409, f"job {state.record['id']} is not running (status {state.status}); only a running job "
                       "can be paused", code="not_running")  # fmt: skip
    state.record = store.update_job(state.record["id"], paused=True)
    await _cancel_run(state)


async def resume_job(state: JobState, settings: Settings, store: TeamStore) -> None:
    """Resumes a paused job: a new run of the team's deployment with the job's spec.yaml and id, from its last
    checkpoint; the record then follows that run."""
    job_id = state.record["id"]
    if state.status != "paused":
        raise ApiError(409, f"job {job_id} is not paused (status {state.status})", code="not_paused")
    if state.flow_run is not None and not state.flow_run.state.is_final():
        raise ApiError(409, f"job {job_id} is still stopping; resume it once its status reads paused and its run "
                       "has ended (a few seconds)", code="still_stopping")  # fmt: skip
    if not state.job.spec.is_file():
        raise ApiError(409, f"job {job_id} was paused before it started: nothing to resume; create it again",
                       code="nothing_to_resume")  # fmt: skip
    try:
        spec = resumed_spec(state.job, settings)
        flow_run = await submit(spec, await team_deployment(store.team, settings.deployment), store.team, job_id)
    except SpecError as e:
        said = "; ".join(e.problems)
        raise ApiError(409, f"job {job_id}'s spec.yaml no longer loads: {said}", code="bad_spec") from None
    except DeploymentError as e:
        raise ApiError(502, str(e), code="deployment_error") from None
    state.record = store.update_job(job_id, flow_run_id=str(flow_run.id), paused=False)


def resumed_spec(job: JobDir, settings: Settings) -> JobSpec:
    """The spec that resumes `job`: its spec.yaml, with the API's output_uri (the flow puts the team's folder under
    it again, where the job is).

    Raises:
        SpecError: the spec.yaml no longer loads.
    """
    data = yaml.safe_load(job.spec.read_text())
    return load_spec({**data, "output_uri": str(settings.output_uri)})[0]
