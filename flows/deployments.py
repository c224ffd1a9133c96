"""Deploying grpoflow to a Prefect server and submitting jobs to it (`grpoflow deployments apply`, `grpoflow submit`).

`apply` deploys a project (`grpoflow init DIR` writes one; grpoflow's checkout is one too, under deployments/): it
creates the work pools of its work-pools/pools.yaml that the server lacks (and their queues), then runs
`prefect deploy --all` on its prefect.yaml from the project folder, which is where workers will run the flows. The
deployments' entrypoints are module paths (`grpoflow.flows.pipeline:grpo_pipeline`), found in grpoflow however it was
installed. `submit` validates a spec locally (a rejected spec never reaches the server), then starts a run of a
deployment of the `grpo-pipeline` flow with the spec as its `spec` parameter.

    PREFECT_API_URL=http://127.0.0.1:4200/api grpoflow deployments apply
    grpoflow submit examples/arithmetic.yaml --deployment retrain --wait
"""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES
from prefect.utilities.urls import url_for

from grpoflow.core.jobdir import new_job_id
from grpoflow.core.spec import JobSpec

# grpoflow's own checkout, a project too (its prefect.yaml is under deployments/); `apply` deploys the current folder.
PROJECT_DIR = Path(__file__).resolve().parent.parent
DEPLOYMENTS_DIR = PROJECT_DIR / "deployments"
POOLS_FILE = DEPLOYMENTS_DIR / "work-pools" / "pools.yaml"
PREFECT_FILE = DEPLOYMENTS_DIR / "prefect.yaml"
FLOW_NAME = "grpo-pipeline"
# The repository the image is pushed to (prefect.yaml's build step), e.g. registry.example.com/ml/grpoflow.
IMAGE_ENV = "GRPOFLOW_IMAGE"


class DeploymentError(Exception):
    """The server refused, or lacks what the command needs: one message, exit code 1."""


class ServerNotSet(DeploymentError):
    """PREFECT_API_URL is unset: the user's mistake, exit code 2."""


def api_url() -> str:
    """The server everything goes to; an ephemeral server would vanish with this process, so it must be set."""
    url = PREFECT_API_URL.value()
    if not url:
        raise ServerNotSet(
            "PREFECT_API_URL is not set: point it at your Prefect server, e.g. "
            "`export PREFECT_API_URL=http://127.0.0.1:4200/api` (see `prefect server start`)"
        )
    return url


# What Prefect's client retries by itself (`prefect.client.base`, for every call grpoflow makes through it: submit,
# apply, events, artifacts): HTTP 429, 502 and 503, which is what a SQLite server answers for "database is locked",
# PREFECT_CLIENT_MAX_RETRIES times (default 5) with exponential backoff (2, 4, 8 ... s) and jitter. grpoflow adds no
# loop of its own; `server_calls` only words what is left once those retries are spent.
BUSY_CODES = (429, 502, 503)


@contextlib.contextmanager
def server_calls(url: str):
    """Inside: calls to the Prefect server at `url`. A server that does not answer, or that is still busy after
    Prefect's client retried, ends the command with one line saying what to do (`DeploymentError`, exit code 1)."""
    try:
        yield
    except httpx.ConnectError:
        raise DeploymentError(
            f"no Prefect server answers at {url}: start one with `prefect server start`, or set PREFECT_API_URL to "
            "the API of a running one"
        ) from None
    except PrefectHTTPStatusError as e:
        if e.response.status_code not in BUSY_CODES:
            raise
        raise DeploymentError(busy_message(url, e.response)) from None


def busy_message(url: str, response: httpx.Response) -> str:
    """What a command or the jobs API says of a Prefect server that still answered `response` (one of `BUSY_CODES`)
    once Prefect's client had retried."""
    return (
        f"the Prefect server at {url} is busy (HTTP {response.status_code} {response.reason_phrase}) after "
        f"{PREFECT_CLIENT_MAX_RETRIES.value()} retries (PREFECT_CLIENT_MAX_RETRIES); try again, and for many "
        "runs at once give the server PostgreSQL (PREFECT_API_DATABASE_CONNECTION_URL) rather than SQLite"
    )


# --- apply -----------------------------------------------------------------------------------------------------------


def load_pools(path: Path = POOLS_FILE) -> list[dict]:
    """The pools file, each pool's `base_job_template` file name replaced by the template it holds (or None)."""
    pools = yaml.safe_load(path.read_text())
    for pool in pools:
        template = pool.get("base_job_template")
        pool["base_job_template"] = json.loads((path.parent / template).read_text()) if template else None
    return pools


