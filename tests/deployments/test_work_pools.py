"""The work pools of deployments/work-pools/. No cluster is available here, so the Kubernetes GPU template is checked
against what `prefect work-pool get-default-base-job-template --type kubernetes` (prefect-kubernetes) produces, then
rendered the way its worker renders a flow run's Job, and read back through the Kubernetes client's models."""

import asyncio
import copy
import json
import subprocess
import sys
import uuid
from pathlib import Path

import jsonschema
import pytest
from kubernetes_asyncio.client import ApiClient
from prefect.client.schemas.objects import FlowRun
from prefect.server.schemas.actions import WorkPoolCreate
from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

from grpoflow.flows.deployments import LOCKED_VARIABLES, default_template, load_pools, locked_template

GPU = "nvidia.com/gpu"
ADDED_VARIABLES = {"gpu_count", "node_selector", "tolerations", "shm_size", "s3_secret"}
S3_KEYS = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
]


@pytest.fixture(scope="module")
def k8s_default() -> dict:
    prefect = Path(sys.executable).parent / "prefect"
    command = [str(prefect), "work-pool", "get-default-base-job-template", "--type", "kubernetes"]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout)


@pytest.fixture(scope="module")
def pools() -> dict[str, dict]:
    return {pool["name"]: pool for pool in load_pools()}


@pytest.fixture(scope="module")
def k8s_template(pools) -> dict:
    return pools["grpo-k8s"]["base_job_template"]


def render(template: dict, values: dict) -> dict:
    """The Job manifest the Kubernetes worker would submit for a flow run with these job variables."""
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, values))
    config.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="gentle-gecko"))
    return config.job_manifest


async def through_v1job(manifest: dict):
    """The manifest parsed into the Kubernetes client's V1Job model, and that model serialized again."""
    async with ApiClient() as api:
        job = api._ApiClient__deserialize(manifest, "V1Job")
        return job, api.sanitize_for_serialization(job)


def pod_spec(manifest: dict) -> dict:
    return manifest["spec"]["template"]["spec"]


def test_pools_file(pools):
    assert pools["grpo-gpu"]["type"] == "process" and pools["grpo-gpu"]["base_job_template"] is None
    assert {"name": "training", "concurrency_limit": 1} in pools["grpo-gpu"]["queues"]  # one GPU job at a time
    assert {"name": "watch", "concurrency_limit": 1} in pools["grpo-gpu"]["queues"]  # one hourly watcher at a time
    assert pools["grpo-k8s"]["type"] == "kubernetes"
    for pool in pools.values():
        template = locked_template(pool["base_job_template"] or asyncio.run(default_template(pool["type"])))
        # What the server checks when the pool is created: every {{ placeholder }} is a declared variable.
        WorkPoolCreate(name=pool["name"], type=pool["type"], base_job_template=template)
        assert not set(LOCKED_VARIABLES) & set(template["variables"]["properties"])  # no run sets them
        assert "{{ command }}" not in json.dumps(template) and "{{ env }}" not in json.dumps(template)


def test_k8s_template_extends_the_default(k8s_default, k8s_template):
    """Prefect's default template, less what no run may set (`locked_template`), plus ours."""
    assert locked_template(k8s_template) == k8s_template  # the file locks them itself (Prefect's CLI creates from it)
    k8s_default = locked_template(k8s_default)
    ours, default = k8s_template["variables"]["properties"], k8s_default["variables"]["properties"]
    assert {k: ours[k] for k in default} == default  # every default variable, unchanged
    assert set(ours) - set(default) == ADDED_VARIABLES
    assert k8s_template["job_configuration"].keys() == k8s_default["job_configuration"].keys()
    for key, value in k8s_default["job_configuration"].items():
        if key != "job_manifest":
            assert k8s_template["job_configuration"][key] == value

    # Take our additions out of the Job manifest: what is left is prefect-kubernetes' default manifest.
    manifest = copy.deepcopy(k8s_template["job_configuration"]["job_manifest"])
    pod = pod_spec(manifest)
    assert pod.pop("nodeSelector") == "{{ node_selector }}" and pod.pop("tolerations") == "{{ tolerations }}"
    assert pod.pop("volumes") == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "{{ shm_size }}"}}]
    container = pod["containers"][0]
    assert container.pop("volumeMounts") == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert container["resources"]["limits"].pop(GPU) == "{{ gpu_count }}"
    assert container["resources"]["requests"].pop(GPU) == "{{ gpu_count }}"
    # The S3 credentials, from the Secret s3_secret names (no `env` variable: a run may not add to them).
    secret_ref = lambda key: {"secretKeyRef": {"name": "{{ s3_secret }}", "key": key, "optional": True}}
    assert container.pop("env") == [{"name": key, "valueFrom": secret_ref(key)} for key in S3_KEYS]
    # completions and parallelism belong to the Job (prefect-kubernetes' default has them in the pod spec, where
    # Kubernetes ignores them and a strict schema check refuses them).
    job = manifest["spec"]
    pod["completions"], pod["parallelism"] = job.pop("completions"), job.pop("parallelism")
    assert manifest == k8s_default["job_configuration"]["job_manifest"]


def test_k8s_variables_schema(k8s_template):
    schema = k8s_template["variables"]
    jsonschema.Draft202012Validator.check_schema(schema)
    defaults = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    jsonschema.validate(defaults, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**defaults, "gpu_count": -1}, schema)  # what the server rejects as job variables
    for name in ADDED_VARIABLES:
        assert schema["properties"][name]["description"]  # shown in the UI's job variables form


@pytest.mark.usefixtures("prefect_server")  # rendering resolves block and variable references through the API
@pytest.mark.parametrize(
    "values, gpus",
    [
        ({}, 1),  # the default: one GPU
        ({"gpu_count": 4}, 4),  # a gpu_count: 4 job (accelerate launch --num_processes 4)
        ({"gpu_count": 0}, 0),  # CPU only
    ],
)
def test_k8s_job_requests_gpus(k8s_template, values, gpus):
    manifest = render(k8s_template, values)
    pod = pod_spec(manifest)
    resources = pod["containers"][0]["resources"]
    assert resources["limits"][GPU] == gpus and resources["requests"][GPU] == gpus
    assert pod["tolerations"] == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {}
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "16Gi"


@pytest.mark.usefixtures("prefect_server")
def test_k8s_job_is_a_valid_job(k8s_template):
    node_selector = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    values = {"gpu_count": 2, "node_selector": node_selector, "tolerations": tolerations, "shm_size": "32Gi"}
    manifest = render(k8s_template, values)

    # Through the Kubernetes client's V1Job model and back: a misspelt field would not survive the round trip.
    job, serialized = asyncio.run(through_v1job(manifest))
    back = pod_spec(serialized)
    assert back["nodeSelector"] == node_selector and back["tolerations"] == tolerations
    container = back["containers"][0]
    # The model types quantities as strings; the API server reads 2 and "2" alike.
    assert container["resources"]["limits"][GPU] == "2" and container["resources"]["requests"][GPU] == "2"
    assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert back["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}}]
    assert job.spec.template.spec.containers[0].args  # the worker filled in the flow run's command
