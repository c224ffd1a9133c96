"""The Kubernetes deployments of deployments/prefect.yaml (retrain-k8s, nightly-k8s, on-new-data-k8s), run the way the
grpo-k8s pool's worker runs them, without a cluster: each is made on a real Prefect server (loopback) as `prefect
deploy` makes it, a flow run is started each way a run starts (the UI's Run and Custom run, `grpoflow submit`, the
trigger's action, the schedule), the worker's Job manifest is rendered for it by prefect-kubernetes' own code
(`KubernetesWorkerJobConfiguration.resolve_for_flow_run`), and every manifest is validated offline against the
Kubernetes API's OpenAPI schema (kubernetes-validate, strict: an unknown field is an error, as with `kubectl apply
--validate=strict`)."""

import asyncio
import copy
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint
from prefect.server.events.actions import RunDeployment
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate
from prefect.utilities.templating import apply_values
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

from grpoflow.core.spec import load_spec
from grpoflow.flows.deployments import (
    PREFECT_FILE,
    PROJECT_DIR,
    deploy_all,
    describe_deployments,
    ensure_pools,
    load_pools,
    run_job_variables,
    submit,
)
from grpoflow.flows.sweep import start_job_run
from grpoflow.tasks.bookkeeping import new_job_id

GPU = "nvidia.com/gpu"
POOL = "grpo-k8s"
K8S = ("retrain-k8s", "nightly-k8s", "on-new-data-k8s")
# The API versions every manifest must be valid for: an old one still served by the big clouds, and the newest known.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# What the build step returns (prefect-docker's build_docker_image): its outputs fill in `{{ build-image.* }}`.
IMAGE = "registry.example.com/ml/grpoflow:20261201-120000"
STEP_OUTPUTS = {
    "build-image": {"image": IMAGE, "image_name": "registry.example.com/ml/grpoflow", "tag": "20261201-120000"}
}
S3_KEYS = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
}


def deployed(entry: dict) -> dict:
    """A prefect.yaml deployment as `prefect deploy` sends it: build-step outputs templated in, the triggers'
    parameters left for the server to fill from the event (prefect/cli/deploy/_core.py does the same)."""
    entry = copy.deepcopy(entry)
    triggers = entry.pop("triggers", None)
    entry = apply_values(entry, STEP_OUTPUTS, warn_on_notset=True, skip_prefixes=["ctx."])
    return entry | ({"triggers": triggers} if triggers else {})


@pytest.fixture(scope="module")
def entries() -> dict[str, dict]:
    config = yaml.safe_load(PREFECT_FILE.read_text())
    return {d["name"]: deployed(d) for d in config["deployments"] if d["name"] in K8S}


@pytest.fixture(scope="module")
def server(prefect_server, entries) -> dict[str, uuid.UUID]:
    """The grpo-k8s pool (created by `apply`'s own code) and the three deployments on the test server."""

    async def make() -> dict[str, uuid.UUID]:
        await ensure_pools([p for p in load_pools() if p["name"] == POOL])
        ids = {}
        async with get_client() as client:
            for name, entry in entries.items():
                flow = load_flow_from_entrypoint(entry["entrypoint"])
                schedules = [
                    DeploymentScheduleCreate(schedule=CronSchedule(**s), active=True)
                    for s in entry.get("schedules", [])
                ]
                ids[name] = await client.create_deployment(
                    flow_id=await client.create_flow_from_name(flow.name),
                    name=name,
                    entrypoint=entry["entrypoint"],
                    work_pool_name=entry["work_pool"]["name"],
                    work_queue_name=entry["work_pool"]["work_queue_name"],
                    job_variables=entry["work_pool"]["job_variables"],
                    parameters=entry["parameters"],
                    parameter_openapi_schema=parameter_schema(flow).model_dump_for_openapi(),
                    enforce_parameter_schema=entry["enforce_parameter_schema"],
                    pull_steps=entry["pull"],
                    schedules=schedules,
                )
        return ids

    return asyncio.run(make())


async def job_manifest(flow_run_id: uuid.UUID) -> tuple[dict, FlowRun]:
    """The Job the grpo-k8s worker would create for this flow run, and the run."""
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
        deployment = await client.read_deployment(flow_run.deployment_id)
        pool = await client.read_work_pool(POOL)
        config = await KubernetesWorkerJobConfiguration.resolve_for_flow_run(
            flow_run, client=client, work_pool=pool, worker_name="offline-check", deployment=deployment
        )
        return config.job_manifest, flow_run