async def default_template(pool_type: str) -> dict:
    """The base job template Prefect gives a pool of `pool_type`, as `prefect work-pool create` does: the installed
    worker's, else the one the server's collections registry knows."""
    from prefect.workers.utilities import get_default_base_job_template_for_infrastructure_type

    template = await get_default_base_job_template_for_infrastructure_type(pool_type)
    if template is None:
        raise DeploymentError(f"no Prefect worker for pool type {pool_type!r} is installed here; install its package")
    return template


# The job variables no run may set: a command of its own, the worker's environment (which could hold the settings of
# the policy or a PYTHONPATH), the folder the flow runs in (whose .grpoflow/policy.yaml and modules apply).
LOCKED_VARIABLES = ("command", "env", "working_dir")


def locked_template(template: dict) -> dict:
    """`template` without the variables of `LOCKED_VARIABLES` and every place that fills one in: a pool created from
    it offers a run no way to set them (Prefect lets a run override any variable its pool's template has)."""
    placeholders = {f"{{{{ {name} }}}}" for name in LOCKED_VARIABLES}

    def without(value):
        if isinstance(value, dict):
            return {k: without(v) for k, v in value.items() if not (isinstance(v, str) and v in placeholders)}
        return [without(v) for v in value] if isinstance(value, list) else value

    variables = dict(template.get("variables", {}))
    variables["properties"] = {k: v for k, v in variables.get("properties", {}).items() if k not in LOCKED_VARIABLES}
    if "required" in variables:
        variables["required"] = [k for k in variables["required"] if k not in LOCKED_VARIABLES]
    return {**template, "job_configuration": without(template["job_configuration"]), "variables": variables}


async def ensure_pools(pools: list[dict]) -> list[str]:
    """Creates the pools (and queues) the server lacks; returns one line per pool saying what was done."""
    lines = []
    async with get_client() as client:
        for pool in pools:
            name = pool["name"]
            try:
                await client.read_work_pool(name)
                done = "exists, left as it is"
            except ObjectNotFound:
                template = locked_template(pool["base_job_template"] or await default_template(pool["type"]))
                create = WorkPoolCreate(
                    name=name, type=pool["type"], description=pool.get("description"), base_job_template=template
                )
                await client.create_work_pool(create)
                done = "created"
            for queue in pool.get("queues", []):
                try:
                    await client.read_work_queue_by_name(queue["name"], work_pool_name=name)
                except ObjectNotFound:
                    await client.create_work_queue(
                        name=queue["name"], work_pool_name=name, concurrency_limit=queue.get("concurrency_limit")
                    )
            lines.append(f"work pool {name} ({pool['type']}): {done}")
    return lines


def image_deployments(prefect_file: Path = PREFECT_FILE) -> list[str]:
    """The deployments of `prefect_file` that build and push the image (their own `build` steps: the -k8s ones)."""
    return [d["name"] for d in yaml.safe_load(prefect_file.read_text())["deployments"] if d.get("build")]


