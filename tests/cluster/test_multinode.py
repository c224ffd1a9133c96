"""Several machines per training job (`cluster/multinode.py`, `cluster/node.py`), without a cluster: every "machine" is
its own process tree on loopback (gloo over 127.0.0.1) with its own staging folder, fed from the S3-protocol server
(moto); and the training task's create/watch/logs/cleanup path against a Kubernetes API on loopback
(`tests/k8s_api_server.py`) whose pods are real local processes running the Job's container command."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import s3fs

from grpoflow.cluster import kube as k8s
from grpoflow.cluster import multinode
from grpoflow.cluster.node import complete_checkpoint
from grpoflow.integrations.checkpoint_sync import FileMirror, newest_remote_checkpoint
from grpoflow.tasks.train import train_task
from grpoflow.trainers.jobdir import JobDir
from grpoflow.trainers.launch import Machines, RewardFailed, TrainingSetupError, accelerate_command, child_command
from grpoflow.trainers.metrics import read_events, read_metrics
from tests.integrations.test_artifacts import flow_run_logs
from tests.k8s_api_server import KubeApiServer, wait_for

REPO = Path(__file__).resolve().parents[2]
SPEC = {
    "hyperparameters": {"max_steps": 4, "rollouts_per_prompt": 2, "max_response_length": 4},
    "checkpoint_every": 2,
    "evaluation": {"holdout": 0},
    "distributed": {"num_machines": 2},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote_job(make_job, bucket: str, name: str, **changes) -> tuple[JobDir, str]:
    """A job folder as create-job and ingest leave it, uploaded to `s3://<bucket>/runs/<job_id>`, as the training
    task uploads it before it creates the Job."""
    job, spec = make_job(name, output_uri=f"s3://{bucket}/runs", **{**SPEC, **changes})
    FileMirror(s3fs.S3FileSystem(), job, f"{bucket}/runs/{job.job_id}").push()
    return job, f"s3://{bucket}/runs/{job.job_id}"


def remote_steps(location: str) -> list[int]:
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return [json.loads(line)["step"] for line in fs.cat(f"{location}/metrics.jsonl").splitlines()]


# --- the launch command ----------------------------------------------------------------------------------------------


def test_child_command_spans_machines(tmp_path):
    job = JobDir(tmp_path / "job")
    command = child_command("grpoflow.trainers.grpo", job, 8, "ddp", Machines(4, 3, "grpo-x-0.grpo-x.ml.svc", 29500))
    assert command[:2] == [accelerate_command(), "launch"]
    args = {flag: command[command.index(flag) + 1] for flag in command if flag.startswith("--")}
    assert args["--num_machines"] == "4" and args["--machine_rank"] == "3"
    assert args["--main_process_ip"] == "grpo-x-0.grpo-x.ml.svc" and args["--main_process_port"] == "29500"
    assert args["--num_processes"] == "32"  # every machine's
    # One process per machine still goes through accelerate launch (the rendezvous is its).
    one = child_command("grpoflow.trainers.grpo", job, 1, "ddp", Machines(2, 0, "127.0.0.1"))
    assert "--multi_gpu" in one and one[one.index("--num_processes") + 1] == "2"
    assert child_command("grpoflow.trainers.grpo", job, 1, "ddp") == [
        sys.executable,
        "-m",
        "grpoflow.trainers.grpo",
        str(job.root),
    ]


# --- two machines on loopback ----------------------------------------------------------------------------------------


def start_node(location: str, rank: int, port: int, staging: Path, s3_env: dict, log: Path) -> subprocess.Popen:
    """One "machine": `python -m grpoflow.cluster.node` as a pod runs it, with its own staging folder and
    JOB_COMPLETION_INDEX."""
    env = {
        **os.environ,
        **s3_env,
        "JOB_COMPLETION_INDEX": str(rank),
        "GRPOFLOW_STAGING_DIR": str(staging),
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "grpoflow.cluster.node", location, "--main-process-ip", "127.0.0.1"]
    command += ["--main-process-port", str(port)]
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_two_machines_train_one_job_on_loopback(make_job, bucket, s3_env, tmp_path):
    job, location = remote_job(make_job, bucket, "two")
    port, logs = free_port(), [tmp_path / "node-0.log", tmp_path / "node-1.log"]
    nodes = [start_node(location, r, port, tmp_path / f"machine-{r}", s3_env, logs[r]) for r in (0, 1)]
    try:
        codes = [node.wait(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    out = [log.read_text() for log in logs]
    assert codes == [0, 0], out
    # Both ranks took part: one gloo group of two processes, and the second machine's own child trained every step.
    assert "distributed: ddp over 2 process(es)" in out[0]
    assert "machine 1 of 2" in out[1] and "machine 1 done" in out[1]
    other = JobDir(tmp_path / "machine-1" / job.job_id)
    assert json.loads(other.training_result.read_text())["global_step"] == 4
    assert not (tmp_path / "machine-1" / job.job_id / "merged").exists()  # only the main process saves
    # The results reached the store, from rank 0 only, each step once.
    assert remote_steps(location) == [1, 2, 3, 4]
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    assert fs.exists(f"{location}/merged/model.safetensors")
    assert json.loads(fs.cat(f"{location}/training.json"))["global_step"] == 4
    assert newest_remote_checkpoint(fs, f"{location.removeprefix('s3://')}/checkpoints")[0].endswith("checkpoint-4")
    assert fs.exists(f"{location}/logs/machine-0.log") and not fs.exists(f"{location}/logs/machine-1.log")
    # The second machine's own checkpoint file (its process's RNG state) is on the store with a manifest of its own.
    checkpoint = f"{location}/checkpoints/checkpoint-4"
    own = json.loads(fs.cat(f"{checkpoint}/grpoflow-checkpoint.machine-1.json"))
    assert list(own["files"]) == ["rng_state_1.pth"] and fs.exists(f"{checkpoint}/rng_state_1.pth")
    assert "rng_state_1.pth" not in json.loads(fs.cat(f"{checkpoint}/grpoflow-checkpoint.json"))["files"]


# --- the training task against a Kubernetes API on loopback ----------------------------------------------------------


@pytest.fixture
def cluster(tmp_path, s3_env, monkeypatch):
    """The loopback Kubernetes API with the S3 Secret the pods take their credentials from, and the flow run's
    environment pointing at it (KUBECONFIG, the image, the namespace, a free rendezvous port)."""
    keys = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}
    secret = {k: v for k, v in s3_env.items() if k in keys} | {"AWS_ENDPOINT_URL_S3": s3_env["AWS_ENDPOINT_URL"]}
    with KubeApiServer(tmp_path / "k8s", secrets={"grpoflow-s3": secret}) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        monkeypatch.setenv(k8s.IMAGE_ENV, "registry.example.com/ml/grpoflow:test")
        monkeypatch.setenv(k8s.NAMESPACE_ENV, "ml")
        monkeypatch.setenv(k8s.PORT_ENV, str(free_port()))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield api


def run_train_task(job: JobDir, spec):
    from prefect import flow

    @flow
    def train():
        return train_task(job, spec)

    return train(return_state=True)


def assert_cleaned_up(api: KubeApiServer, jobs: int) -> None:
    """Every Job and Service the task created is deleted, and no pod's process is left."""
    created = [path for method, path in api.requests if method == "POST" and path.endswith("/jobs")]
    deleted = [path for method, path in api.requests if method == "DELETE" and "/jobs/" in path]
    assert len(created) == len(deleted) == jobs
    assert api.jobs == {} and api.services == {}
    assert wait_for(lambda: not api.live_processes(), 30), api.live_processes()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_train_task_runs_the_training_as_an_indexed_job(make_job, bucket, cluster):
    job, spec = make_job("k8s", output_uri=f"s3://{bucket}/runs", **SPEC)
    state = run_train_task(job, spec)
    summary = state.result()
    assert summary["global_step"] == 4 and summary["resumed_from"] is None
    # The results came back into the task's own job folder; the metrics fed its progress events as they trained.
    assert (job.merged / "model.safetensors").exists()
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3, 4]
    progress = [e["payload"]["step"] for e in read_events(job.events) if e["event"] == "grpoflow.training.progress"]
    assert progress == [1, 2, 3, 4]
    # Both pods' logs are in logs/train.log, one prefix each; rank 0 saw the gloo group of two.
    log = (job.logs / "train.log").read_text()
    assert "[rank 0] grpoflow: distributed: ddp over 2 process(es)" in log
    assert "[rank 1] grpoflow: machine 1 done" in log
    # The pods got the S3 credentials from the Secret (the task's own AWS variables never reach them).
    for pod in cluster.started:
        assert pod.env["AWS_ENDPOINT_URL_S3"] == cluster.secrets["grpoflow-s3"]["AWS_ENDPOINT_URL_S3"]
        assert "AWS_ENDPOINT_URL" not in pod.env
    assert sorted(p.index for p in cluster.started) == [0, 1]
    assert_cleaned_up(cluster, jobs=1)


