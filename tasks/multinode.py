"""Several machines per training job (`distributed.num_machines` > 1): the training stage as a Kubernetes indexed Job.

`run_on_machines(job, spec, poll)` is what `tasks.train.train_task` runs instead of a local child. It uploads the job
folder to the spec's `s3://` output_uri (pods share no disk), creates a headless Service and an indexed Job of
`num_machines` pods (completionMode Indexed: pod `<name>-<i>` gets JOB_COMPLETION_INDEX=i and, through the Service's
`subdomain`, the DNS name `<name>-<i>.<name>.<namespace>.svc`), and watches it to its end: each pod runs `python -m
tasks.node` (the node entry: download the job folder and newest intact checkpoint, `accelerate launch --num_machines
N --machine_rank i --main_process_ip <name>-0...`, rank 0 uploading checkpoints as they are saved and the results at
the end). The pods' logs are copied into `logs/train.log` (one `[rank i]` prefix per pod) and `metrics.jsonl` is read
back from the store while they train, so the progress lines, events and health monitor work as for one machine.

Every index succeeded: the results (training.json, merged/ or adapter/, metrics.jsonl) are downloaded into the local
job folder. A pod that failed: `RuntimeError` naming the pod, its exit code and the end of its log (Prefect's retry
creates a new Job, which resumes from the newest checkpoint on the store); a pod that exited 2 or 3 (the child's
setup error or failed reward, `trainers.launch`): `TrainingSetupError` / `RewardFailed`, not retried. The Job (with
its pods) and the Service are deleted however the task ends.

Where things come from (environment of the flow run, e.g. the work pool's `env` job variable):

| what | from |
| --- | --- |
| the API | in-cluster service account (KUBERNETES_SERVICE_HOST and its token), else KUBECONFIG (or ~/.kube/config) |
| namespace | GRPOFLOW_K8S_NAMESPACE, else the service account's namespace file, else `default` |
| image | GRPOFLOW_IMAGE, else the image of the flow run's own pod (HOSTNAME) |
| service account, nodeSelector, tolerations | GRPOFLOW_K8S_SERVICE_ACCOUNT, else the flow run's own pod's |
| S3 credentials | the Secret GRPOFLOW_S3_SECRET (default `grpoflow-s3`, as the grpo-k8s pool's `s3_secret`) |
| rendezvous port | GRPOFLOW_RENDEZVOUS_PORT (default 29500) |
| how long the pods may wait to run | GRPOFLOW_K8S_START_TIMEOUT_S (default 1800) |
"""

import asyncio
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from prefect import get_run_logger

from tasks.job import upload_job
from tasks.node import complete_checkpoint
from tasks.storage import filesystem, join
from trainers.jobdir import JobDir, write_text_atomic
from trainers.launch import (
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    RewardFailed,
    TrainingSetupError,
    TrainingStopped,
)
from trainers.spec import JobSpec

IMAGE_ENV = "GRPOFLOW_IMAGE"
NAMESPACE_ENV = "GRPOFLOW_K8S_NAMESPACE"
SERVICE_ACCOUNT_ENV = "GRPOFLOW_K8S_SERVICE_ACCOUNT"
S3_SECRET_ENV = "GRPOFLOW_S3_SECRET"
PORT_ENV = "GRPOFLOW_RENDEZVOUS_PORT"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RENDEZVOUS_PORT = 29500
STAGING_MOUNT = "/var/lib/grpoflow/staging"  # an emptyDir per pod: checkpoints can outgrow the container's disk
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
PASSED_ENV = ("GRPOFLOW_STORAGE_BLOCK", "PREFECT_API_URL", "HF_HUB_OFFLINE", "HF_ENDPOINT")
POLL_S = 2.0
START_TIMEOUT_ENV = "GRPOFLOW_K8S_START_TIMEOUT_S"
START_TIMEOUT_S = (
    1800.0  # the most the pods may wait to run (image pull, GPU nodes scaling up) before the attempt fails
)
LOG_BYTES_PER_S = 500_000  # a pod's log is read whole: a long one less often
FINISHED_JOB_TTL_S = 3600  # Kubernetes removes a Job the task could not (a lost worker) after this
LABEL = "grpoflow.io/run"


