"""The canary of a several-machine job (`cluster/canary.py`, `cluster/node.py --canary`) on the loopback TrainJob of
`tests/k8s_api_server.py`: the same TrainJob shape as training, whose nodes (real local processes, gloo over
127.0.0.1) meet in one all_reduce across all ranks before the canary's step; a rank that cannot join is named, and
the pipeline ends Rejected before any training TrainJob is created."""

import json

import pytest

from grpoflow.cluster.canary import JOIN_TIMEOUT_ENV, join_all
from grpoflow.core.errors import TrainingSetupError
from grpoflow.jobs.launch import Machines
from grpoflow.tasks.canary import canary_task
from tests.cluster.test_multinode import SPEC, assert_cleaned_up, cluster  # noqa: F401  (cluster: a fixture)
from tests.conftest import cli
from tests.ports import reserve_ports


def test_a_lone_rank_0_names_the_rank_that_never_joined():
    """Rank 0 of two, with no rank 1 anywhere: after the timeout it names rank 1 and the address it waited at."""
    with reserve_ports() as port:
        with pytest.raises(
            TrainingSetupError, match=rf"rank 1 of 2 did not join within 2 s .* at 127.0.0.1:{port + 1}"
        ):
            join_all(Machines(2, 0, "127.0.0.1", port), gpu=False, timeout=2)


def test_a_rank_that_cannot_reach_rank_0_names_itself():
    with reserve_ports() as port:  # nothing listens on port + 1: rank 1 cannot reach rank 0
        with pytest.raises(TrainingSetupError, match=rf"rank 1 of 2 could not reach rank 0 at 127.0.0.1:{port + 1}"):
            join_all(Machines(2, 1, "127.0.0.1", port), gpu=False, timeout=1)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_the_canary_runs_as_a_trainjob_joining_every_rank(make_job, bucket, cluster):  # noqa: F811
    """Two nodes: both join the collective, then run the canary's one full-length step together; canary.json has
    the step's figures, the TrainJob is the training's shape with the canary's command, and nothing of it is left."""
    from prefect import flow

    job, spec = make_job("k8s-canary", output_uri=f"s3://{bucket}/runs", canary={"enabled": True}, **SPEC)

    @flow
    def canary():
        return canary_task(job, spec)

    result = canary()
    assert result["status"] == "passed", result["reason"]
    assert result["step_seconds"] > 0 and result["peak_memory_gb"] > 0.1 and result["device"] == "cpu"
    assert json.loads((job.root / "canary.json").read_text()) == result
    log = (job.logs / "canary.log").read_text()
    assert "[node 0] grpoflow: canary: all 2 ranks joined; one gloo all_reduce across them summed to 2" in log
    assert "[node 1] grpoflow: canary: all 2 ranks joined" in log
    [pod, _] = sorted(cluster.started, key=lambda p: p.index)
    assert pod.command[1:4] == ["-m", "grpoflow.cluster.node", "--canary"]
    assert pod.command[4].startswith(str(job.root / "grpoflow-canary-"))  # inside the shared job folder
    assert not list(job.root.glob("grpoflow-canary-*")) and not list(job.root.rglob("checkpoint-*"))
    assert_cleaned_up(cluster, trainjobs=1)


@pytest.mark.usefixtures("prefect_server")
def test_a_rank_that_cannot_join_ends_the_pipeline_rejected(make_spec, bucket, cluster, tmp_path, monkeypatch):  # noqa: F811
    """Node 1 is given a wrong PET_MASTER_PORT (it cannot reach rank 0): rank 0 names rank 1 after the join timeout,
    the canary fails with that reason, the run ends Rejected (exit 2) and no training TrainJob is ever created."""
    monkeypatch.setenv(JOIN_TIMEOUT_ENV, "5")  # passed to the nodes as the pool's environment would be
    with reserve_ports() as wrong:  # ports nothing listens on, held for the test
        cluster.node_env[1] = {"PET_MASTER_PORT": str(wrong)}
        spec = make_spec("k8s-reject", output_uri=f"s3://{bucket}/runs", **SPEC)  # canary: auto, 2 machines: it runs
        code, out, err = cli("run", spec, "--json")
        assert code == 2, err[-3000:]
        said = "rejected: canary failed: the step did not run: canary: rank 1 of 2 did not join within 5 s"
        assert said in err, err[-3000:]
        created = [path for method, path in cluster.requests if method == "POST" and path.endswith("/trainjobs")]
        assert len(created) == 1  # the canary's: training never started
        assert [p.container["command"][3] for p in cluster.started] == ["--canary", "--canary"]
        assert "Task run 'train" not in out + err
        assert_cleaned_up(cluster, trainjobs=1)
