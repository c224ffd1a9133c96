"""Several machines per training job (`cluster/multinode.py`, `cluster/node.py`, `cluster/trainjob.py`), without a
cluster: the training task's create/watch/logs/cleanup of a Kubeflow Trainer TrainJob against a Kubernetes API on
loopback (`tests/k8s_api_server.py`) that serves the TrainJob resource and runs its nodes as real local processes
(gloo over 127.0.0.1) sharing one job folder, as the nodes of a cluster share it on a ReadWriteMany volume."""

import sys
import threading
import time

import pytest

from grpoflow.cluster import kube as k8s
from grpoflow.cluster import multinode
from grpoflow.cluster.node import machines_from_env
from grpoflow.core.errors import RewardFailed, TrainingSetupError
from grpoflow.core.jobdir import JobDir
from grpoflow.jobs.launch import Machines, accelerate_command, child_command
from grpoflow.tasks.train import train_task
from grpoflow.trainers.metrics import read_events, read_metrics
from tests.conftest import standin_env
from tests.integrations.test_artifacts import flow_run_logs
from tests.k8s_api_server import KubeApiServer, wait_for

SPEC = {
    "hyperparameters": {"max_steps": 4, "rollouts_per_prompt": 2, "max_response_length": 4},
    "checkpoint_every": 2,
    "evaluation": {"holdout": 0},
    "distributed": {"num_machines": 2, "shared_volume": "grpoflow-rwx"},
}


# --- the launch command ----------------------------------------------------------------------------------------------


def test_child_command_spans_machines(tmp_path):
    job = JobDir(tmp_path / "job")
    command = child_command("grpoflow.trainers.grpo", job, 8, "ddp", Machines(4, 3, "grpo-x-node-0-0.grpo-x", 29500))
    assert command[:2] == [accelerate_command(), "launch"]
    args = {flag: command[command.index(flag) + 1] for flag in command if flag.startswith("--")}
    assert args["--num_machines"] == "4" and args["--machine_rank"] == "3"
    assert args["--main_process_ip"] == "grpo-x-node-0-0.grpo-x" and args["--main_process_port"] == "29500"
    assert args["--num_processes"] == "32"  # every machine's


def test_a_node_takes_its_place_from_the_torch_runtime():
    env = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "grpo-x-node-0-0.grpo-x",
        "PET_MASTER_PORT": "29400",
    }
    assert machines_from_env(env) == Machines(2, 1, "grpo-x-node-0-0.grpo-x", 29400)
    with pytest.raises(TrainingSetupError, match="PET_NODE_RANK, PET_MASTER_ADDR not set on this node"):
        machines_from_env({"PET_NNODES": "2", "PET_MASTER_PORT": "1"})


# --- the training task against a Kubernetes API on loopback ----------------------------------------------------------


@pytest.fixture
def cluster(tmp_path, s3_env, monkeypatch):
    """The loopback Kubernetes API with the S3 Secret the nodes take their credentials from, and the flow run's
    environment pointing at it (KUBECONFIG, the image, the namespace)."""
    keys = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}
    secret = {k: v for k, v in s3_env.items() if k in keys} | {"AWS_ENDPOINT_URL_S3": s3_env["AWS_ENDPOINT_URL"]}
    with KubeApiServer(tmp_path / "k8s", secrets={"grpoflow-s3": secret}) as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        monkeypatch.setenv(k8s.IMAGE_ENV, "registry.example.com/ml/grpoflow:test")
        monkeypatch.setenv(k8s.NAMESPACE_ENV, "ml")
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setattr(k8s.Kube, "own_pod", lambda self, namespace: None)  # the flow run is in no pod here
        yield api


def run_train_task(job: JobDir, spec, retries: int | None = None):
    from prefect import flow

    @flow
    def train():
        task = train_task if retries is None else train_task.with_options(retries=retries)
        return task(job, spec)

    return train(return_state=True)


