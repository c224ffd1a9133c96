"""`grpo-pipeline/resume`: a run of grpoflow's deployments that ends `Crashed` (its process killed, its machine lost)
is resumed from its last checkpoint, at most `GRPOFLOW_AUTO_RESUME` times per job (default 2).

The deployment's trigger (deployments/prefect.yaml) starts this flow on each `prefect.flow-run.Crashed` event of a
`grpo-pipeline` run. It starts a run of the crashed run's own deployment with the same parameters and the job's id as
`job_id` (the retrain form's field: a resume), named `<job id>-resume-<n>`; that run emits `grpoflow.job.resumed`
once it holds the job, and the stages skip what the job's folder shows done, training going on from its newest
checkpoint. A job resumed that many times is left `Crashed`: this flow's log says so, and the job ends with
`grpoflow.job.failed` (reason `crashed`). By hand:

    prefect deployment run grpo-pipeline/resume --param flow_run=<crashed flow run id>
"""

import os
import re
from uuid import UUID

from prefect import flow, get_client, get_run_logger
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.states import Completed, State

from grpoflow.integrations import webhooks
from grpoflow.integrations.events import emit
from grpoflow.integrations.job_folders import BadJobReference, UnknownJob, find_job
from grpoflow.tasks.bookkeeping import WEBHOOK_FLUSH_S

AUTO_RESUME_ENV = "GRPOFLOW_AUTO_RESUME"
DEFAULT_AUTO_RESUME = 2
LIVE = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED, StateType.CANCELLING]


def max_resumes() -> int:
    """`GRPOFLOW_AUTO_RESUME`: how many times one job is resumed after a crash (0: never)."""
    value = os.environ.get(AUTO_RESUME_ENV, str(DEFAULT_AUTO_RESUME))
    try:
        return max(int(value), 0)
    except ValueError:
        raise ValueError(f"{AUTO_RESUME_ENV}={value!r}: a whole number of resumes, e.g. 2 (0: never)") from None


def resume_name(job_id: str, n: int) -> str:
    """The name of the `n`-th automatic resume of `job_id`'s run."""
    return f"{job_id}-resume-{n}"


def resume_number(run_name: str | None, job_id: str) -> int | None:
    """`n` when `run_name` is `resume_name(job_id, n)`, else None."""
    found = re.fullmatch(re.escape(job_id) + r"-resume-(\d+)", run_name or "")
    return int(found[1]) if found else None


def _run_id(flow_run: str) -> UUID:
    return UUID(flow_run.removeprefix("prefect.flow-run."))


@flow(name="grpo-pipeline", flow_run_name="resume {flow_run}")
def resume_crashed(flow_run: str | None = None) -> State:
    """Resumes the job of the crashed `grpo-pipeline` run `flow_run` from its last checkpoint, within the bound.

    Args:
        flow_run (`str`, *optional*): the crashed flow run's id (or its event resource id, `prefect.flow-run.<id>`),
            which the trigger passes; without one there is nothing to resume.
    """
    logger = get_run_logger()
    if not flow_run:
        logger.info("no flow run given: nothing to resume (the trigger passes the crashed run)")
        return Completed(message="no flow run given", name="NotResumed")
    with get_client(sync_client=True) as client:
        crashed = client.read_flow_run(_run_id(flow_run))
        if why := _not_resumed(client, crashed):
            logger.info("flow run %s (%s): nothing to resume: %s", crashed.name, crashed.id, why)
            return Completed(message=why, name="NotResumed")
        job_id = crashed.parameters.get("job_id") or crashed.name  # the pipeline names its run after its job
        done = _resumes_so_far(client, crashed.deployment_id, job_id)
        if done >= (limit := max_resumes()):
            message = (
                f"job {job_id} crashed again and stays Crashed: it was resumed {done} times already, the most "
                f"{AUTO_RESUME_ENV}={limit} allows; a run of its deployment with job_id {job_id} (the form's field), "
                f"or `grpoflow run SPEC --resume {job_id}`, goes on from its last checkpoint"
            )
            logger.error("%s", message)
            _announce_given_up(job_id, message)
            return Completed(message=message, name="ResumeLimit")
        resumed = client.create_flow_run_from_deployment(
            crashed.deployment_id,
            parameters={**crashed.parameters, "job_id": job_id},
            name=resume_name(job_id, done + 1),
            tags=crashed.tags,
            job_variables=crashed.job_variables or None,
            idempotency_key=f"grpoflow-resume-{crashed.id}",  # one resume per crash, however often the trigger fires
        )
    message = f"job {job_id} resumed as {resumed.name} ({done + 1} of {limit}) after flow run {crashed.name} crashed"
    logger.info("%s", message)
    return Completed(message=message)


def _not_resumed(client, crashed) -> str | None:
    """Why `crashed` is not for this flow to resume, else None."""
    if crashed.state is None or crashed.state.type != StateType.CRASHED:
        return f"it is {crashed.state.name if crashed.state else 'without a state'} now, not Crashed"
    if crashed.deployment_id is None:
        return "it is no deployment's run (`grpoflow run` resumes with --resume)"
    try:
        deployment = client.read_deployment(crashed.deployment_id)
    except ObjectNotFound:
        return "its deployment is gone"
    if deployment.entrypoint and deployment.entrypoint.endswith(":resume_crashed"):
        return "it is a run of grpo-pipeline/resume itself"
    job_id = crashed.parameters.get("job_id") or crashed.name
    # A resume started by hand (`--resume`, which sets the earlier run Crashed once it holds the job) already runs it.
    live = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(like_=job_id), state=FlowRunFilterState(type=FlowRunFilterStateType(any_=LIVE))
        )
    )
    if others := [r.name for r in live if r.id != crashed.id and r.name.startswith(job_id)]:
        return f"job {job_id} runs again already ({', '.join(others)})"
    return None


def _announce_given_up(job_id: str, message: str) -> None:
    """Ends the job failed (`grpoflow.job.failed`, reason `crashed`; its webhooks too) where its folder is found on
    this machine (the job index: `grpoflow metrics JOB_ID` finds it the same way); nothing had announced its end."""
    try:
        job, _ = find_job(job_id)
    except (UnknownJob, BadJobReference) as e:
        get_run_logger().warning("job %s: no grpoflow.job.failed sent, no folder of it here: %s", job_id, e)
        return
    webhooks.resend(job)  # what the crashed runs left undelivered, first, in order
    emit(job, "grpoflow.job.failed", {"reason": "crashed", "error": message[-2000:]})
    webhooks.flush(timeout=WEBHOOK_FLUSH_S)


def _resumes_so_far(client, deployment_id, job_id: str) -> int:
    """How many automatic resumes of `job_id` were started (its runs named `<job id>-resume-<n>`)."""
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{job_id}-resume-")))
    return len({resume_number(r.name, job_id) for r in runs} - {None})
