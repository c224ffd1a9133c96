"""The Kubernetes objects of a several-machine training job (`cluster/multinode.py`): the indexed Job and its headless
Service for 2 and 4 machines, 1 and 8 GPUs each, ddp and zero3, validated offline against the Kubernetes API's
OpenAPI schema (kubernetes-validate, strict: an unknown field is an error, as with `kubectl apply --validate=strict`)
for an old and the newest known API version, as tests/deployments/test_k8s.py does for the flow run's Job."""

import copy

import kubernetes_validate
import pytest

from grpoflow.cluster.kube import (
    LABEL,
    S3_KEYS,
    STAGING_MOUNT,
    PodSettings,
    job_manifest,
    main_host,
    run_name,
    service_manifest,
)
from grpoflow.trainers.spec import load_spec

GPU = "nvidia.com/gpu"
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
IMAGE = "registry.example.com/ml/grpoflow:20261201-120000"
LOCATION = "s3://ml-bucket/runs/arith-20261201-120000-abcdef"
SETTINGS = PodSettings(
    image=IMAGE,
    namespace="ml",
    service_account="grpoflow-trainer",
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    env={"PREFECT_API_URL": "http://prefect-server.prefect.svc:4200/api"},
    owner={"apiVersion": "v1", "kind": "Pod", "name": "flow-run-pod", "uid": "5f0c6a1e-0000-4000-8000-000000000001"},
)


def spec_for(machines: int, gpus: int, strategy: str):
    data = {
        "name": "arith",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "s3://ml-bucket/data/arith.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "gpu_count": gpus,
        "hyperparameters": {"rollouts_per_prompt": 32},
        "distributed": {"strategy": strategy, "num_machines": machines},
        "output_uri": "s3://ml-bucket/runs",
    }
    return load_spec(data)[0]


def validate(manifest: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("machines", [2, 4])
@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_the_job_and_service_are_valid_and_span_the_machines(machines, gpus, strategy):
    spec = spec_for(machines, gpus, strategy)
    name = run_name("arith-20261201-120000-abcdef")
    job, service = job_manifest(spec, LOCATION, name, SETTINGS), service_manifest(name, SETTINGS)
    validate(job)
    validate(service)

    # One pod per machine, all at once, indexed, never restarted on its own (the rendezvous would not take it back).
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == machines
    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["requests"][GPU] == gpus and container["resources"]["limits"][GPU] == gpus
    # Rank 0 is reachable by name: the pods' subdomain is the headless Service, which selects them.
    assert pod["subdomain"] == service["metadata"]["name"] == name and pod["restartPolicy"] == "Never"
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {LABEL: name}
    assert job["spec"]["template"]["metadata"]["labels"][LABEL] == name
    assert job["metadata"]["namespace"] == service["metadata"]["namespace"] == "ml"
    assert job["metadata"]["ownerReferences"] == [SETTINGS.owner]  # deleted with the flow run's pod
    command = container["command"]
    assert command[:4] == ["python", "-m", "grpoflow.cluster.node", LOCATION]
    assert command[command.index("--main-process-ip") + 1] == main_host(name, "ml") == f"{name}-0.{name}.ml.svc"
    assert command[command.index("--checkpoint") + 1] == "none"  # a first attempt starts from the beginning
    assert container["ports"] == [{"name": "rendezvous", "containerPort": 29500}]
    # The scheduling and identity of the flow run's own pod; shared memory in memory; staging on its own volume.
    assert pod["serviceAccountName"] == "grpoflow-trainer" and pod["nodeSelector"] == SETTINGS.node_selector
    assert pod["tolerations"] == SETTINGS.tolerations and container["image"] == IMAGE
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "staging": STAGING_MOUNT}
    # S3 credentials only from the Secret, never as values.
    env = {e["name"]: e for e in container["env"]}
    for key in S3_KEYS:
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "grpoflow-s3", "key": key, "optional": True}
        assert "value" not in env[key]
    assert env["GRPOFLOW_STAGING_DIR"]["value"] == STAGING_MOUNT
    assert env["PREFECT_API_URL"]["value"] == SETTINGS.env["PREFECT_API_URL"]


def test_names_are_dns_labels_unique_per_attempt():
    long_id = "a-very-long-job-name-that-goes-on-and-on-20261201-120000-abcdef"
    first, second = run_name(long_id), run_name(long_id)
    assert first != second  # a retry never meets the Job it replaces
    for name in (first, second):
        # The pods' hostnames `<name>-<index>` are DNS labels too (at most 63 characters).
        assert len(f"{name}-999") <= 63 and name[0].isalpha() and name == name.lower()
    spec = spec_for(4, 8, "ddp")
    resumed = job_manifest(spec, LOCATION, first, SETTINGS, checkpoint="checkpoint-40")
    validate(resumed)
    command = resumed["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--checkpoint") + 1] == "checkpoint-40"  # every pod resumes from the same one
    validate(service_manifest(first, SETTINGS))


def test_without_a_service_account_the_pod_names_none():
    settings = PodSettings(image=IMAGE)
    job = job_manifest(spec_for(2, 1, "ddp"), LOCATION, run_name("x"), settings)
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod and "nodeSelector" not in pod and "tolerations" not in pod
    assert "ownerReferences" not in job["metadata"]
    assert job["metadata"]["namespace"] == "default"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda j: j["spec"].update(completionsMode="Indexed"),  # misspelt
        lambda j: j["spec"]["template"]["spec"].update(subDomain="x"),  # misspelt
        lambda j: j["spec"].update(completions="2"),  # wrong type
        lambda j: j["spec"]["template"]["spec"]["containers"][0].pop("name"),  # required
    ],
)
def test_a_broken_manifest_is_refused(mutate):
    job = copy.deepcopy(job_manifest(spec_for(2, 8, "zero3"), LOCATION, run_name("x"), SETTINGS))
    validate(job)
    mutate(job)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)