def assert_cleaned_up(api: KubeApiServer, trainjobs: int) -> None:
    """Every TrainJob the task created is deleted, and no node's process is left."""
    created = [path for method, path in api.requests if method == "POST" and path.endswith("/trainjobs")]
    deleted = [path for method, path in api.requests if method == "DELETE" and "/trainjobs/" in path]
    assert len(created) == len(deleted) == trainjobs
    assert api.trainjobs == {}
    assert wait_for(lambda: not api.live_processes(), 30), api.live_processes()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_train_task_runs_the_training_as_a_trainjob(make_job, bucket, cluster):
    job, spec = make_job("k8s", output_uri=f"s3://{bucket}/runs", **SPEC)
    state = run_train_task(job, spec)
    summary = state.result()
    assert summary["global_step"] == 4 and summary["resumed_from"] is None
    # The nodes trained in the task's own job folder (the shared volume): results, metrics each step once.
    assert (job.merged / "model.safetensors").exists()
    assert [r["step"] for r in read_metrics(job.metrics)] == [1, 2, 3, 4]
    progress = [e["payload"]["step"] for e in read_events(job.events) if e["event"] == "grpoflow.training.progress"]
    assert progress == [1, 2, 3, 4]
    # Both nodes' logs are in logs/train.log, one prefix each; node 0 saw the gloo group of two.
    log = (job.logs / "train.log").read_text()
    assert "[node 0] grpoflow: distributed: ddp over 2 process(es)" in log
    assert "[node 1] grpoflow: node 1 done" in log
    # Each process wrote its own RNG state into the shared checkpoint, as the Trainer does on a shared filesystem.
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (job.checkpoints / "checkpoint-4").iterdir()}
    # The TrainJob: the runtime by name, 2 nodes; the nodes got the S3 keys from the Secret, the torch rendezvous
    # environment from the runtime.
    for pod in cluster.started:
        assert pod.env["AWS_ENDPOINT_URL_S3"] == cluster.secrets["grpoflow-s3"]["AWS_ENDPOINT_URL_S3"]
        assert "AWS_ENDPOINT_URL" not in pod.env and pod.env["PET_NNODES"] == "2"
    assert sorted(p.index for p in cluster.started) == [0, 1]
    assert cluster.started[0].container["image"].endswith(":test")
    assert_cleaned_up(cluster, trainjobs=1)


STEPS = 16  # a checkpoint every 4: node 1 is killed at the first one seen, 12 steps before the end


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_killed_node_fails_the_attempt_and_the_retry_resumes(make_job, bucket, cluster):
    """Node 1 is SIGKILLed (its machine lost) once a checkpoint is on the shared volume: the attempt fails naming
    that pod and its exit code, Prefect's retry creates a new TrainJob, whose nodes resume from the checkpoint."""
    job, spec = make_job(
        "lost",
        output_uri=f"s3://{bucket}/runs",
        **{
            **SPEC,
            "hyperparameters": {**SPEC["hyperparameters"], "max_steps": STEPS},
            "checkpoint_every": 4,
            "trl": {"save_total_limit": STEPS},
        },
    )
    killed = {}

    def kill_node_1():
        while not killed:
            checkpoints = (
                sorted(job.checkpoints.glob("checkpoint-*/trainer_state.json")) if job.checkpoints.exists() else []
            )
            if checkpoints and len(cluster.trainjobs) == 1:
                [(_, name)] = list(cluster.trainjobs)
                at = int(checkpoints[-1].parent.name.rsplit("-", 1)[1])
                killed.update(pod=cluster.kill(name, 1).name, at=at)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_node_1, daemon=True)
    killer.start()
    state = run_train_task(job, spec)
    summary = state.result()
    assert killed and 4 <= killed["at"] < STEPS
    messages = flow_run_logs(state.state_details.flow_run_id)
    assert [m for m in messages if f"training pod {killed['pod']} exited with code 137" in m], messages
    assert int(summary["resumed_from"].rsplit("-", 1)[1]) >= killed["at"]  # from the shared volume, not scratch
    assert summary["global_step"] == STEPS
    assert [r["step"] for r in read_metrics(job.metrics)] == list(range(1, STEPS + 1))  # every step exactly once
    assert_cleaned_up(cluster, trainjobs=2)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_a_reward_that_fails_on_the_nodes_is_not_retried(make_job, bucket, cluster):
    """A reward raising at training step 3 on every rank: the nodes exit 3 (the child's record), the task raises
    RewardFailed naming the reward and the step, and creates no second TrainJob. The nodes run the stand-in child,
    which calls the reward through the real child's guard and records its exit as the real child does: what is tested
    is how a node's exit ends the task (the real child's guard: tests/trainers/test_reward_faults.py)."""
    for node in range(SPEC["distributed"]["num_machines"]):
        cluster.node_env[node] = standin_env()
    rewards = [{"name": "mine", "function": "tests.bad_inputs.rewards.from_step3:raises_reward"}]
    job, spec = make_job("fault", output_uri=f"s3://{bucket}/runs", rewards=rewards, **SPEC)
    state = run_train_task(job, spec)
    with pytest.raises(RewardFailed, match="reward 'mine' raised KeyError: 'solution' at training step 3"):
        state.result()
    assert_cleaned_up(cluster, trainjobs=1)


@pytest.mark.usefixtures("prefect_server")
def test_a_node_that_cannot_start_is_a_setup_error(make_job, bucket, cluster):
    """A node's exit 2 (here: the job folder is not on the volume it mounted) is a TrainingSetupError with the node's
    reason, not retried; the TrainJob is deleted."""
    job, spec = make_job("novolume", output_uri=f"s3://{bucket}/runs", **SPEC)
    job.spec.rename(job.root / "spec.yaml.away")  # what a node sees when the volume is not the flow run's
    state = run_train_task(job, spec)
    with pytest.raises(TrainingSetupError, match="no spec.yaml in .*: is distributed.shared_volume mounted there"):
        state.result()
    assert_cleaned_up(cluster, trainjobs=1)  # once: a setup error is not retried