def run_spec(flow_run: FlowRun, tmp_path: Path):
    """The job spec the run trains on: its `spec` object, or the spec file the image holds."""
    params = flow_run.parameters
    if isinstance(params.get("spec"), dict):
        path = tmp_path / f"{flow_run.id}.yaml"
        path.write_text(yaml.safe_dump(params["spec"]))
        return load_spec(path)[0]
    spec_file = params.get("spec") or params["default_spec"]
    overrides = [f"dataset.uri={params['dataset_uri']}"] if params.get("dataset_uri") else []
    return load_spec(PROJECT_DIR / spec_file, overrides)[0]


def check_job(manifest: dict, gpus: int) -> None:
    """What every Job must be: valid for the API, gpus GPUs requested and limited, /dev/shm in memory, the image,
    and the S3 credentials from the Secret only."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)
    assert manifest["apiVersion"] == "batch/v1" and manifest["kind"] == "Job"
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["requests"][GPU] == gpus and container["resources"]["limits"][GPU] == gpus
    assert container["image"] == IMAGE
    assert container["args"][:3] == ["prefect", "flow-run", "execute"]
    [shm] = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    by_name = {e["name"]: e for e in container["env"]}
    for key in S3_KEYS:
        assert by_name[key] == {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": "grpoflow-s3", "key": key, "optional": True}},
        }
    assert not [e for e in container["env"] if e["name"].startswith("AWS_") and "value" in e]  # never a literal


# --- each way a run starts -------------------------------------------------------------------------------------------


def test_ui_run(server, tmp_path):
    """The UI's Run: the deployment's default spec and job variables."""

    async def start():
        async with get_client() as client:
            return (await client.create_flow_run_from_deployment(server["retrain-k8s"])).id

    manifest, flow_run = asyncio.run(job_manifest(asyncio.run(start())))
    spec = run_spec(flow_run, tmp_path)
    assert spec.output_uri.startswith("s3://")  # pods share no disk
    check_job(manifest, gpus=spec.gpu_count)


def test_ui_custom_run(server, entries, tmp_path):
    """The UI's Custom run: the spec edited in the form, the GPUs in its Job Variables field."""
    spec = copy.deepcopy(entries["retrain-k8s"]["parameters"]["spec"]) | {"gpu_count": 4}

    async def start():
        async with get_client() as client:
            run = await client.create_flow_run_from_deployment(
                server["retrain-k8s"], parameters={"spec": spec}, job_variables={"gpu_count": 4}
            )
            return run.id

    manifest, flow_run = asyncio.run(job_manifest(asyncio.run(start())))
    assert run_spec(flow_run, tmp_path).gpu_count == 4
    check_job(manifest, gpus=4)


@pytest.mark.parametrize("gpus", [2, 8])
def test_submit(server, gpus):
    """`grpoflow submit SPEC --deployment retrain-k8s`: its own code, the pod's GPUs from the spec."""
    overrides = [f"gpu_count={gpus}", "output_uri=s3://grpoflow/runs"]
    spec = load_spec(PROJECT_DIR / "examples" / "arithmetic.yaml", overrides)[0]
    flow_run = asyncio.run(submit(spec, "retrain-k8s"))
    assert flow_run.name == new_job_id(spec.name, flow_run.id, flow_run.expected_start_time)  # named from the start
    manifest, flow_run = asyncio.run(job_manifest(flow_run.id))
    assert flow_run.job_variables == {"gpu_count": gpus}
    check_job(manifest, gpus=gpus)


def test_a_sweeps_runs_get_their_gpus_and_names(server):
    """A sweep on a deployment starts each job's run as `submit` does: the pod's GPUs from the spec, the job's name."""
    spec = load_spec(PROJECT_DIR / "examples" / "arithmetic.yaml", ["gpu_count=8", "output_uri=s3://grpoflow/runs"])[0]
    flow_run = asyncio.run(start_job_run(spec, "retrain-k8s"))
    manifest, flow_run = asyncio.run(job_manifest(flow_run.id))
    assert flow_run.job_variables == {"gpu_count": 8} and flow_run.name.startswith(f"{spec.name}-")
    check_job(manifest, gpus=8)


def test_submit_job_variables_follow_the_pool():
    spec = load_spec(PROJECT_DIR / "examples" / "arithmetic.yaml", ["gpu_count=4"])[0]
    [k8s] = [p for p in load_pools() if p["name"] == POOL]
    assert run_job_variables(spec, k8s["base_job_template"]) == {"gpu_count": 4}
    assert run_job_variables(spec, {"variables": {"properties": {"env": {}}}}) == {}  # a process pool: nothing


