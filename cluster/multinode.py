"""Several machines per training job (`distributed.num_machines` > 1): the training stage as a Kubeflow Trainer
TrainJob.

`run_on_machines(job, spec, poll)` is what `grpoflow.tasks.train.train_task` runs instead of a local child. It creates
one TrainJob (`trainer.kubeflow.org/v1alpha1`, `grpoflow.cluster.trainjob`): Kubeflow Trainer's controller makes its
JobSet, one pod per node with `gpu_count` GPUs, sets the torch rendezvous environment on every node and restarts or
fails the set by its runtime's policy; Kueue may hold it suspended in a queue. Every node runs `python -m
grpoflow.cluster.node <job folder>` on the shared volume (`distributed.shared_volume`), which is mounted at the same
path in the flow run's pod: the nodes read the spec and dataset from the job folder and write their checkpoints,
metrics and results into it, so nothing is downloaded or uploaded here, and the job folder reaches the spec's
`output_uri` the way a one-machine job's does (checkpoints as they are saved, the rest when the job ends).

The task watches the TrainJob's status conditions (`Suspended`, `Complete`, `Failed`) and its pods: their logs go into
`logs/train.log` (one `[node i]` prefix per pod), pods that never run fail the attempt after
GRPOFLOW_K8S_START_TIMEOUT_S (a suspended TrainJob waits in its queue without that limit). Complete: done. Failed: the
node that failed first names why; its exit 2 (the child's setup error) is a `TrainingSetupError`, its exit 3 (a failed
reward) a `RewardFailed` and its exit 4 (NaN or inf) a `TrainingStopped`, none retried; anything else is one failed
attempt, which Prefect's retry resumes from the newest checkpoint on the shared volume with a new TrainJob. A TrainJob
deleted by someone else fails the attempt too. The TrainJob (its pods with it) is deleted however the task ends.

Where things come from (environment of the flow run, e.g. the work pool's `env` job variable):

| what | from |
| --- | --- |
| the API | in-cluster service account (KUBERNETES_SERVICE_HOST and its token), else KUBECONFIG (or ~/.kube/config) |
| namespace | GRPOFLOW_K8S_NAMESPACE, else the service account's namespace file, else `default` |
| image | GRPOFLOW_IMAGE, else the image of the flow run's own pod (HOSTNAME) |
| service account, nodeSelector, tolerations | GRPOFLOW_K8S_SERVICE_ACCOUNT, else the flow run's own pod's |
| S3 credentials | the Secret GRPOFLOW_S3_SECRET (default `grpoflow-s3`, as the grpo-k8s pool's `s3_secret`) |
| how long the pods may wait to run | GRPOFLOW_K8S_START_TIMEOUT_S (default 1800) |
"""

import os
import time
from collections.abc import Callable
from pathlib import Path

from prefect import get_run_logger

from grpoflow.cluster.kube import Kube, pod_settings, run_name
from grpoflow.cluster.trainjob import GROUP, PLURAL, VERSION, trainjob
from grpoflow.core.errors import (
    DIVERGED_EXIT,
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    RewardFailed,
    TrainingSetupError,
    TrainingStopped,
)
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec

POLL_S = 2.0
START_TIMEOUT_ENV = "GRPOFLOW_K8S_START_TIMEOUT_S"
START_TIMEOUT_S = 1800.0  # the most the pods may wait to run (image pull, GPU nodes scaling up) once admitted
LOG_BYTES_PER_S = 500_000  # a pod's log is read whole: a long one less often
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on every pod of the TrainJob's JobSet (named as the TrainJob)
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


# --- watching the TrainJob -------------------------------------------------------------------------------------------


class PodLogs:
    """Copies the pods' logs into one local file, each line prefixed with the pod's node index; a pod's log is read
    whole each round (kubelet keeps it) and only its new lines are written."""

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
            if new:
                with self.path.open("a") as f:
                    f.writelines(f"[node {node_index(pod)}] {line}\n" for line in new)
            if ended:
                self.done.add(name)

    def tail(self, pod: str) -> str:
        return "\n".join(self.tails.get(pod, []))


def node_index(pod) -> str:
    """A pod's node index: its Job completion index (JobSet's pods carry it)."""
    return (pod.metadata.labels or {}).get(INDEX_LABEL, pod.metadata.name.rsplit("-", 1)[-1])


class StartWatch:
    """Until every pod runs: logs why one waits (once per reason: Unschedulable, ImagePullBackOff, ...) and fails the
    attempt once they waited `timeout` seconds after the TrainJob was admitted, naming the pods and their reasons."""

    def __init__(self, timeout: float, logger):
        self.timeout, self.logger, self.started, self.said, self.running = timeout, logger, None, set(), False

    def check(self, pods: list, machines: int, suspended: bool) -> None:
        if self.running:
            return
        if suspended:  # queued (Kueue): the clock starts once it is admitted
            self.started = None
            return
        self.started = self.started or time.monotonic()
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


def conditions(trainjob_object: dict) -> dict[str, dict]:
    """The TrainJob's status conditions that hold (status True), by type."""
    found = (trainjob_object.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if c.get("status") == "True"}


