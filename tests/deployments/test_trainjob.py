"""The TrainJob of a several-machine job (`cluster/trainjob.py`, `grpoflow k8s render`): valid against Kubeflow
Trainer's own TrainJob CRD (kubeflow/trainer at 8c0f5059b, vendored in data/) in strict mode, an unknown field an
error as with `kubectl apply --validate=strict`, and against the rules the schema cannot say (its CEL rules, its list
keys, Trainer's admission webhook); 2 nodes x 8 GPUs, the runtime by name, the shared volume mounted at the job
folder; and the spec rules a several-machine job must meet (the CLI's refusals: tests/bad_inputs/cases-k8s.yaml)."""

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from grpoflow.cluster.kube import LABEL, PodSettings
from grpoflow.cluster.trainjob import API_VERSION, IMAGE_STAGING_DIR, JOB_ANNOTATION, trainjob
from grpoflow.core.spec import SpecError, load_spec
from tests.conftest import cli

CRD = Path(__file__).parent / "data" / "trainer.kubeflow.org_trainjobs.yaml"
GPU = "nvidia.com/gpu"
JOB_ROOT = Path("/mnt/grpoflow/arith-20261203-120000-abcdef")
SETTINGS = PodSettings(
    image="registry.example.com/ml/grpoflow:20261203",
    namespace="ml",
    service_account="grpoflow-trainer",
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    env={"PREFECT_API_URL": "http://prefect-server.prefect.svc:4200/api"},
    owner={"apiVersion": "v1", "kind": "Pod", "name": "flow-run-pod", "uid": "5f0c6a1e-0000-4000-8000-000000000001"},
)


STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
# The part of Kubernetes' ObjectMeta (meta/v1) an object may be created with and grpoflow could set, closed as above.
OBJECT_META = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": STRINGS,
        "annotations": STRINGS,
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["apiVersion", "kind", "name", "uid"],
                "properties": {
                    **{k: {"type": "string"} for k in ("apiVersion", "kind", "name", "uid")},
                    "controller": {"type": "boolean"},
                    "blockOwnerDeletion": {"type": "boolean"},
                },
            },
        },
    },
}