def test_trigger(server, entries, tmp_path):
    """A grpoflow.dataset.landed event: the trigger's action starts the run with the event's parameters and its own
    job variables (none: the deployment's)."""
    [trigger] = entries["on-new-data-k8s"]["triggers"]
    payload = {"uri": "s3://incoming/prompts-0001.jsonl", "size": 10, "etag": "e1"}
    event = ReceivedEvent(
        occurred=datetime.now(UTC),
        event="grpoflow.dataset.landed",
        resource={"prefect.resource.id": f"grpoflow.dataset.{payload['uri']}"},
        payload=payload,
        id=uuid.uuid4(),
    )
    parameters = dict(trigger["parameters"])
    RunDeployment._upgrade_v1_templates(parameters)
    rendered = hydrate(
        parameters, HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": event})
    )

    async def start():
        async with get_client() as client:
            run = await client.create_flow_run_from_deployment(
                server["on-new-data-k8s"], parameters=rendered, job_variables=trigger.get("job_variables")
            )
            return run.id

    manifest, flow_run = asyncio.run(job_manifest(asyncio.run(start())))
    spec = run_spec(flow_run, tmp_path)
    assert spec.dataset.uri == payload["uri"], (rendered, flow_run.parameters)
    assert spec.output_uri.startswith("s3://")
    check_job(manifest, gpus=spec.gpu_count)


def test_schedule(server, tmp_path):
    """The nightly cron: the server's own scheduler makes the runs (POST /deployments/{id}/schedule)."""

    async def scheduled():
        async with get_client() as client:
            start = datetime.now(UTC)
            response = await client._client.post(
                f"/deployments/{server['nightly-k8s']}/schedule",
                json={"start_time": start.isoformat(), "end_time": (start + timedelta(days=2)).isoformat()},
            )
            response.raise_for_status()
            deployment = await client.read_deployment(server["nightly-k8s"])
            # Filtered by the server: the module's other tests leave runs of their own, any number of them.
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])), limit=10
            )
            return [r.id for r in runs if r.deployment_id == deployment.id]

    run_ids = asyncio.run(scheduled())
    assert run_ids
    for run_id in run_ids:
        manifest, flow_run = asyncio.run(job_manifest(run_id))
        spec = run_spec(flow_run, tmp_path)
        assert spec.output_uri.startswith("s3://")
        check_job(manifest, gpus=spec.gpu_count)


# --- the validator can fail ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        # prefect-kubernetes' default template puts these in the pod spec, where Kubernetes ignores them; ours has
        # them on the Job
        lambda m: m["spec"]["template"]["spec"].update(completions=1),
        lambda m: m["spec"]["template"]["spec"]["containers"][0].update(imagePullPolcy="Always"),  # misspelt
        lambda m: m["spec"]["template"]["spec"]["volumes"][0]["emptyDir"].update(medium=["Memory"]),  # wrong type
    ],
)
def test_a_broken_manifest_is_refused(server, mutate):
    async def start():
        async with get_client() as client:
            return (await client.create_flow_run_from_deployment(server["retrain-k8s"])).id

    manifest, _ = asyncio.run(job_manifest(asyncio.run(start())))
    mutate(manifest)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, K8S_VERSIONS[-1], strict=True)


# --- `grpoflow deployments apply` without an image -------------------------------------------------------------------


@pytest.mark.slow  # `prefect deploy` in a subprocess: about 30 s
def test_apply_leaves_the_image_deployments_out_without_grpoflow_image(prefect_server, monkeypatch):
    """Without GRPOFLOW_IMAGE (the repository to push to) `apply` needs no Docker: the one-machine deployments are
    deployed, the -k8s ones are left as they are, and the listing says how to deploy them."""
    monkeypatch.delenv("GRPOFLOW_IMAGE", raising=False)

    async def updated() -> dict[str, tuple]:
        async with get_client() as client:
            return {d.name: (d.id, d.updated) for d in await client.read_deployments()}

    asyncio.run(ensure_pools(load_pools()))
    before = asyncio.run(updated())
    deploy_all(PREFECT_FILE, PROJECT_DIR)
    after = asyncio.run(updated())
    try:
        for name in ("retrain", "nightly", "on-new-data", "watch"):
            assert after[name] != before.get(name), name
        for name in K8S:
            assert after.get(name) == before.get(name), name
        lines = asyncio.run(describe_deployments(PREFECT_FILE))
        for name in K8S:
            assert f"deployment {name}: not deployed; set GRPOFLOW_IMAGE (the image repository) to deploy it" in lines
    finally:  # the session's server keeps no schedules of these for later tests

        async def remove():
            async with get_client() as client:
                for name, (deployment_id, _) in after.items():
                    if name not in before:
                        await client.delete_deployment(deployment_id)

        asyncio.run(remove())