# --- manifests -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodSettings:
    """What the pods get besides the spec: the image, where they run, and the S3 Secret."""

    image: str
    namespace: str = "default"
    service_account: str | None = None
    s3_secret: str = "grpoflow-s3"
    port: int = RENDEZVOUS_PORT
    node_selector: dict = field(default_factory=dict)
    tolerations: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # PASSED_ENV's values
    # The flow run's own pod as the Job's owner: Kubernetes deletes the Job with it (a flow run's pod lost while the
    # task could not delete the Job leaves no training running).
    owner: dict | None = None


def run_name(job_id: str) -> str:
    """A fresh name for one attempt's Job and Service: a DNS label (the Service's name must start with a letter, and
    the pods' hostnames `<name>-<index>` must stay within 63 characters), unique per attempt so a retry never meets
    the Job of the attempt before while Kubernetes deletes it."""
    slug = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")[:44].rstrip("-")
    return f"grpo-{slug}-{secrets.token_hex(3)}"


def main_host(name: str, namespace: str) -> str:
    """The DNS name of index 0's pod: its hostname under the headless Service (the Job's `subdomain`)."""
    return f"{name}-0.{name}.{namespace}.svc"


def service_manifest(name: str, settings: PodSettings) -> dict:
    """The headless Service that gives each pod of the Job a DNS name; `publishNotReadyAddresses`, as the ranks meet
    before any readiness."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": {LABEL: name}},
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL: name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": settings.port, "targetPort": settings.port}],
        },
    }


def _env(spec: JobSpec, settings: PodSettings) -> list[dict]:
    env = [{"name": "GRPOFLOW_STAGING_DIR", "value": STAGING_MOUNT}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": k, "value": v} for k, v in sorted(settings.env.items())]
    secret = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": settings.s3_secret, "key": key, "optional": True}}}
        for key in S3_KEYS
    ]
    return env + secret


def job_manifest(
    spec: JobSpec, location: str, name: str, settings: PodSettings, checkpoint: str | None = None
) -> dict:
    """The indexed Job: `distributed.num_machines` pods, each `gpu_count` GPUs, all started at once (parallelism =
    completions) and none restarted (backoffLimit 0): a lost rank breaks the rendezvous of the others, so the whole
    attempt fails and Prefect's retry starts a new Job from the newest checkpoint, `checkpoint` (None: from the
    beginning), which every pod resumes from."""
    machines, gpus = spec.distributed.num_machines, spec.gpu_count
    command = [
        "python",
        "-m",
        "tasks.node",
        location,
        "--main-process-ip",
        main_host(name, settings.namespace),
        "--main-process-port",
        str(settings.port),
        "--checkpoint",
        checkpoint or "none",
    ]
    container = {
        "name": "trainer",
        "image": settings.image,
        "command": command,
        "env": _env(spec, settings),
        "ports": [{"name": "rendezvous", "containerPort": settings.port}],
        "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "staging", "mountPath": STAGING_MOUNT}],
    }
    pod = {
        "subdomain": name,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "staging", "emptyDir": {}},
        ],
    }
    if settings.service_account:
        pod["serviceAccountName"] = settings.service_account
    if settings.node_selector:
        pod["nodeSelector"] = settings.node_selector
    if settings.tolerations:
        pod["tolerations"] = settings.tolerations
    labels = {LABEL: name, "app.kubernetes.io/name": "grpoflow", "app.kubernetes.io/component": "training"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            **({"ownerReferences": [settings.owner]} if settings.owner else {}),
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": machines,
            "parallelism": machines,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


# --- the Kubernetes API ----------------------------------------------------------------------------------------------


def _api_missing() -> TrainingSetupError:
    return TrainingSetupError(
        "grpoflow: distributed.num_machines > 1 creates a Kubernetes Job, but no Kubernetes API is reachable from "
        "here: run the flow in a pod whose service account may create Jobs and Services and read pods and their "
        "logs (in-cluster: KUBERNETES_SERVICE_HOST and the service account token), or set KUBECONFIG"
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
            from kubernetes_asyncio.client import BatchV1Api, CoreV1Api
        except ImportError:
            raise TrainingSetupError(
                "grpoflow: distributed.num_machines > 1 creates a Kubernetes Job through kubernetes_asyncio, which is "
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
        self.batch, self.core = BatchV1Api(self.client), CoreV1Api(self.client)

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

    def delete(self, name: str, namespace: str) -> None:
        """Deletes the Job (its pods with it) and the Service; those already gone are fine."""
        from kubernetes_asyncio.client.exceptions import ApiException

        calls = (
            lambda: self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background"),
            lambda: self.core.delete_namespaced_service(name, namespace),
        )
        for call in calls:
            try:
                self.call(call(), timeout=60)
            except ApiException as e:
                if e.status != 404:
                    raise


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
        port=int(os.environ.get(PORT_ENV) or RENDEZVOUS_PORT),
        node_selector=dict(own.spec.node_selector or {}) if own else {},
        tolerations=[serialize(t) for t in own.spec.tolerations or []] if own else [],
        env={k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)},
        owner={"apiVersion": "v1", "kind": "Pod", "name": own.metadata.name, "uid": own.metadata.uid}
        if own and own.metadata.uid
        else None,
    )


# --- watching the Job ------------------------------------------------------------------------------------------------


class PodLogs:
    """Copies the pods' logs into one local file, each line prefixed with the pod's index; a pod's log is read whole
    each round (kubelet keeps it) and only its new lines are written."""

    def __init__(self, kube: Kube, namespace: str, path: Path):
        self.kube, self.namespace, self.path = kube, namespace, path
        self.seen: dict[str, int] = {}  # pod -> lines written
        self.done: set[str] = set()  # pods that ended and whose log was read after
        self.tails: dict[str, list[str]] = {}
        self.next_read: dict[str, float] = {}  # pod -> when its log is read again

    def poll(self, pods: list) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        self.path.parent.mkdir(parents=True, exist_ok=True)
        for pod in pods:
            name = pod.metadata.name
            if name in self.done:
                continue
            ended = pod.status.phase in ("Succeeded", "Failed")
            if not ended and time.monotonic() < self.next_read.get(name, 0):
                continue
            try:
                text = self.kube.call(self.kube.core.read_namespaced_pod_log(name, self.namespace))
            except ApiException:  # not started yet
                continue
            self.next_read[name] = time.monotonic() + len(text) / LOG_BYTES_PER_S
            lines = text.splitlines()
            new, self.seen[name] = lines[self.seen.get(name, 0) :], len(lines)
            self.tails[name] = lines[-25:]
            index = pod.metadata.labels.get("batch.kubernetes.io/job-completion-index", name.rsplit("-", 1)[-1])
            if new:
                with self.path.open("a") as f:
                    f.writelines(f"[rank {index}] {line}\n" for line in new)
            if ended:
                self.done.add(name)

    def tail(self, pod: str) -> str:
        return "\n".join(self.tails.get(pod, []))


class MetricsMirror:
    """Copies `<location>/metrics.jsonl`, which rank 0 uploads as it trains, over the local one when it changed."""

    def __init__(self, job: JobDir, location: str):
        self.job, self.size = job, None
        self.fs, self.remote = filesystem(join(location, "metrics.jsonl"))

    def poll(self) -> None:
        self.fs.invalidate_cache()
        try:
            size = self.fs.info(self.remote)["size"]
            if size != self.size:
                write_text_atomic(self.job.metrics, self.fs.cat_file(self.remote).decode())
                self.size = size
        except FileNotFoundError:
            pass


class StartWatch:
    """Until every pod runs: logs why one waits (once per reason: Unschedulable, ImagePullBackOff, ...) and fails the
    attempt once they waited `timeout` seconds, naming the pods and their reasons."""

    def __init__(self, timeout: float, logger):
        self.timeout, self.logger, self.started, self.said, self.running = (
            timeout,
            logger,
            time.monotonic(),
            set(),
            False,
        )

    def check(self, pods: list, machines: int) -> None:
        if self.running:
            return
        waiting = {p.metadata.name: _waiting(p) for p in pods if p.status.phase in (None, "Pending")}
        if len(pods) >= machines and not waiting:
            self.running = True
            return
        for name, why in waiting.items():
            if why and (name, why) not in self.said:
                self.said.add((name, why))
                self.logger.warning("training pod %s waits: %s", name, why)
        if time.monotonic() - self.started > self.timeout:
            whys = "; ".join(f"{n}: {w or 'pending'}" for n, w in waiting.items()) or "no pods created"
            raise RuntimeError(
                f"the training pods did not all run within {self.timeout:.0f} s ({START_TIMEOUT_ENV}): {whys}"
            )


def _waiting(pod) -> str | None:
    """Why a pending pod waits: its container's waiting reason, else the scheduler's, or None."""
    for status in pod.status.container_statuses or []:
        if status.state and status.state.waiting and status.state.waiting.reason:
            return f"{status.state.waiting.reason} {status.state.waiting.message or ''}".strip()
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason} {condition.message or ''}".strip()
    return None


def _terminated(pod):
    statuses = pod.status.container_statuses or []
    return statuses[0].state.terminated if statuses and statuses[0].state else None


def _finished(status) -> str | None:
    """'Complete' or 'Failed' once the Job ended, else None."""
    for condition in status.conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return condition.type
    return None


def failure(pods: list, logs: PodLogs, name: str) -> Exception:
    """The exception for a failed Job: from the pod that failed first (the others were stopped after it)."""
    failed = [(t, p) for p in pods if (t := _terminated(p)) is not None and t.exit_code != 0]
    if not failed:
        return RuntimeError(f"training Job {name} failed without a failed pod (deleted, or its deadline passed)")
    terminated, pod = min(failed, key=lambda f: f[0].finished_at.timestamp() if f[0].finished_at else float("inf"))
    pod_name, code, tail = pod.metadata.name, terminated.exit_code, logs.tail(pod.metadata.name)
    # The node's last "grpoflow: " line is the one-line reason of a stop on purpose (its exit 2 or 3).
    reasons = [line.split("grpoflow: ", 1)[1] for line in tail.splitlines() if "grpoflow: " in line]
    reason = reasons[-1] if reasons else None
    if code == SETUP_ERROR_EXIT:
        return TrainingSetupError(f"grpoflow: {reason or f'training pod {pod_name} could not start'}")
    if code == REWARD_FAILED_EXIT:
        return RewardFailed(f"{reason or 'a reward failed'} (pod {pod_name}; logs/train.log)")
    why = f", {terminated.reason}" if terminated.reason else ""
    return RuntimeError(f"training pod {pod_name} exited with code {code}{why}; end of its log:\n{tail}")


def download_results(job: JobDir, location: str) -> list[str]:
    """Downloads what the pods' training produced (training.json, metrics.jsonl, merged/ or adapter/, tracking/ and
    the machines' own logs) into the local job folder, keeping each file's remote modification time (so the job's
    end does not upload them again). Returns the names downloaded."""
    fs, remote = filesystem(location)
    remote, names = remote.rstrip("/"), []
    for path, info in fs.find(remote, detail=True).items():
        rel = path.removeprefix(remote + "/")
        top = rel.split("/", 1)[0]
        if top not in ("training.json", "metrics.jsonl", "merged", "adapter", "tracking") and not (
            rel.startswith("logs/machine-")
        ):
            continue
        (job.root / rel).parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(job.root / rel))
        if isinstance(modified := info.get("LastModified"), datetime):
            os.utime(job.root / rel, (modified.timestamp(), modified.timestamp()))
        names.append(rel)
    return names


def run_on_machines(job: JobDir, spec: JobSpec, poll: Callable[[], str | None] | None = None) -> float:
    """Runs the training stage as an indexed Job over `distributed.num_machines` pods and returns its wall time.

    Args:
        job (`JobDir`): the local (staging) job folder; uploaded first, the results downloaded into it at the end.
        spec (`JobSpec`): the job's spec; its output_uri is remote (the spec rules reject a local one).
        poll (`Callable`, *optional*): called every `POLL_S` seconds (the progress watcher); a reason it returns
            stops the Job and raises `TrainingStopped`.

    Raises:
        `TrainingSetupError`: no Kubernetes API or image, or a pod exited 2. `RewardFailed`: a pod exited 3.
        `TrainingStopped`: `poll` stopped it. `RuntimeError`: a pod failed otherwise (retried by Prefect).
    """
    logger, started = get_run_logger(), time.monotonic()
    location = join(spec.output_uri, job.job_id)
    kube = Kube()
    try:
        settings = pod_settings(kube)
        upload_job(job, spec)  # the pods start from the store: spec, dataset, sft, checkpoints
        name = run_name(job.job_id)
        # Picked once for every pod, before any starts (a rank 0 that started would soon upload and prune).
        checkpoint = complete_checkpoint(location, spec.distributed.num_machines)
        if checkpoint:
            logger.info("%s on %s: every machine resumes from it", checkpoint, location)
        try:
            _run_job(kube, job, spec, location, name, settings, poll, logger, checkpoint)
        finally:
            kube.delete(name, settings.namespace)
            logger.info("training Job %s and its Service deleted", name)
    finally:
        kube.close()
    downloaded = download_results(job, location)
    logger.info("training results downloaded from %s: %d files", location, len(downloaded))
    return round(time.monotonic() - started, 3)


def _run_job(kube: Kube, job: JobDir, spec: JobSpec, location: str, name: str, settings, poll, logger, checkpoint):
    namespace = settings.namespace
    kube.call(kube.core.create_namespaced_service(namespace, service_manifest(name, settings)))
    kube.call(kube.batch.create_namespaced_job(namespace, job_manifest(spec, location, name, settings, checkpoint)))
    logger.info(
        "training Job %s created in namespace %s: %d machines x %d GPUs, image %s",
        name,
        namespace,
        spec.distributed.num_machines,
        spec.gpu_count,
        settings.image,
    )
    logs, metrics = PodLogs(kube, namespace, job.logs / "train.log"), MetricsMirror(job, location)
    waiting = StartWatch(float(os.environ.get(START_TIMEOUT_ENV) or START_TIMEOUT_S), logger)
    while True:
        status = kube.call(kube.batch.read_namespaced_job_status(name, namespace)).status
        pods = kube.call(kube.core.list_namespaced_pod(namespace, label_selector=f"{LABEL}={name}")).items
        logs.poll(pods)
        metrics.poll()
        waiting.check(pods, spec.distributed.num_machines)
        if poll and (reason := poll()):
            raise TrainingStopped(reason)
        if (ended := _finished(status)) is not None:
            break
        time.sleep(POLL_S)
    # The pods as they ended, and the last of their logs and metrics.
    pods = kube.call(kube.core.list_namespaced_pod(namespace, label_selector=f"{LABEL}={name}")).items
    logs.poll(pods)
    if ended == "Failed":
        raise failure(pods, logs, name)
    metrics.poll()
    if poll and (reason := poll()):
        raise TrainingStopped(reason)
    logger.info("training Job %s completed on all %d machines", name, status.succeeded or 0)
