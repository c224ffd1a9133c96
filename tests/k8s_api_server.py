"""A Kubernetes API on 127.0.0.1 for the tests of `cluster/multinode.py`: the endpoints its client (`cluster/kube.py`)
calls, whose pods are real local processes.

    with KubeApiServer(tmp_path, secrets={"grpoflow-s3": {...}}) as api:
        api.kubeconfig  # a kubeconfig file pointing at it (KUBECONFIG=...)

What it serves (JSON, as the real API server does): create, read (and `/status`) and delete of Jobs
(`/apis/batch/v1/namespaces/NS/jobs`) and Services (`/api/v1/namespaces/NS/services`), list pods by label
(`?labelSelector=k=v`), read a pod (also those a test puts in `static_pods`) and its log. Creating an indexed Job
starts its `completions` pods at once: each is the container's `command` + `args` in a process tree of its own
(`python` is this interpreter, the working folder the repository: the image's), with the container's `env` (values;
`secretKeyRef` from `secrets`, as the kubelet resolves it; JOB_COMPLETION_INDEX and HOSTNAME as the Job controller
and kubelet set them) and none of this process's AWS_*, KUBECONFIG or GRPOFLOW_* variables. Each volume mount is a
folder of the pod's own (an env value or argument under a mount path is moved there), and the rendezvous host,
`<job>-<i>.<subdomain>...`, is 127.0.0.1. The Job fails (condition Failed; the other pods stopped) once a pod exits
non-zero (backoffLimit 0), and completes once every pod exited 0. Deleting it kills its pods. `kill(job, index)`
SIGKILLs a pod's whole tree, as a node lost.
"""

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