@pytest.mark.usefixtures("prefect_server")
def test_a_suspended_trainjob_waits_in_its_queue_until_admitted(make_job, bucket, cluster, monkeypatch):
    """Kueue holds the TrainJob suspended: the task says so and waits (the start timeout does not run meanwhile);
    once admitted, its nodes run."""
    monkeypatch.setenv(multinode.START_TIMEOUT_ENV, "2")
    original = multinode.trainjob
    monkeypatch.setattr(
        multinode, "trainjob", lambda *a: original(*a) | {"spec": original(*a)["spec"] | {"suspend": True}}
    )
    job, spec = make_job("queued", output_uri=f"s3://{bucket}/runs", **SPEC)
    job.spec.rename(job.root / "spec.yaml.away")  # once admitted the nodes end at once (exit 2): enough here

    def admit_later():
        assert wait_for(lambda: len(cluster.trainjobs) == 1, 60)
        time.sleep(4)  # longer than the start timeout: suspended time does not count
        [(_, name)] = list(cluster.trainjobs)
        assert cluster.pods.get(("ml", name)) is None  # no pods while suspended
        cluster.admit(name)

    admitter = threading.Thread(target=admit_later, daemon=True)
    admitter.start()
    state = run_train_task(job, spec, retries=0)
    admitter.join(10)
    with pytest.raises(TrainingSetupError, match="no spec.yaml in"):
        state.result()
    messages = flow_run_logs(state.state_details.flow_run_id)
    assert any("waits: TrainJob is suspended" in m for m in messages), messages
    assert_cleaned_up(cluster, trainjobs=1)


@pytest.mark.usefixtures("prefect_server")
def test_a_trainjob_deleted_by_someone_else_fails_the_attempt(make_job, bucket, cluster, monkeypatch):
    monkeypatch.setenv("GRPOFLOW_CHILD_STANDIN", "tests.standin_child")  # a TrainJob that runs a while
    job, spec = make_job("gone", output_uri=f"s3://{bucket}/runs", **SPEC)

    def delete_it():
        assert wait_for(lambda: len(cluster.trainjobs) == 1, 60)
        [(_, name)] = list(cluster.trainjobs)
        with cluster.lock:
            cluster.trainjobs.pop(("ml", name))
            for pod in cluster.pods.pop(("ml", name), []):
                pod.stop()

    deleter = threading.Thread(target=delete_it, daemon=True)
    deleter.start()
    state = run_train_task(job, spec, retries=0)
    with pytest.raises(RuntimeError, match="was deleted while it trained"):
        state.result()
    assert wait_for(lambda: not cluster.live_processes(), 30)


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
    monkeypatch.delenv(k8s.IMAGE_ENV)  # and the flow run is in no pod (the fixture): no image to take
    kube = k8s.Kube()
    try:
        with pytest.raises(TrainingSetupError, match=f"set {k8s.IMAGE_ENV}"):
            k8s.pod_settings(kube)
    finally:
        kube.close()


def test_the_nodes_take_image_and_scheduling_from_the_flow_runs_own_pod(tmp_path, monkeypatch):
    """Without GRPOFLOW_IMAGE, a flow run in a pod (the grpo-k8s pool's) gives the nodes its own image, service
    account, nodeSelector and tolerations: they land on the same kind of GPU node."""
    with KubeApiServer(tmp_path / "k8s") as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        monkeypatch.setenv(k8s.NAMESPACE_ENV, "ml")
        monkeypatch.delenv(k8s.IMAGE_ENV, raising=False)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("HOSTNAME", "flow-run-pod")
        toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        api.static_pods[("ml", "flow-run-pod")] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "flow-run-pod", "namespace": "ml", "uid": "u-1"},
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
    assert settings.owner == {"apiVersion": "v1", "kind": "Pod", "name": "flow-run-pod", "uid": "u-1"}


@pytest.mark.usefixtures("prefect_server")
def test_pods_that_never_run_fail_the_attempt_naming_why(make_job, bucket, cluster, monkeypatch):
    """Pods stuck Pending (an image that cannot be pulled, no GPU node) fail the attempt after
    GRPOFLOW_K8S_START_TIMEOUT_S, naming each pod and its reason; the TrainJob is deleted."""
    monkeypatch.setenv(multinode.START_TIMEOUT_ENV, "3")
    cluster.pull_error = 'failed to pull "registry.example.com/ml/grpoflow:test": not found'
    job, spec = make_job("pending", output_uri=f"s3://{bucket}/runs", **SPEC)
    state = run_train_task(job, spec, retries=0)
    with pytest.raises(RuntimeError, match=r"did not all run within 3 s .*-node-0-0-\w+: ImagePullBackOff failed"):
        state.result()
    assert_cleaned_up(cluster, trainjobs=1)