def deploy_all(prefect_file: Path = PREFECT_FILE, project_dir: Path = PROJECT_DIR) -> str:
    """`prefect deploy` of every deployment of `prefect_file`, run from `project_dir`; returns its output.

    The deployments that build the image are left out while GRPOFLOW_IMAGE (the repository to push it to) is unset,
    so a project on one machine deploys without Docker or a registry.
    """
    # prefect.yaml's working directory is `{{ $PWD }}`, filled in by `prefect deploy`; a subprocess's cwd alone
    # does not set PWD.
    project = str(project_dir.resolve())
    env = {**os.environ, "PWD": project, "GRPOFLOW_PROJECT_DIR": project, "PREFECT_API_URL": api_url()}
    skipped = [] if os.environ.get(IMAGE_ENV) else image_deployments(prefect_file)
    names = [d["name"] for d in yaml.safe_load(prefect_file.read_text())["deployments"] if d["name"] not in skipped]
    which = ["--all"] if not skipped else [arg for name in names for arg in ("--name", name)]
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", *which, "--prefect-file", str(prefect_file)]
    proc = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DeploymentError(f"`prefect deploy` failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


async def describe_deployments(prefect_file: Path = PREFECT_FILE) -> list[str]:
    """One line per deployment of `prefect_file` as the server now has it, with its schedules and triggers."""
    config = yaml.safe_load(prefect_file.read_text())
    triggers = {d["name"]: d.get("triggers", []) for d in config["deployments"]}
    lines = []
    async with get_client() as client:
        for deployment in await client.read_deployments():
            if deployment.name not in triggers:
                continue
            flow = await client.read_flow(deployment.flow_id)
            how = [_schedule_text(s.schedule) for s in deployment.schedules]
            how += [f"trigger on {', '.join(t['expect'])}" for t in triggers[deployment.name]]
            lines.append(f"deployment {flow.name}/{deployment.name}: {'; '.join(how) or 'run on demand'}")
    if not os.environ.get(IMAGE_ENV):
        for name in image_deployments(prefect_file):
            lines.append(f"deployment {name}: not deployed; set {IMAGE_ENV} (the image repository) to deploy it")
    return sorted(lines)


WATCH_ENTRYPOINT = "grpoflow.flows.watch:watch_new_data"


async def start_watchers(prefect_file: Path = PREFECT_FILE) -> list[str]:
    """Starts a run of each scheduled watcher deployment of `prefect_file` now, unless one is already scheduled to
    start within its interval's first minute or is running; returns one line per watcher.

    An interval schedule is anchored at deploy time, so Prefect's first scheduled run of a deployment that runs
    hourly comes an hour after `apply`: a file dropped in right after deploying would wait that long.
    """
    config = yaml.safe_load(prefect_file.read_text())
    names = [d["name"] for d in config["deployments"] if d["entrypoint"] == WATCH_ENTRYPOINT and d.get("schedules")]
    lines = []
    async with get_client() as client:
        for deployment in await client.read_deployments():
            if deployment.name not in names or deployment.paused:
                continue
            flow = await client.read_flow(deployment.flow_id)
            soon = [r for r in await _runs_of(client, deployment.id) if _starts_within(r, seconds=60)]
            if soon:
                lines.append(f"watcher {flow.name}/{deployment.name}: looking already ({soon[0].name})")
                continue
            run = await client.create_flow_run_from_deployment(deployment.id)
            lines.append(f"watcher {flow.name}/{deployment.name}: first look now (flow run {run.name})")
    return lines


async def _runs_of(client, deployment_id) -> list:
    live = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED]
    flt = FlowRunFilter(
        deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live)),
    )
    return await client.read_flow_runs(flow_run_filter=flt)


def _starts_within(flow_run, seconds: float) -> bool:
    """Running already, or scheduled to start at most `seconds` from now."""
    if not flow_run.state.is_scheduled():
        return True
    start = flow_run.next_scheduled_start_time or flow_run.expected_start_time
    return start is not None and (start - datetime.now(UTC)).total_seconds() <= seconds


def _schedule_text(schedule) -> str:
    if getattr(schedule, "cron", None):
        return f"cron {schedule.cron} ({schedule.timezone or 'UTC'})"
    if getattr(schedule, "interval", None):
        return f"every {schedule.interval.total_seconds():g} s"
    return str(schedule)


# --- submit ----------------------------------------------------------------------------------------------------------


def deployment_name(name: str) -> str:
    return name if "/" in name else f"{FLOW_NAME}/{name}"


def run_parameters(spec: JobSpec, team: str | None = None) -> dict:
    """The flow parameters `submit` sends: the spec as written (the worker fills in the defaults, so a newer grpoflow
    here, with a new optional field, still submits to a deployment made by an older one), and the team, if any."""
    parameters = {"spec": spec.model_dump(mode="json", exclude_unset=True)}
    return {**parameters, "team": team} if team else parameters


def run_job_variables(spec: JobSpec, base_job_template: dict) -> dict:
    """The job variables `submit` sends: `gpu_count` from the spec, when the pool's template has it (the Kubernetes
    pool's does: the pod requests as many GPUs as the job trains on)."""
    if "gpu_count" in base_job_template.get("variables", {}).get("properties", {}):
        return {"gpu_count": spec.gpu_count}
    return {}