class Pod:
    """One pod of a Job: a process running the container's command."""

    def __init__(self, job: dict, index: int, root: Path, secrets_: dict, pull_error: str | None = None):
        name = job["metadata"]["name"]
        spec = job["spec"]["template"]["spec"]
        [container] = spec["containers"]
        self.name, self.namespace = f"{name}-{index}-{secrets.token_hex(3)[:5]}", job["metadata"]["namespace"]
        self.hostname, self.index, self.job_name = f"{name}-{index}", index, name
        self.labels = {
            **job["spec"]["template"]["metadata"]["labels"],
            "job-name": name,
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        self.manifest_spec, self.dir = spec, root / self.name
        self.dir.mkdir(parents=True)
        self.log = self.dir / "container.log"
        mounts = {m["mountPath"]: self.dir / "volumes" / m["name"] for m in container.get("volumeMounts", [])}
        for folder in mounts.values():
            folder.mkdir(parents=True)
        rendezvous = re.compile(rf"^{re.escape(name)}-\d+\.{re.escape(spec.get('subdomain', '-'))}(\..*)?$")

        def local(value: str) -> str:
            if rendezvous.match(value):
                return "127.0.0.1"
            for path, folder in mounts.items():
                if path != "/dev/shm" and (value == path or value.startswith(path + "/")):
                    return str(folder) + value[len(path) :]
            return value

        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KUBE", "GRPOFLOW_")) and k != "HOSTNAME"
        }
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = local(entry["value"])
            elif ref := entry.get("valueFrom", {}).get("secretKeyRef"):
                value = secrets_.get(ref["name"], {}).get(ref["key"])
                if value is None and not ref.get("optional"):
                    raise ValueError(f"secret {ref['name']} has no key {ref['key']}")
                if value is not None:
                    env[entry["name"]] = value
        env |= {"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": self.hostname}
        command = [*container.get("command", []), *container.get("args", [])]
        command = [sys.executable if c == "python" and i == 0 else local(c) for i, c in enumerate(command)]
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
            "spec": {**self.manifest_spec, "hostname": self.hostname},
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": self.manifest_spec["containers"][0]["name"],
                        "image": self.manifest_spec["containers"][0]["image"],
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
        self.pull_error: str | None = None  # set: the pods of the Jobs created next never start (no image)
        root.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[tuple[str, str], dict] = {}
        self.services: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], list[Pod]] = {}  # by job
        self.started: list[Pod] = []  # every pod ever started, deleted ones too
        self.static_pods: dict[tuple[str, str], dict] = {}  # pods with no process: the flow run's own, say
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
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

    # --- what a test does besides the API -------------------------------------------------------------------------

    def kill(self, job: str, index: int) -> Pod:
        """SIGKILLs the pod of `job` at `index` with everything in it (its node lost); returns it."""
        for (_, name), pods in self.pods.items():
            if name == job:
                pod = next(p for p in pods if p.index == index)
                kill_tree(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
                return pod
        raise KeyError(job)

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

    # --- the Job controller ---------------------------------------------------------------------------------------

    def _status(self, key: tuple[str, str]) -> dict:
        job, pods = self.jobs[key], self.pods.get(key, [])
        codes = [p.exit_code for p in pods]
        failed, succeeded = sum(1 for c in codes if c not in (None, 0)), codes.count(0)
        status = {"active": codes.count(None), "succeeded": succeeded, "failed": failed, "startTime": job["_start"]}
        if failed:
            for pod in pods:  # backoffLimit 0: the Job fails and its other pods are stopped
                if pod.exit_code is None:
                    threading.Thread(target=pod.stop, daemon=True).start()
            condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
            status["conditions"] = [condition | {"lastTransitionTime": _now()}]
        elif succeeded == job["spec"]["completions"]:
            status["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": _now()}]
        return status

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
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?", path)
        if m:
            return self._objects(self.services, method, m.group(1), m.group(2), handler)
        m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?(/status)?", path)
        if m:
            return self._jobs(method, m.group(1), m.group(2), handler)
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?", path)
        if m and method == "GET":
            return self._pods(m.group(1), m.group(2), bool(m.group(3)), query)
        return 404, _status_body(404, "NotFound", f"no route {method} {path}")

    def _objects(self, store: dict, method: str, namespace: str, name: str | None, handler) -> tuple[int, dict]:
        if method == "POST":
            body = handler._body()
            key = (namespace, body["metadata"]["name"])
            if key in store:
                return 409, _status_body(409, "AlreadyExists", f"{key[1]} already exists")
            body["metadata"] |= {"uid": secrets.token_hex(8), "creationTimestamp": _now()}
            store[key] = body
            return 201, body
        if (namespace, name) not in store:
            return 404, _status_body(404, "NotFound", f"{name} not found")
        if method == "DELETE":
            return 200, store.pop((namespace, name))
        return 200, store[(namespace, name)]

    def _jobs(self, method: str, namespace: str, name: str | None, handler) -> tuple[int, dict]:
        if method == "POST":
            body = handler._body()
            if body["spec"].get("completionMode") != "Indexed":
                return 422, _status_body(422, "Invalid", "this test server runs indexed Jobs only")
            key = (namespace, body["metadata"]["name"])
            if key in self.jobs:
                return 409, _status_body(409, "AlreadyExists", f"{key[1]} already exists")
            body["metadata"] |= {"uid": secrets.token_hex(8), "creationTimestamp": _now()}
            body["_start"] = _now()
            self.jobs[key] = body
            root = self.root / "pods"
            completions = range(body["spec"]["completions"])
            self.pods[key] = [Pod(body, i, root, self.secrets, self.pull_error) for i in completions]
            self.started += self.pods[key]
            return 201, _public(body)
        key = (namespace, name)
        if key not in self.jobs:
            return 404, _status_body(404, "NotFound", f"jobs.batch {name} not found")
        if method == "DELETE":
            job = self.jobs.pop(key)
            for pod in self.pods.pop(key, []):
                pod.stop()
            return 200, _status_body(200, "", f"{job['metadata']['name']} deleted") | {"status": "Success"}
        return 200, _public(self.jobs[key]) | {"status": self._status(key)}

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


def _public(job: dict) -> dict:
    return {k: v for k, v in job.items() if not k.startswith("_")}


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