def failure(pods: list, logs: PodLogs, name: str, condition: dict) -> Exception:
    """The exception for a failed TrainJob: from the pod that failed first (the others were stopped after it)."""
    failed = [(t, p) for p in pods if (t := _terminated(p)) is not None and t.exit_code != 0]
    if not failed:
        why = f"{condition.get('reason', '')}: {condition.get('message', '')}".strip(": ")
        return RuntimeError(f"TrainJob {name} failed without a failed pod ({why or 'no reason given'})")
    terminated, pod = min(failed, key=lambda f: f[0].finished_at.timestamp() if f[0].finished_at else float("inf"))
    pod_name, code, tail = pod.metadata.name, terminated.exit_code, logs.tail(pod.metadata.name)
    # The node's last "grpoflow: " line is the one-line reason of a stop on purpose (its exit 2 or 3).
    reasons = [line.split("grpoflow: ", 1)[1] for line in tail.splitlines() if "grpoflow: " in line]
    reason = reasons[-1] if reasons else None
    if code == SETUP_ERROR_EXIT:
        return TrainingSetupError(f"grpoflow: {reason or f'training pod {pod_name} could not start'}")
    if code == REWARD_FAILED_EXIT:
        return RewardFailed(f"{reason or 'a reward failed'} (pod {pod_name}; logs/train.log)")
    if code == DIVERGED_EXIT:
        return TrainingStopped(reason or f"training diverged on pod {pod_name} (NaN or inf)")
    why = f", {terminated.reason}" if terminated.reason else ""
    return RuntimeError(f"training pod {pod_name} exited with code {code}{why}; end of its log:\n{tail}")


# --- the TrainJob's life ---------------------------------------------------------------------------------------------


class TrainJobs:
    """Create, read and delete of TrainJobs through the Kubernetes API's custom objects."""

    def __init__(self, kube: Kube, namespace: str):
        from kubernetes_asyncio.client import CustomObjectsApi

        self.kube, self.namespace, self.api = kube, namespace, CustomObjectsApi(kube.client)

    def create(self, body: dict) -> None:
        self.kube.call(self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body))

    def read(self, name: str) -> dict | None:
        """The TrainJob, or None when it is gone."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return self.kube.call(self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete(self, name: str) -> None:
        """Deletes the TrainJob (its JobSet and pods with it); one already gone is fine."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            self.kube.call(
                self.api.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Foreground"
                ),
                timeout=60,
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def pods(self, name: str) -> list:
        selector = f"{JOBSET_LABEL}={name}"
        return self.kube.call(self.kube.core.list_namespaced_pod(self.namespace, label_selector=selector)).items


def run_on_machines(
    job: JobDir, spec: JobSpec, poll: Callable[[], str | None] | None = None, canary: JobDir | None = None
) -> float:
    """Runs the training stage (or the canary's step) as a TrainJob over `distributed.num_machines` nodes and returns
    its wall time.

    Args:
        job (`JobDir`): the job folder, on the shared volume (`distributed.shared_volume`).
        spec (`JobSpec`): the job's spec.
        poll (`Callable`, *optional*): called every `POLL_S` seconds (the progress watcher); a reason it returns
            stops the TrainJob and raises `TrainingStopped`.
        canary (`JobDir`, *optional*): the canary's folder inside `job`'s: the nodes meet in one collective and run
            its one step (`grpoflow.cluster.canary`); their logs go to `logs/canary.log`.

    Raises:
        `TrainingSetupError`: no Kubernetes API or image, or a node exited 2. `RewardFailed`: a node exited 3.
        `TrainingStopped`: `poll` stopped it. `RuntimeError`: a node failed otherwise, the pods never ran, or the
            TrainJob was deleted (retried by Prefect).
    """
    logger, started = get_run_logger(), time.monotonic()
    kube = Kube()
    try:
        settings = pod_settings(kube)
        trainjobs, name = TrainJobs(kube, settings.namespace), run_name(job.job_id)
        trainjobs.create(trainjob(spec, job.root, name, settings, canary and canary.root))
        logger.info(
            "TrainJob %s created%s in namespace %s: %d nodes x %d GPUs, runtime %s, image %s, job folder %s "
            "(volume %s)",
            name,
            " for the canary" if canary else "",
            settings.namespace,
            spec.distributed.num_machines,
            spec.gpu_count,
            spec.distributed.runtime,
            settings.image,
            job.root,
            spec.distributed.shared_volume,
        )
        try:
            _watch(trainjobs, name, job, spec, poll, logger, "canary.log" if canary else "train.log")
        finally:
            trainjobs.delete(name)
            logger.info("TrainJob %s deleted", name)
    finally:
        kube.close()
    return round(time.monotonic() - started, 3)


def _watch(trainjobs: TrainJobs, name: str, job: JobDir, spec: JobSpec, poll, logger, log_name: str) -> None:
    logs = PodLogs(trainjobs.kube, trainjobs.namespace, job.logs / log_name)
    waiting = StartWatch(float(os.environ.get(START_TIMEOUT_ENV) or START_TIMEOUT_S), logger)
    said_suspended = False
    while True:
        current = trainjobs.read(name)
        if current is None:
            raise RuntimeError(f"TrainJob {name} was deleted while it trained (not by this task)")
        held = conditions(current)
        pods = trainjobs.pods(name)
        logs.poll(pods)
        suspended = "Suspended" in held or bool(current.get("spec", {}).get("suspend"))
        if suspended and not said_suspended:
            why = held.get("Suspended", {}).get("message") or "suspended (a Kueue queue holds it until admitted)"
            logger.info("TrainJob %s waits: %s", name, why)
        said_suspended = suspended
        waiting.check(pods, spec.distributed.num_machines, suspended)
        if poll and (reason := poll()):
            raise TrainingStopped(reason)
        if "Complete" in held or "Failed" in held:
            break
        time.sleep(POLL_S)
    pods = trainjobs.pods(name)  # the pods as they ended, and the last of their logs
    logs.poll(pods)
    if "Failed" in held:
        raise failure(pods, logs, name, held["Failed"])
    if poll and (reason := poll()):
        raise TrainingStopped(reason)
    logger.info("TrainJob %s completed on all %d nodes", name, spec.distributed.num_machines)