async def submit(spec: JobSpec, deployment: str = "retrain", team: str | None = None, job_id: str | None = None):
    """Starts a run of `deployment` with `spec` (already validated) as its `spec` parameter, and `team` as its `team`
    (which the flow refuses unless it is the deployment's own: `team_deployment` finds a team's); returns the flow run.
    With `job_id`, the run resumes that job (its spec.yaml must be `spec`) from its last checkpoint.

    The pool's `gpu_count` job variable, when its base job template has one (the Kubernetes pool's does), is set from
    the spec, so the pod requests as many GPUs as the job trains on. The run is named after its job id at once (the
    name the flow gives itself when it starts), so a run waiting in the queue shows it too, not Prefect's random name.
    """
    name, url = deployment_name(deployment), api_url()
    async with get_client() as client:
        try:
            found = await client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise DeploymentError(f"no deployment {name} on {url}; run `grpoflow deployments apply`") from None
        spec_schema = json.dumps(found.parameter_openapi_schema.get("properties", {}).get("spec", {}))
        if "JobSpec" not in spec_schema:
            raise DeploymentError(
                f"deployment {name} takes a spec file on the worker, not a spec object; start it with "
                f"`prefect deployment run {name} --param spec=PATH`, or submit to grpo-pipeline/retrain"
            )
        job_variables = await pool_job_variables(client, found, spec)
        try:
            parameters = {**run_parameters(spec, team), **({"job_id": job_id} if job_id else {})}
            flow_run = await client.create_flow_run_from_deployment(
                found.id, parameters=parameters, job_variables=job_variables or None
            )
        except PrefectHTTPStatusError as e:
            if e.response.status_code in BUSY_CODES or e.response.status_code >= 500:
                raise  # not the run's parameters: `server_calls` words it
            detail = e.response.json().get("detail", str(e))
            raise DeploymentError(
                f"the server refused the run of {name}: {detail}\n(if grpoflow's spec changed since the deployment "
                "was made, run `grpoflow deployments apply` again)"
            ) from None
        if job_id:
            await client.update_flow_run(flow_run.id, name=job_id)
            return flow_run.model_copy(update={"name": job_id})
        return await name_after_job(client, flow_run, spec.name)


async def team_deployment(team: str, base: str = "retrain") -> str:
    """The name of a deployment of `grpo-pipeline` whose `team` parameter is `team`: the operator's own if one exists
    (prefect.yaml), else `<base>-<team>`, made now as a copy of `base` (its pool, queue, pull steps, schema) with that
    team. A run keeps its deployment's team (`grpoflow.flows.admission`), so a team's runs need a deployment of it."""
    name = deployment_name(base)
    async with get_client() as client:
        try:
            found = await client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise DeploymentError(f"no deployment {name} on {api_url()}; run `grpoflow deployments apply`") from None
        for deployment in await client.read_deployments():
            if deployment.flow_id == found.flow_id and (deployment.parameters or {}).get("team") == team:
                return f"{FLOW_NAME}/{deployment.name}"
        await client.create_deployment(
            flow_id=found.flow_id,
            name=f"{found.name}-{team}",
            description=f"{found.description or ''} Team {team}'s runs (a copy of {found.name}).".strip(),
            parameters={**(found.parameters or {}), "team": team},
            work_pool_name=found.work_pool_name,
            work_queue_name=found.work_queue_name,
            tags=found.tags,
            path=found.path,
            entrypoint=found.entrypoint,
            parameter_openapi_schema=found.parameter_openapi_schema,
            pull_steps=found.pull_steps,
            enforce_parameter_schema=found.enforce_parameter_schema,
            job_variables=found.job_variables,
        )
    return f"{FLOW_NAME}/{found.name}-{team}"


async def pool_job_variables(client, deployment, spec: JobSpec) -> dict:
    """`run_job_variables` for the work pool of `deployment` (a `DeploymentResponse`); none without a pool."""
    if not deployment.work_pool_name:
        return {}
    pool = await client.read_work_pool(deployment.work_pool_name)
    return run_job_variables(spec, pool.base_job_template)


async def name_after_job(client, flow_run, name: str):
    """Renames a flow run just created to the job id its flow will take when it starts (`new_job_id` from the run's
    id and expected start time: `grpo_pipeline`'s `job_run_name`); returns the run with that name."""
    job_id = new_job_id(name, flow_run.id, flow_run.expected_start_time)
    try:
        await client.update_flow_run(flow_run.id, name=job_id)
    except PrefectHTTPStatusError as e:
        # Still busy after the client's retries: the run exists, and failing now would have the user submit it again
        # (two runs); it takes the name when its flow starts
        if e.response.status_code not in BUSY_CODES:
            raise
    return flow_run.model_copy(update={"name": job_id})


async def wait_for(flow_run_id, poll_s: float = 2.0):
    """Polls the flow run until it reaches a final state; returns it."""
    async with get_client() as client:
        while True:
            flow_run = await client.read_flow_run(flow_run_id)
            if flow_run.state and flow_run.state.is_final():
                return flow_run
            await asyncio.sleep(poll_s)


def flow_run_url(flow_run) -> str:
    return url_for(flow_run) or f"{api_url().removesuffix('/api')}/runs/flow-run/{flow_run.id}"
