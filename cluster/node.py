"""What each node of a several-machine training job runs: the trainer command of its Kubeflow Trainer TrainJob
(`grpoflow.cluster.trainjob`):

    python -m grpoflow.cluster.node /mnt/grpoflow/<job_id>

The job folder is on the shared volume (`distributed.shared_volume`, mounted at the same path on every node and in the
flow run's pod), so there is nothing to download or upload here: every node reads the spec and the dataset from it,
resumes from its newest intact checkpoint (`grpoflow.trainers.grpo` does), and writes its own files into the
checkpoints as the Trainer does on a shared filesystem (the model and optimizer from the main process, each process its
RNG state). The node's place comes from the environment Kubeflow Trainer's torch runtime sets on every node:
PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT; `PET_NPROC_PER_NODE` processes per node are the spec's
`gpu_count`. It runs the `grpoflow.trainers.grpo` child under `accelerate launch --num_machines N --machine_rank R
--main_process_ip HOST` (`grpoflow.jobs.launch`), its output echoed to stdout (the pod's log, which the training
task copies into `logs/train.log`) and kept in `logs/node-R.log`.

With `--canary` the folder is the canary's (`grpoflow.cluster.canary`, inside the job folder): the node first meets
every other machine's rank in one collective (`grpoflow.cluster.canary.join_all`: a rank that cannot join is named,
exit 2), then runs the canary's one step with them; rank 0 records its device and memory (`canary-device.json`).

Exit code: 0 trained, 2 a setup problem, 3 a failed reward and 4 a diverged run (the child's, which no retry cures), 1
anything else.
"""

import argparse
import os
import sys
from pathlib import Path

from grpoflow.cluster.canary import join_all
from grpoflow.core.errors import (
    DIVERGED_EXIT,
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    RewardFailed,
    TrainingSetupError,
    TrainingStopped,
)
from grpoflow.core.jobdir import JobDir, write_json_atomic
from grpoflow.core.spec import load_spec
from grpoflow.jobs.launch import Machines, run_child
from grpoflow.trainers.child import CANARY_ENV, visible_gpus

TORCH_ENV = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


class Echo:
    """Copies what the child appends to its log file to stdout, as it comes (`run_child`'s poll)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def __call__(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        if data:
            sys.stdout.write(data.decode(errors="replace"))
            sys.stdout.flush()


def machines_from_env(environ=os.environ) -> Machines:
    """This node's place in the run, from the torch runtime's PET_* variables.

    Raises:
        TrainingSetupError: a variable is missing (the TrainJob's runtime is not a torch one).
    """
    missing = [name for name in TORCH_ENV if not environ.get(name)]
    if missing:
        raise TrainingSetupError(
            f"grpoflow: {', '.join(missing)} not set on this node: distributed.runtime must be a torch runtime of "
            "Kubeflow Trainer (torch-distributed), which sets them on every node"
        )
    return Machines(
        int(environ["PET_NNODES"]),
        int(environ["PET_NODE_RANK"]),
        environ["PET_MASTER_ADDR"],
        int(environ["PET_MASTER_PORT"]),
    )


def train(job: JobDir, machines: Machines, canary: bool = False) -> None:
    """Runs this node's part of the training (with `canary`: the collective, then the canary's step), echoing the
    child's output."""
    spec, _ = load_spec(job.spec)
    rank, log_name = machines.machine_rank, f"node-{machines.machine_rank}.log"
    print(f"grpoflow: node {rank} of {machines.num_machines}, {spec.gpu_count} process(es) here", flush=True)
    env = _canary(job, spec, machines) if canary else None
    echo = Echo(job.logs / log_name)
    try:
        run_child(
            "grpoflow.trainers.grpo",
            job,
            spec.gpu_count,
            log_name,
            poll=echo,
            result=job.training_result,
            strategy=spec.distributed.strategy,
            env=env,
            machines=machines,
        )
    finally:
        echo()


def _canary(job: JobDir, spec, machines: Machines) -> dict:
    """The canary's collective across every machine, and rank 0's device; the step's child environment."""
    from grpoflow.jobs.canary import DEVICE_FILE, device_memory_gb

    gpu = spec.gpu_count >= 1 and bool(visible_gpus())
    print(f"grpoflow: {join_all(machines, gpu)}", flush=True)
    if machines.machine_rank == 0:
        device, memory = device_memory_gb(spec)
        write_json_atomic(job.root / DEVICE_FILE, {"device": device, "device_memory_gb": memory})
    return {CANARY_ENV: "1"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", help="the job folder, on the shared volume")
    parser.add_argument("--canary", action="store_true", help="job_dir is the canary's folder: run its one step")
    args = parser.parse_args(argv)
    job = JobDir(Path(args.job_dir))
    rank = os.environ.get("PET_NODE_RANK", "?")
    try:
        if not job.spec.exists():
            raise TrainingSetupError(
                f"grpoflow: no spec.yaml in {job.root}: is distributed.shared_volume mounted there on this node, as "
                "in the flow run's pod?"
            )
        train(job, machines_from_env(), canary=args.canary)
    except TrainingSetupError as e:
        print(f"grpoflow: {str(e).removeprefix('grpoflow: ')}", flush=True)
        return SETUP_ERROR_EXIT
    except RewardFailed as e:
        print(f"grpoflow: {e}", flush=True)
        return REWARD_FAILED_EXIT
    except TrainingStopped as e:  # the child diverged (NaN or inf): no retry resumes out of it
        print(f"grpoflow: {e}", flush=True)
        return DIVERGED_EXIT
    except RuntimeError as e:
        print(f"grpoflow: node {rank}: {e}", flush=True)
        return 1
    print(f"grpoflow: node {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
