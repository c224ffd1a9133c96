"""Several machines per training job (`distributed.num_machines` > 1): the training stage as a Kubernetes indexed Job.

`run_on_machines(job, spec, poll)` is what `grpoflow.tasks.train.train_task` runs instead of a local child. It uploads
the job folder to the spec's `s3://` output_uri (pods share no disk), creates a headless Service and an indexed Job of
`num_machines` pods (completionMode Indexed: pod `<name>-<i>` gets JOB_COMPLETION_INDEX=i and, through the Service's
`subdomain`, the DNS name `<name>-<i>.<name>.<namespace>.svc`), and watches it to its end: each pod runs `python -m
grpoflow.cluster.node` (the node entry: download the job folder and newest intact checkpoint, `accelerate launch
--num_machines N --machine_rank i --main_process_ip <name>-0...`, rank 0 uploading checkpoints as they are saved and
the results at the end). The pods' logs are copied into `logs/train.log` (one `[rank i]` prefix per pod) and
`metrics.jsonl` is read back from the store while they train, so the progress lines, events and health monitor work as
for one machine.

Every index succeeded: the results (training.json, merged/ or adapter/, metrics.jsonl) are downloaded into the local
job folder. A pod that failed: `RuntimeError` naming the pod, its exit code and the end of its log (Prefect's retry
creates a new Job, which resumes from the newest checkpoint on the store); a pod that exited 2 or 3 (the child's
setup error or failed reward, `grpoflow.trainers.launch`): `TrainingSetupError` / `RewardFailed`, not retried. The Job
(with its pods) and the Service are deleted however the task ends.

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

import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from prefect import get_run_logger

from grpoflow.cluster.kube import LABEL, Kube, job_manifest, pod_settings, run_name, service_manifest
from grpoflow.cluster.node import complete_checkpoint
from grpoflow.integrations.jobs import upload_job
from grpoflow.integrations.storage import filesystem, join
from grpoflow.trainers.jobdir import JobDir, write_text_atomic
from grpoflow.trainers.launch import (
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    RewardFailed,
    TrainingSetupError,
    TrainingStopped,
)
from grpoflow.trainers.spec import JobSpec

POLL_S = 2.0
START_TIMEOUT_ENV = "GRPOFLOW_K8S_START_TIMEOUT_S"
START_TIMEOUT_S = (
    1800.0  # the most the pods may wait to run (image pull, GPU nodes scaling up) before the attempt fails
)
LOG_BYTES_PER_S = 500_000  # a pod's log is read whole: a long one less often


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
