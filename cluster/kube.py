"""The Kubernetes side of several machines per training job (`distributed.num_machines` > 1), without Prefect: the
API client the training task calls (`Kube`, over kubernetes_asyncio), a TrainJob's name (`run_name`), and what the
pods get besides the spec (`pod_settings`). `grpoflow.cluster.trainjob` builds the TrainJob with them and
`grpoflow.cluster.multinode` creates, watches and deletes it; the module's table there says where each setting comes
from.
"""

import asyncio
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from grpoflow.core.errors import TrainingSetupError

IMAGE_ENV = "GRPOFLOW_IMAGE"
NAMESPACE_ENV = "GRPOFLOW_K8S_NAMESPACE"
SERVICE_ACCOUNT_ENV = "GRPOFLOW_K8S_SERVICE_ACCOUNT"
S3_SECRET_ENV = "GRPOFLOW_S3_SECRET"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SHM_SIZE = "16Gi"
# The Secret's keys that become the pods' environment, each optional (workload identity needs none); as the pool's.
S3_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
)
# Passed on to the pods as they are in the flow run (no secrets among them: those come from Secrets).
PASSED_ENV = (
    "GRPOFLOW_STORAGE_BLOCK",
    "PREFECT_API_URL",
    "HF_HUB_OFFLINE",
    "HF_ENDPOINT",
    "GRPOFLOW_CANARY_JOIN_TIMEOUT_S",  # grpoflow.cluster.canary's
)
LABEL = "grpoflow.io/run"


# --- manifests -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodSettings:
    """What the pods get besides the spec: the image, where they run, and the S3 Secret."""

    image: str
    namespace: str = "default"
    service_account: str | None = None
    s3_secret: str = "grpoflow-s3"
    node_selector: dict = field(default_factory=dict)
    tolerations: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # PASSED_ENV's values
    # The flow run's own pod as the TrainJob's owner: Kubernetes deletes the TrainJob with it (a flow run's pod lost
    # while the task could not delete the TrainJob leaves no training running).
    owner: dict | None = None


def run_name(job_id: str) -> str:
    """A fresh name for one attempt's TrainJob: a DNS label starting with a letter, short enough that its JobSet's pod
    hostnames (`<name>-node-0-<index>`) stay within 63 characters, unique per attempt so a retry never meets the
    TrainJob of the attempt before while Kubernetes deletes it."""
    slug = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")[:36].rstrip("-")
    return f"grpo-{slug}-{secrets.token_hex(3)}"


# --- the Kubernetes API ----------------------------------------------------------------------------------------------


def _api_missing() -> TrainingSetupError:
    return TrainingSetupError(
        "grpoflow: distributed.num_machines > 1 creates a Kubeflow Trainer TrainJob, but no Kubernetes API is "
        "reachable from here: run the flow in a pod whose service account may create and delete trainjobs and read "
        "pods and their logs (in-cluster: KUBERNETES_SERVICE_HOST and the service account token), or set KUBECONFIG"
    )


async def _connect():
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient

    if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
        config.load_incluster_config()
        return ApiClient()
    kubeconfig = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path("~/.kube/config").expanduser())
    if not Path(kubeconfig).is_file():
        raise _api_missing()
    return await config.new_client_from_config(config_file=kubeconfig)


class Kube:
    """The calls the task makes, synchronous, over kubernetes_asyncio on an event loop of its own thread (the task may
    run where a loop already runs). `Kube()` connects; `close()` ends the loop."""

    def __init__(self):
        try:
            from kubernetes_asyncio.client import CoreV1Api
        except ImportError:
            raise TrainingSetupError(
                "grpoflow: distributed.num_machines > 1 creates a TrainJob through kubernetes_asyncio, which is "
                "not installed here: pip install 'grpoflow[kubernetes]' (the image's default extras have it)"
            ) from None

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kubernetes-api", daemon=True)
        self.thread.start()
        try:
            self.client = self.call(_connect())
        except BaseException:
            self._stop_loop()
            raise
        self.core = CoreV1Api(self.client)

    def call(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.call(self.client.close(), timeout=10)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def own_pod(self, namespace: str):
        """The pod this process runs in (HOSTNAME is its name), or None (not in a pod, or not allowed to read it)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        name = os.environ.get("HOSTNAME")
        if not name:
            return None
        try:
            return self.call(self.core.read_namespaced_pod(name, namespace))
        except ApiException:
            return None


def pod_settings(kube: Kube) -> PodSettings:
    """The pods' image, namespace, service account and scheduling (see the module's table)."""
    namespace = os.environ.get(NAMESPACE_ENV)
    if not namespace and (SERVICE_ACCOUNT_DIR / "namespace").exists():
        namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    namespace = namespace or "default"
    own = kube.own_pod(namespace)
    image = os.environ.get(IMAGE_ENV) or (own.spec.containers[0].image if own else None)
    if not image:
        raise TrainingSetupError(
            f"grpoflow: distributed.num_machines > 1: no image for the training pods: set {IMAGE_ENV} in the flow "
            "run's environment (the work pool's env job variable), or run the flow in a pod of the grpoflow image"
        )
    serialize = kube.client.sanitize_for_serialization
    return PodSettings(
        image=image,
        namespace=namespace,
        service_account=os.environ.get(SERVICE_ACCOUNT_ENV) or (own.spec.service_account_name if own else None),
        s3_secret=os.environ.get(S3_SECRET_ENV, "grpoflow-s3"),
        node_selector=dict(own.spec.node_selector or {}) if own else {},
        tolerations=[serialize(t) for t in own.spec.tolerations or []] if own else [],
        env={k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)},
        owner={"apiVersion": "v1", "kind": "Pod", "name": own.metadata.name, "uid": own.metadata.uid}
        if own and own.metadata.uid
        else None,
    )