def strict(schema):
    """The CRD's schema with every object that lists its properties closed to others (`additionalProperties: false`),
    as the API server's strict field validation treats a structural schema; free-form objects stay open."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        open_ = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in schema and not open_:
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validator():
    crd = yaml.safe_load(CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == API_VERSION.split("/")[1]]
    schema = strict(version["schema"]["openAPIV3Schema"])
    # metadata is the API server's ObjectMeta, which the CRD leaves to the server: checked as the server does.
    schema["properties"]["metadata"] = OBJECT_META
    return jsonschema.Draft7Validator(schema)


def list_key_problems(body, schema, path="") -> list[str]:
    """Duplicate keys in the lists the schema keys (`x-kubernetes-list-type: map`, by `x-kubernetes-list-map-keys`),
    which the API server refuses and JSON Schema cannot say."""
    problems = []
    if isinstance(body, dict):
        for key, value in body.items():
            sub = (schema.get("properties") or {}).get(key)
            problems += list_key_problems(value, sub, f"{path}.{key}") if sub else []
    elif isinstance(body, list):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = [tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"]) for item in body]
            problems += [f"{path}: duplicate {key}" for key in set(keys) if keys.count(key) > 1]
        for i, item in enumerate(body):
            problems += list_key_problems(item, schema["items"], f"{path}[{i}]")
    return problems


# Trainer at 8c0f5059b: the torch-distributed runtime has one replicated job and one container, both "node"
# (charts/kubeflow-trainer/files/runtimes/torch-distributed.yaml); the torch plugin reserves the PET_* variables
# (pkg/constants TorchRunReservedEnvNames); the jobset plugin refuses env in a patch of the node container and a
# manager that is not a domain-prefixed path (pkg/runtime/framework/plugins/jobset/jobset.go).
RUNTIME_CONTAINERS = {"node": {"node"}}
RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}


def admission_problems(body) -> list[str]:
    """What the API server's CEL rules and Trainer's webhook would refuse beyond the schema."""
    name, trainer = body["metadata"]["name"], body["spec"]["trainer"]
    problems = [] if re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63 else [f"name {name!r}"]
    problems += [] if trainer["numProcPerNode"] >= 1 else ["numProcPerNode < 1"]
    problems += [f"reserved env {e['name']}" for e in trainer["env"] if e["name"] in RESERVED_ENV]
    for patch in body["spec"]["runtimePatches"]:
        if not re.fullmatch(r"[a-z0-9.-]+/[A-Za-z0-9._/-]+", patch["manager"]):
            problems.append(f"manager {patch['manager']!r}")
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            containers = job["template"]["spec"]["template"]["spec"].get("containers", [])
            for c in containers:
                if c["name"] not in RUNTIME_CONTAINERS.get(job["name"], set()):
                    problems.append(f"no container {job['name']}/{c['name']} in the runtime")
                if c["name"] == "node" and c.get("env"):
                    problems.append("env in a patch of the node container")
    return problems


def spec_for(machines: int, gpus: int, **distributed):
    data = {
        "name": "arith",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "s3://ml-bucket/data/arith.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "gpu_count": gpus,
        "hyperparameters": {"rollouts_per_prompt": 32},
        "distributed": {"num_machines": machines, "shared_volume": "grpoflow-rwx", **distributed},
        "output_uri": "s3://ml-bucket/runs",
    }
    return load_spec(data)[0]


@pytest.mark.parametrize("machines, gpus", [(2, 8), (4, 1)])
def test_the_trainjob_is_valid_against_the_crd_in_strict_mode(validator, machines, gpus):
    body = trainjob(spec_for(machines, gpus), JOB_ROOT, "grpo-arith-abc123", SETTINGS)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
    assert errors == []
    assert list_key_problems(body, validator.schema) == [] and admission_problems(body) == []
    assert body["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and body["kind"] == "TrainJob"
    trainer = body["spec"]["trainer"]
    assert trainer["numNodes"] == machines and trainer["numProcPerNode"] == gpus
    assert trainer["resourcesPerNode"] == {"requests": {GPU: gpus}, "limits": {GPU: gpus}}
    assert trainer["command"] == ["python", "-m", "grpoflow.cluster.node", str(JOB_ROOT)]
    assert body["metadata"]["labels"][LABEL] == "grpo-arith-abc123"
    assert body["metadata"]["annotations"][JOB_ANNOTATION] == JOB_ROOT.name
    assert body["metadata"]["ownerReferences"] == [SETTINGS.owner]


def test_two_nodes_of_eight_gpus_the_runtime_by_name_and_the_shared_volume(validator):
    body = trainjob(spec_for(2, 8, runtime="torch-distributed-h100"), JOB_ROOT, "grpo-arith-abc123", SETTINGS)
    assert body["spec"]["runtimeRef"] == {
        "name": "torch-distributed-h100",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    [patch] = body["spec"]["runtimePatches"]
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert {"name": "job-folder", "persistentVolumeClaim": {"claimName": "grpoflow-rwx"}} in pod["volumes"]
    [container] = pod["containers"]
    assert container["name"] == "node"  # the torch runtimes' node container
    # The job's own folder of the volume, where the flow run's pod has it (the volume at its staging folder).
    assert {"name": "job-folder", "mountPath": str(JOB_ROOT), "subPath": JOB_ROOT.name} in container["volumeMounts"]
    assert "env" not in container  # Trainer's webhook refuses env in a patch of the node container
    assert pod["serviceAccountName"] == "grpoflow-trainer" and pod["tolerations"] == SETTINGS.tolerations
    env = {e["name"]: e for e in body["spec"]["trainer"]["env"]}
    assert env["GRPOFLOW_STAGING_DIR"]["value"] == str(JOB_ROOT.parent)
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "grpoflow-s3",
        "key": "AWS_SECRET_ACCESS_KEY",
        "optional": True,
    }


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b["spec"]["trainer"].update(numNode=2),  # a misspelled field
        lambda b: b["spec"].update(runtimeRef={"name": "torch-distributed", "group": "x"}),  # unknown in runtimeRef
        lambda b: b["spec"]["trainer"].update(numNodes="two"),  # a wrong type
        lambda b: b["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"].update(jobs=[]),
        lambda b: b["metadata"]["annotations"].update(x=1),  # an annotation's value is a string
        lambda b: b["metadata"].update(label={"a": "b"}),  # metadata is checked too
    ],
)
def test_the_strict_check_refuses_what_the_api_server_would(validator, mutate):
    body = copy.deepcopy(trainjob(spec_for(2, 8), JOB_ROOT, "grpo-arith-abc123", SETTINGS))
    mutate(body)
    assert list(validator.iter_errors(body))


def pod_patch(body) -> dict:
    return body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"
    ]["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda b: b["metadata"].update(name="Grpo-arith"), "name"),  # CEL: an RFC 1035 label
        (lambda b: b["metadata"].update(name="g" * 64), "name"),  # CEL: at most 63 characters
        (lambda b: b["spec"]["trainer"]["env"].append({"name": "PET_NODE_RANK", "value": "0"}), "reserved env"),
        (lambda b: b["spec"]["trainer"]["env"].append(b["spec"]["trainer"]["env"][0]), "duplicate"),  # a list map
        (lambda b: pod_patch(b)["volumes"].append(pod_patch(b)["volumes"][0]), "duplicate"),
        (lambda b: pod_patch(b)["containers"][0].update(env=[{"name": "A", "value": "1"}]), "node container"),
        (lambda b: pod_patch(b)["containers"][0].update(name="trainer"), "no container node/trainer"),
        (lambda b: b["spec"]["runtimePatches"][0].update(manager="grpoflow"), "manager"),
    ],
)
def test_the_rules_beyond_the_schema_refuse_what_trainer_would(validator, mutate, expect):
    body = copy.deepcopy(trainjob(spec_for(2, 8), JOB_ROOT, "grpo-arith-abc123", SETTINGS))
    mutate(body)
    problems = list_key_problems(body, validator.schema) + admission_problems(body)
    assert any(expect in p for p in problems), problems


def test_a_long_job_name_still_makes_a_valid_trainjob_name(validator):
    from grpoflow.cluster.kube import run_name

    spec = spec_for(4, 8)
    job_id = f"{'Long_job.name-' * 5}"[:63].lower() + "-20261203-120000-abcdef"
    body = trainjob(spec, JOB_ROOT.parent / job_id, run_name(job_id), SETTINGS)
    assert admission_problems(body) == [] and list(validator.iter_errors(body)) == []
    # JobSet names the pods' hosts <trainjob>-node-0-<index>: a DNS label too.
    assert len(f"{body['metadata']['name']}-node-0-3") <= 63


@pytest.mark.parametrize(
    "change, expect",
    [
        ({"distributed": {"num_machines": 2}}, "distributed.shared_volume: 2 machines share the job folder"),
        (
            {"distributed": {"num_machines": 2, "shared_volume": "rwx"}, "output_uri": "runs"},
            "output_uri: with distributed.num_machines 2 the job ends on a store",
        ),
    ],
)
def test_a_several_machine_spec_needs_a_shared_volume_and_a_store(change, expect):
    data = {
        "name": "arith",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "d.jsonl"},
        "rewards": [{"name": "exact_answer"}],
    }
    data |= {"output_uri": "s3://b/runs"} | change
    with pytest.raises(SpecError) as caught:
        load_spec(data)
    assert any(expect in p for p in caught.value.problems), caught.value.problems


@pytest.fixture
def render_spec(tmp_path, monkeypatch):
    for name in ("GRPOFLOW_IMAGE", "GRPOFLOW_STAGING_DIR", "GRPOFLOW_K8S_NAMESPACE", "GRPOFLOW_K8S_SERVICE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    spec = {
        "name": "arith",
        "base_model": "builtin:tiny",
        "dataset": {"uri": "s3://ml-bucket/data/arith.jsonl"},
        "rewards": [{"name": "exact_answer"}],
        "output_uri": "s3://ml-bucket/runs",
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


SETS = ("--set", "distributed.num_machines=2", "--set", "distributed.shared_volume=grpoflow-rwx")


def test_k8s_render_prints_the_trainjob_of_the_issue(render_spec, validator):
    sets = [*SETS, "--set", "gpu_count=8", "--set", "hyperparameters.rollouts_per_prompt=16"]
    code, out, err = cli("k8s", "render", render_spec, *sets, "--image", "registry.example.com/ml/grpoflow:1")
    assert code == 0, err
    [body] = [doc for doc in yaml.safe_load_all(out) if doc is not None]  # YAML documents: the TrainJob alone
    assert list(validator.iter_errors(body)) == [] and admission_problems(body) == []
    trainer = body["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8 and trainer["image"].endswith("grpoflow:1")
    assert body["spec"]["runtimeRef"]["name"] == "torch-distributed"
    # Outside the image, the job folder is where the flow run's pod has it: the grpoflow image's staging folder.
    job_root = trainer["command"][-1]
    assert job_root == f"{IMAGE_STAGING_DIR}/{body['metadata']['annotations'][JOB_ANNOTATION]}"
    assert job_root.split("/")[-1].startswith("arith-")
    [mount] = [m for m in pod_patch(body)["containers"][0]["volumeMounts"] if m["name"] == "job-folder"]
    assert mount["mountPath"] == job_root


def test_k8s_render_takes_the_image_and_staging_folder_from_the_environment(render_spec, monkeypatch):
    monkeypatch.setenv("GRPOFLOW_IMAGE", "registry.example.com/ml/grpoflow:2")
    monkeypatch.setenv("GRPOFLOW_STAGING_DIR", "/mnt/grpoflow")
    monkeypatch.setenv("GRPOFLOW_K8S_NAMESPACE", "ml")
    code, out, err = cli("k8s", "render", render_spec, *SETS)
    assert code == 0, err
    body = yaml.safe_load(out)
    assert body["spec"]["trainer"]["image"] == "registry.example.com/ml/grpoflow:2"
    assert body["spec"]["trainer"]["command"][-1].startswith("/mnt/grpoflow/arith-")
    assert body["metadata"]["namespace"] == "ml"


@pytest.mark.parametrize(
    "argv, expect",
    [
        ((), "render is for several machines"),  # one machine: nothing to render
        (SETS[:2], "distributed.shared_volume: 2 machines share the job folder"),
        ((*SETS, "--set", "output_uri=runs"), "output_uri: with distributed.num_machines 2"),
    ],
)
def test_k8s_render_refuses_what_validate_refuses(render_spec, argv, expect):
    code, out, err = cli("k8s", "render", render_spec, *argv, "--image", "x")
    assert code == 2 and expect in err and out == ""


def test_k8s_render_without_an_image(render_spec):
    code, out, err = cli("k8s", "render", render_spec, *SETS)
    assert code == 2 and "--image or GRPOFLOW_IMAGE" in err and out == ""