STEPS = 40


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_killed_machine_fails_the_attempt_and_the_retry_resumes(make_job, bucket, cluster):
    """Index 1 is SIGKILLed (its node lost) once a checkpoint reached the store: the attempt fails naming that pod
    and its exit code, Prefect's retry creates a new Job, whose pods resume from the checkpoint on the store."""
    job, spec = make_job(
        "lost",
        output_uri=f"s3://{bucket}/runs",
        # Steps of a tenth of a second: enough of them that the kill lands mid-run, and the checkpoints kept (not
        # rotated away within a second, before the second machine's files of them reach the store).
        **{
            **SPEC,
            "hyperparameters": {**SPEC["hyperparameters"], "max_steps": STEPS},
            "checkpoint_every": 4,
            "trl": {"save_total_limit": STEPS},
        },
    )
    location, killed = f"s3://{bucket}/runs/{job.job_id}", {}

    def kill_index_1():
        while not killed:
            # Once a checkpoint both machines can resume from is on the store (rank 0's files and machine 1's own).
            if (found := complete_checkpoint(location, 2)) and len(cluster.jobs) == 1:
                [(_, name)] = list(cluster.jobs)
                killed.update(pod=cluster.kill(name, 1).name, at=int(found.rsplit("-", 1)[1]))
            time.sleep(0.2)

    killer = threading.Thread(target=kill_index_1, daemon=True)
    killer.start()
    state = run_train_task(job, spec)
    summary = state.result()
    assert killed and 2 <= killed["at"] < STEPS
    messages = flow_run_logs(state.state_details.flow_run_id)
    failed = [m for m in messages if f"training pod {killed['pod']} exited with code 137" in m]
    assert failed, messages
    assert int(summary["resumed_from"].rsplit("-", 1)[1]) >= killed["at"]  # from the store, not from scratch
    assert summary["global_step"] == STEPS
    assert [r["step"] for r in read_metrics(job.metrics)] == list(range(1, STEPS + 1))  # every step exactly once
    assert remote_steps(location) == list(range(1, STEPS + 1))
    # The retry's second machine took its own files of the checkpoint too (its RNG state: only its disk had it).
    log = (job.logs / "train.log").read_text()
    assert f"[rank 1] grpoflow: {summary['resumed_from']} downloaded (1 files of this machine's own)" in log, log
    assert_cleaned_up(cluster, jobs=2)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_reward_that_fails_on_the_pods_is_not_retried(make_job, bucket, cluster):
    """A reward raising at training step 3 on every rank: the pods exit 3 (the child's record), the task raises
    RewardFailed naming the reward and the step, and creates no second Job."""
    rewards = [{"name": "mine", "function": "tests.bad_inputs.rewards.from_step3:raises_reward"}]
    job, spec = make_job("fault", output_uri=f"s3://{bucket}/runs", rewards=rewards, **SPEC)
    state = run_train_task(job, spec)
    with pytest.raises(RewardFailed, match="reward 'mine' raised KeyError: 'solution' at training step 3"):
        state.result()
    assert_cleaned_up(cluster, jobs=1)


