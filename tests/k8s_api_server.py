"""A Kubernetes API on 127.0.0.1 for the tests of `cluster/multinode.py`: the endpoints its client (`cluster/kube.py`)
calls, serving Kubeflow Trainer's TrainJob resource, whose nodes are real local processes.

    with KubeApiServer(tmp_path, secrets={"grpoflow-s3": {...}}) as api:
        api.kubeconfig  # a kubeconfig file pointing at it (KUBECONFIG=...)

What it serves (JSON, as the real API server does): create, read and delete of TrainJobs
(`/apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs`), list pods by label (`?labelSelector=k=v`), read a pod
(also those a test puts in `static_pods`) and its log. It plays Kubeflow Trainer's controller with the
torch-distributed runtime: creating a TrainJob starts `trainer.numNodes` pods at once (none while `spec.suspend` is
true: the TrainJob is `Suspended`, as Kueue holds it, until `admit(name)`), each the trainer's `command` + `args` in a
process tree of its own (`python` is this interpreter, the working folder the repository: the image's), with the
trainer's `env` and the runtime patches' (values; `secretKeyRef` from `secrets`, as the kubelet resolves it), the torch
runtime's PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR (127.0.0.1) and PET_MASTER_PORT (with the
canary's PET_MASTER_PORT + 1, reserved for the TrainJob by `tests/ports.py` until the server stops), and none of
this process's AWS_*, KUBECONFIG or GRPOFLOW_* variables. A PersistentVolumeClaim mounted by the patches is one folder
shared by every node: the mount path itself (the flow run's pod mounts it at the same path). The TrainJob fails
(condition Failed; the other pods stopped) once a pod exits non-zero, and completes once every pod exited 0. Deleting
it kills its pods. `kill(name, index)` SIGKILLs a pod's whole tree, as a node lost; `node_env[index]` sets variables
on that node over the runtime's (a wrong PET_MASTER_PORT: a node that cannot reach the others).
"""

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psutil

from tests.ports import reserve_ports

REPO = Path(__file__).resolve().parents[1]
STOP_GRACE_S = 10.0  # terminationGracePeriodSeconds' default is 30; a test waits less


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kill_tree(pid: int, sig: int) -> None:
    """`sig` to the process `pid` and every descendant (the training child is in a session of its own)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def node_spec(trainjob: dict) -> tuple[dict, list[dict]]:
    """The node container the torch-distributed runtime runs (the trainer's image, command, args, env, resources)
    with the runtime patches' env and volume mounts merged in, and the patches' volumes."""
    trainer = trainjob["spec"]["trainer"]
    container = {
        "name": "node",
        "image": trainer.get("image", "pytorch/pytorch"),
        "command": trainer.get("command", []),
        "args": trainer.get("args", []),
        "env": list(trainer.get("env", [])),
        "volumeMounts": [],
    }
    volumes = []
    for patch in trainjob["spec"].get("runtimePatches", []):
        jobset = (patch.get("trainingRuntimeSpec") or {}).get("template", {}).get("spec", {})
        for replicated in jobset.get("replicatedJobs", []):
            pod = replicated.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            volumes += pod.get("volumes", [])
            for patched in pod.get("containers", []):
                if patched.get("name") == "node":
                    container["env"] += patched.get("env", [])
                    container["volumeMounts"] += patched.get("volumeMounts", [])
    return container, volumes


class Pod:
    """One node of a TrainJob: a process running the node container's command."""

    def __init__(
        self, trainjob: dict, index: int, root: Path, secrets_: dict, port: int, pull_error: str | None, extra: dict
    ):
        name = trainjob["metadata"]["name"]
        container, volumes = node_spec(trainjob)
        nodes = trainjob["spec"]["trainer"].get("numNodes", 1)
        self.name, self.namespace = (
            f"{name}-node-0-{index}-{secrets.token_hex(3)[:5]}",
            trainjob["metadata"]["namespace"],
        )
        self.index, self.job_name, self.container = index, name, container
        self.labels = {
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "batch.kubernetes.io/job-completion-index": str(index),
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
        }
        self.dir = root / self.name
        self.dir.mkdir(parents=True)
        self.log = self.dir / "container.log"
        claims = {v["name"] for v in volumes if "persistentVolumeClaim" in v}
        # A claim is shared by every node: its mount path is the one folder (it exists: the flow run's pod mounts it).
        self.mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"] if m["name"] in claims}
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KUBE", "GRPOFLOW_")) and k != "HOSTNAME"
        }
        for entry in container["env"]:
            if "value" in entry:
                env[entry["name"]] = entry["value"]
            elif ref := entry.get("valueFrom", {}).get("secretKeyRef"):
                value = secrets_.get(ref["name"], {}).get(ref["key"])
                if value is None and not ref.get("optional"):
                    raise ValueError(f"secret {ref['name']} has no key {ref['key']}")
                if value is not None:
                    env[entry["name"]] = value
        env |= {
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": str(trainjob["spec"]["trainer"].get("numProcPerNode", 1)),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
            "JOB_COMPLETION_INDEX": str(index),
            "HOSTNAME": self.name,
        } | extra
        command = [*container["command"], *container["args"]]
        command = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(command)]
        self.command, self.env = command, env
        self.started_at, self.finished_at, self.stopping = _now(), None, False
        self.pull_error, self.proc = pull_error, None
        if pull_error:  # the image never comes: the pod stays Pending, its container waiting
            return
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def exit_code(self) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is not None and self.finished_at is None:
            self.finished_at = _now()
        return None if code is None else (128 - code if code < 0 else code)  # a signal: 128 + its number

    def stop(self) -> None:
        """What the kubelet does to a pod it deletes: SIGTERM, SIGKILL after the grace period."""
        if self.proc is None:
            return
        if self.proc.poll() is None and not self.stopping:
            self.stopping = True
            kill_tree(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        kill_tree(self.proc.pid, signal.SIGKILL)  # anything of it that outlived it
        self.exit_code  # noqa: B018 (records the finish time)

    def to_dict(self) -> dict:
        code = self.exit_code
        if self.pull_error:
            state, phase = {"waiting": {"reason": "ImagePullBackOff", "message": self.pull_error}}, "Pending"
        elif code is None:
            state, phase = {"running": {"startedAt": self.started_at}}, "Running"
        else:
            reason = "Completed" if code == 0 else "Error"
            terminated = {"exitCode": code, "reason": reason, "startedAt": self.started_at}
            state, phase = (
                {"terminated": terminated | {"finishedAt": self.finished_at}},
                "Failed" if code else "Succeeded",
            )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
            "spec": {"containers": [self.container]},
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": self.container["name"],
                        "image": self.container["image"],
                        "imageID": "",
                        "ready": code is None,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            },
        }


