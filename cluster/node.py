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

Exit code: 0 trained, 2 a setup problem, 3 a failed reward and 4 a diverged run (the child's, which no retry cures), 1
anything else.
"""

import argparse
import os
import sys
from pathlib import Path

from grpoflow.jobs.launch import Machines, run_child
from grpoflow.trainers.errors import (
    DIVERGED_EXIT,
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    RewardFailed,
    TrainingSetupError,
    TrainingStopped,
)
from grpoflow.trainers.jobdir import JobDir
from grpoflow.trainers.spec import load_spec

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


def train(job: JobDir, machines: Machines) -> None:
    """Runs this node's part of the training, echoing the child's output."""
    spec, _ = load_spec(job.spec)
    rank, log_name = machines.machine_rank, f"node-{machines.machine_rank}.log"
    print(f"grpoflow: node {rank} of {machines.num_machines}, {spec.gpu_count} process(es) here", flush=True)
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
            machines=machines,
        )
    finally:
        echo()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", help="the job folder, on the shared volume")
    args = parser.parse_args(argv)
    job = JobDir(Path(args.job_dir))
    rank = os.environ.get("PET_NODE_RANK", "?")
    try:
        if not job.spec.exists():
            raise TrainingSetupError(
                f"grpoflow: no spec.yaml in {job.root}: is distributed.shared_volume mounted there on this node, as "
                "in the flow run's pod?"
            )
        train(job, machines_from_env())
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