@pytest.mark.usefixtures("prefect_server")
def test_a_pod_that_cannot_start_is_a_setup_error(make_job, bucket, cluster):
    """A pod's exit 2 (here: the job folder is not on the store) is a TrainingSetupError with the pod's reason, not
    retried; the Job and Service are deleted."""
    job, spec = make_job("nofolder", output_uri=f"s3://{bucket}/runs", **SPEC)
    original = multinode.upload_job
    multinode.upload_job = lambda job, spec: None  # the task's upload skipped: the pods find no spec.yaml
    try:
        state = run_train_task(job, spec)
    finally:
        multinode.upload_job = original
    with pytest.raises(TrainingSetupError, match=r"no spec.yaml at s3://.*: the training task uploads the job first"):
        state.result()
    assert_cleaned_up(cluster, jobs=1)  # once: a setup error is not retried


def test_no_kubernetes_api_is_a_setup_error_naming_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(TrainingSetupError, match="in-cluster: KUBERNETES_SERVICE_HOST .* or set KUBECONFIG"):
        k8s.Kube()


def test_no_kubernetes_client_is_a_setup_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes_asyncio.client", None)  # as if not installed
    with pytest.raises(TrainingSetupError, match=r"pip install 'grpoflow\[kubernetes\]'"):
        k8s.Kube()