class KubeApiServer:
    """The test API server; a context manager that stops every pod on exit. `requests` lists (method, path)."""

    def __init__(self, root: Path, secrets: dict | None = None):
        self.root, self.secrets = root, secrets or {}
        self.pull_error: str | None = None  # set: the pods of the TrainJobs created next never start (no image)
        self.node_env: dict[int, dict] = {}  # node index -> env over the runtime's (a wrong PET_MASTER_PORT, say)
        root.mkdir(parents=True, exist_ok=True)
        self.trainjobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], list[Pod]] = {}  # by TrainJob
        self.started: list[Pod] = []  # every pod ever started, deleted ones too
        self.static_pods: dict[tuple[str, str], dict] = {}  # pods with no process: the flow run's own, say
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self.ports = contextlib.ExitStack()  # each TrainJob's rendezvous ports, held until the server stops
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.kubeconfig = root / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
                    "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "tester"}}],
                    "current-context": "loopback",
                }
            )
        )

    def __enter__(self) -> "KubeApiServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        for pods in self.pods.values():
            for pod in pods:
                pod.stop()
        self.ports.close()

    # --- what a test does besides the API -------------------------------------------------------------------------

    def kill(self, name: str, index: int) -> Pod:
        """SIGKILLs the pod of TrainJob `name` at node `index` with everything in it (its node lost); returns it."""
        for (_, job), pods in self.pods.items():
            if job == name:
                pod = next(p for p in pods if p.index == index)
                kill_tree(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
                return pod
        raise KeyError(name)

    def admit(self, name: str) -> None:
        """What Kueue does once the TrainJob's queue has room: unsuspends it, so its pods start."""
        with self.lock:
            key = next(k for k in self.trainjobs if k[1] == name)
            self.trainjobs[key]["spec"]["suspend"] = False
            self._start(key)

    def live_processes(self) -> list[int]:
        """The pids of pods' processes (and their descendants) still running."""
        alive = []
        for pods in self.pods.values():
            for pod in pods:
                if pod.proc is None:
                    continue
                try:
                    root = psutil.Process(pod.proc.pid)
                    alive += [p.pid for p in [root, *root.children(recursive=True)] if p.status() != "zombie"]
                except psutil.NoSuchProcess:
                    pass
        return alive

    # --- Kubeflow Trainer's controller ------------------------------------------------------------------------------

    def _start(self, key: tuple[str, str]) -> None:
        body, root, port = self.trainjobs[key], self.root / "pods", self.ports.enter_context(reserve_ports())
        nodes = range(body["spec"]["trainer"].get("numNodes", 1))
        self.pods[key] = [
            Pod(body, i, root, self.secrets, port, self.pull_error, self.node_env.get(i, {})) for i in nodes
        ]
        self.started += self.pods[key]

    def _status(self, key: tuple[str, str]) -> dict:
        trainjob, pods = self.trainjobs[key], self.pods.get(key, [])
        if trainjob["spec"].get("suspend"):
            condition = {
                "type": "Suspended",
                "status": "True",
                "reason": "Suspended",
                "message": "TrainJob is suspended",
            }
            return {"conditions": [condition | {"lastTransitionTime": _now()}]}
        codes = [p.exit_code for p in pods]
        if any(c not in (None, 0) for c in codes):
            for pod in pods:  # the JobSet fails and its other pods are stopped
                if pod.exit_code is None:
                    threading.Thread(target=pod.stop, daemon=True).start()
            condition = {"type": "Failed", "status": "True", "reason": "TrainJobFailed", "message": "jobset failed"}
            return {"conditions": [condition | {"lastTransitionTime": _now()}]}
        if pods and codes.count(0) == len(pods):
            condition = {"type": "Complete", "status": "True", "reason": "TrainJobComplete", "message": "done"}
            return {"conditions": [condition | {"lastTransitionTime": _now()}]}
        return {"conditions": []}

    # --- HTTP -----------------------------------------------------------------------------------------------------

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                server.requests.append((method, url.path))
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with server.lock:
                    code, body = server._dispatch(method, url.path, query, self)
                self._send(code, body, "text/plain" if isinstance(body, str) else "application/json")

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_DELETE(self):
                self._route("DELETE")

        return Handler

    def _dispatch(self, method: str, path: str, query: dict, handler) -> tuple[int, dict | str]:
        m = re.fullmatch(r"/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?", path)
        if m:
            return self._trainjobs(method, m.group(1), m.group(2), handler)
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?", path)
        if m and method == "GET":
            return self._pods(m.group(1), m.group(2), bool(m.group(3)), query)
        return 404, _status_body(404, "NotFound", f"no route {method} {path}")

    def _trainjobs(self, method: str, namespace: str, name: str | None, handler) -> tuple[int, dict]:
        if method == "POST":
            body = handler._body()
            if body.get("kind") != "TrainJob" or body.get("apiVersion") != "trainer.kubeflow.org/v1alpha1":
                return 400, _status_body(400, "BadRequest", "not a trainer.kubeflow.org/v1alpha1 TrainJob")
            key = (namespace, body["metadata"]["name"])
            if key in self.trainjobs:
                return 409, _status_body(409, "AlreadyExists", f"{key[1]} already exists")
            body["metadata"] |= {"uid": secrets.token_hex(8), "creationTimestamp": _now(), "namespace": namespace}
            self.trainjobs[key] = body
            if not body["spec"].get("suspend"):
                self._start(key)
            return 201, body
        key = (namespace, name)
        if key not in self.trainjobs:
            return 404, _status_body(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
        if method == "DELETE":
            trainjob = self.trainjobs.pop(key)
            for pod in self.pods.pop(key, []):
                pod.stop()
            return 200, _status_body(200, "", f"{trainjob['metadata']['name']} deleted") | {"status": "Success"}
        return 200, self.trainjobs[key] | {"status": self._status(key)}

    def _pods(self, namespace: str, name: str | None, log: bool, query: dict) -> tuple[int, dict | str]:
        pods = [p for (ns, _), ps in self.pods.items() if ns == namespace for p in ps]
        if name is None:
            selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", "").split(",") if kv)
            items = [p.to_dict() for p in pods if all(p.labels.get(k) == v for k, v in selector.items())]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if (namespace, name) in self.static_pods and not log:
            return 200, self.static_pods[(namespace, name)]
        pod = next((p for p in pods if p.name == name), None)
        if pod is None:
            return 404, _status_body(404, "NotFound", f'pods "{name}" not found')
        if log and pod.proc is None:
            return 400, _status_body(400, "BadRequest", f'container in pod "{name}" is waiting to start')
        return 200, pod.log.read_text(errors="replace") if log else pod.to_dict()


def _status_body(code: int, reason: str, message: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def wait_for(condition, timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(every)
    return bool(condition())
