"""The Kubeflow Trainer TrainJob a several-machine job's training stage creates (`distributed.num_machines` > 1).

The object is `trainer.kubeflow.org/v1alpha1` `TrainJob` as Kubeflow Trainer's CRD defines it (kubeflow/trainer at
8c0f5059b): `spec.runtimeRef` names the ClusterTrainingRuntime (`distributed.runtime`, default torch-distributed),
`spec.trainer` gives the image, the command every node runs (`python -m grpoflow.cluster.node <job folder>`), the
environment, `numNodes` (num_machines), `numProcPerNode` and `resourcesPerNode` (`nvidia.com/gpu`: gpu_count), and
`spec.runtimePatches` add what the pods need beyond that: the job's folder of the shared volume
(`distributed.shared_volume`, a ReadWriteMany PVC that the flow run's pod mounts at its staging folder) mounted at the
job folder's own path, so every node sees it where the flow run's pod does; a memory-backed /dev/shm; the service
account, nodeSelector and tolerations of the flow run's own pod. The S3 keys come from the pool's Secret, each
optional, as environment variables of the trainer. `grpoflow k8s render` prints the object without a cluster.
"""

import os
from pathlib import Path

from grpoflow.cluster.kube import (
    LABEL,
    NAMESPACE_ENV,
    PASSED_ENV,
    S3_KEYS,
    S3_SECRET_ENV,
    SERVICE_ACCOUNT_ENV,
    SHM_SIZE,
    PodSettings,
    run_name,
)
from grpoflow.core.spec import JobSpec
from grpoflow.integrations.storage import STAGING_ENV

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION = f"{GROUP}/{VERSION}"
RUNTIME_KIND = "ClusterTrainingRuntime"
NODE = "node"  # the replicated job and container of the torch runtimes
PATCH_MANAGER = "grpoflow.io/train-task"
VOLUME = "job-folder"
# The flow run pod's staging folder in the grpoflow image (the Dockerfile's user's ~/.grpoflow/staging), for a render
# outside it: this machine's own home means nothing on the cluster.
IMAGE_STAGING_DIR = "/home/grpoflow/.grpoflow/staging"
JOB_ANNOTATION = "grpoflow.io/job-id"  # an annotation: a job id may be longer than a label value's 63 characters


def _env(settings: PodSettings, staging: str) -> list[dict]:
    # The trainer's env, not a runtime patch's: Trainer's webhook refuses env in a patch of the `node` container.
    env = [{"name": STAGING_ENV, "value": staging}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": k, "value": v} for k, v in sorted(settings.env.items())]
    return env + [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": settings.s3_secret, "key": key, "optional": True}}}
        for key in S3_KEYS
    ]


def _pod_patch(spec: JobSpec, settings: PodSettings, job_root: Path) -> dict:
    """The pods' part of the runtime patch: the job folder from the shared volume, /dev/shm, scheduling."""
    # The job's own folder of the volume (subPath) at its path in the flow run's pod: a node sees its job and no other.
    job_folder = {"name": VOLUME, "mountPath": str(job_root), "subPath": job_root.name}
    pod = {
        "volumes": [
            {"name": VOLUME, "persistentVolumeClaim": {"claimName": spec.distributed.shared_volume}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        ],
        "containers": [
            {
                "name": NODE,
                "volumeMounts": [job_folder, {"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
    }
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    if settings.node_selector:
        pod["nodeSelector"] = settings.node_selector
    if settings.tolerations:
        pod["tolerations"] = settings.tolerations
    return pod


def trainjob(spec: JobSpec, job_root: Path, name: str, settings: PodSettings, canary: Path | None = None) -> dict:
    """The TrainJob of one attempt of the training stage (or of the canary's, the same shape).

    Args:
        spec (`JobSpec`): the job's spec (`distributed.*`, `gpu_count`).
        job_root (`Path`): the job folder as the flow run's pod sees it, on the shared volume mounted at its parent
            (the staging folder); every node gets that folder of the volume at the same path.
        name (`str`): the TrainJob's name (`grpoflow.cluster.kube.run_name`: unique per attempt).
        settings (`PodSettings`): the image, namespace, service account, scheduling and S3 Secret.
        canary (`Path`, *optional*): the canary's folder inside `job_root`: the nodes run its collective and one
            step (`python -m grpoflow.cluster.node --canary FOLDER`, `grpoflow.cluster.canary`) instead of training.
    """
    machines, gpus, job_root = spec.distributed.num_machines, spec.gpu_count, Path(job_root)
    component = "canary" if canary else "training"
    labels = {LABEL: name, "app.kubernetes.io/name": "grpoflow", "app.kubernetes.io/component": component}
    command = ["python", "-m", "grpoflow.cluster.node", *(["--canary", str(canary)] if canary else [str(job_root)])]
    metadata = {
        "name": name,
        "namespace": settings.namespace,
        "labels": labels,
        "annotations": {JOB_ANNOTATION: job_root.name},
    }
    if settings.owner:  # the flow run's pod: Kubernetes deletes the TrainJob with it
        metadata["ownerReferences"] = [settings.owner]
    patch = {
        "replicatedJobs": [
            {"name": NODE, "template": {"spec": {"template": {"spec": _pod_patch(spec, settings, job_root)}}}}
        ]
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {
            "runtimeRef": {"name": spec.distributed.runtime, "apiGroup": GROUP, "kind": RUNTIME_KIND},
            "trainer": {
                "image": settings.image,
                "command": command,
                "env": _env(settings, str(job_root.parent)),
                "numNodes": machines,
                "numProcPerNode": gpus,
                "resourcesPerNode": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}},
            },
            "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": patch}}}],
        },
    }


def rendered(spec: JobSpec, image: str, job_id: str) -> list[dict]:
    """Every Kubernetes object the training stage of `spec` would create for the job `job_id`, without a cluster
    (`grpoflow k8s render`): the TrainJob alone.

    Args:
        spec (`JobSpec`): a several-machine job's spec.
        image (`str`): the training image.
        job_id (`str`): the job's id; its folder is under `GRPOFLOW_STAGING_DIR` when set (the flow run pod's
            staging folder, as the pool sets it), else under the grpoflow image's (`IMAGE_STAGING_DIR`).

    The rest comes from this environment as the task takes it from the flow run's (GRPOFLOW_K8S_NAMESPACE,
    GRPOFLOW_K8S_SERVICE_ACCOUNT, GRPOFLOW_S3_SECRET and PASSED_ENV); there is no pod of its own to copy from.
    """
    settings = PodSettings(
        image=image,
        namespace=os.environ.get(NAMESPACE_ENV) or "default",
        service_account=os.environ.get(SERVICE_ACCOUNT_ENV),
        s3_secret=os.environ.get(S3_SECRET_ENV, "grpoflow-s3"),
        env={k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)},
    )
    job_root = Path(os.environ.get(STAGING_ENV) or IMAGE_STAGING_DIR) / job_id
    return [trainjob(spec, job_root, run_name(job_id), settings)]