def test_no_image_is_a_setup_error_naming_the_variable(cluster, monkeypatch):
    monkeypatch.delenv(k8s.IMAGE_ENV)
    monkeypatch.setenv("HOSTNAME", "not-a-pod")  # e.g. a worker outside the cluster, with a kubeconfig
    kube = k8s.Kube()
    try:
        with pytest.raises(TrainingSetupError, match=f"set {k8s.IMAGE_ENV}"):
            k8s.pod_settings(kube)
    finally:
        kube.close()
    assert ("GET", "/api/v1/namespaces/ml/pods/not-a-pod") in cluster.requests  # it looked for its own pod


def test_the_pods_take_image_and_scheduling_from_the_flow_runs_own_pod(cluster, monkeypatch):
    """Without GRPOFLOW_IMAGE, a flow run in a pod (the grpo-k8s pool's) gives the training pods its own image,
    service account, nodeSelector and tolerations: they land on the same kind of GPU node."""
    monkeypatch.delenv(k8s.IMAGE_ENV)
    monkeypatch.setenv("HOSTNAME", "flow-run-pod")
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    cluster.static_pods[("ml", "flow-run-pod")] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "flow-run-pod", "namespace": "ml"},
        "spec": {
            "containers": [{"name": "prefect-job", "image": "registry.example.com/ml/grpoflow:20261201"}],
            "serviceAccountName": "grpoflow-trainer",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [toleration],
        },
    }
    kube = k8s.Kube()
    try:
        settings = k8s.pod_settings(kube)
    finally:
        kube.close()
    assert settings.image == "registry.example.com/ml/grpoflow:20261201" and settings.namespace == "ml"
    assert settings.service_account == "grpoflow-trainer" and settings.tolerations == [toleration]
    assert settings.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.usefixtures("prefect_server")
def test_pods_that_never_run_fail_the_attempt_naming_why(make_job, bucket, cluster, monkeypatch):
    """Pods stuck Pending (an image that cannot be pulled, no GPU node) fail the attempt after
    GRPOFLOW_K8S_START_TIMEOUT_S, naming each pod and its reason; the Job and Service are deleted."""
    monkeypatch.setenv(multinode.START_TIMEOUT_ENV, "3")
    monkeypatch.setattr(k8s.Kube, "own_pod", lambda self, namespace: None)
    cluster.pull_error = 'failed to pull "registry.example.com/ml/grpoflow:test": not found'
    job, spec = make_job("pending", output_uri=f"s3://{bucket}/runs", **SPEC)
    from prefect import flow

    @flow
    def once():
        return train_task.with_options(retries=0)(job, spec)

    state = once(return_state=True)
    with pytest.raises(RuntimeError, match=r"did not all run within 3 s .*-0-\w+: ImagePullBackOff failed to pull"):
        state.result()
    assert_cleaned_up(cluster, jobs=1)
