"""What each pod of a several-machine training job runs (`tasks.multinode` puts this command in the Job's container):

    python -m tasks.node s3://bucket/runs/<job_id> --main-process-ip HOST [--main-process-port 29500]

Its machine rank is the indexed Job's JOB_COMPLETION_INDEX (or `--machine-rank`). It downloads the job folder into its
own staging folder (GRPOFLOW_STAGING_DIR), then the newest intact checkpoint, and runs the `trainers.grpo` child under
`accelerate launch --num_machines N --machine_rank R --main_process_ip HOST` (`trainers.launch`), its output echoed
to stdout (the pod's log) and kept in `logs/machine-R.log`. Rank 0 uploads each checkpoint as it is saved, with the
metrics and logs, and at the end the training results (`tasks.checkpoint_sync.CheckpointSync`); the other ranks
upload nothing. Exit code: 0 trained, 2 a setup problem and 3 a failed reward (the child's, which no retry cures),
1 any other failure.
"""

import argparse
import os
import sys
from pathlib import Path

from tasks.checkpoint_sync import CheckpointSync, restore_checkpoint
from tasks.job import download_job
from tasks.storage import staging_root
from trainers.jobdir import JobDir
from trainers.launch import (
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    Machines,
    RewardFailed,
    TrainingSetupError,
    run_child,
)
from trainers.spec import load_spec


class Echo:
    """Copies what the child appended to its log file to this process's stdout; called as `run_child`'s poll."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def __call__(self) -> None:
        if not self.path.exists():
            return None
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        return None


def prepare(location: str) -> JobDir:
    """The job folder from the store in this machine's staging folder, with the newest intact checkpoint."""
    job = JobDir(staging_root() / location.rstrip("/").rsplit("/", 1)[-1])
    download_job(job, location)
    if not job.spec.exists():
        raise TrainingSetupError(f"grpoflow: no spec.yaml at {location}: the training task uploads the job first")
    if restored := restore_checkpoint(job, location):
        print(f"grpoflow: {restored} downloaded from {location}: training resumes from it", flush=True)
    return job


def train(job: JobDir, location: str, machines: Machines) -> None:
    """Runs this machine's part of the training; rank 0 mirrors the job folder to `location` meanwhile."""
    spec, _ = load_spec(job.spec)
    rank, log_name = machines.machine_rank, f"machine-{machines.machine_rank}.log"
    print(f"grpoflow: machine {rank} of {machines.num_machines}, {spec.gpu_count} process(es) here", flush=True)
    sync = CheckpointSync(job, location) if rank == 0 else None
    if sync is not None:
        sync.start()
    echo = Echo(job.logs / log_name)
    try:
        run_child(
            "trainers.grpo",
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
        if sync is not None:
            sync.stop()
            print(f"grpoflow: uploads to {location}: {sync.summary()}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("location", help="the job folder on the store: <output_uri>/<job_id>")
    parser.add_argument("--main-process-ip", required=True, help="the host of machine 0 (the rendezvous)")
    parser.add_argument("--main-process-port", type=int, default=29500)
    parser.add_argument("--machine-rank", type=int, default=None, help="default: $JOB_COMPLETION_INDEX")
    args = parser.parse_args(argv)
    rank = args.machine_rank if args.machine_rank is not None else int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    try:
        job = prepare(args.location)
        spec, _ = load_spec(job.spec)
        machines = Machines(spec.distributed.num_machines, rank, args.main_process_ip, args.main_process_port)
        train(job, args.location, machines)
    except TrainingSetupError as e:
        print(f"grpoflow: {str(e).removeprefix('grpoflow: ')}", flush=True)
        return SETUP_ERROR_EXIT
    except RewardFailed as e:
        print(f"grpoflow: {e}", flush=True)
        return REWARD_FAILED_EXIT
    except RuntimeError as e:
        print(f"grpoflow: machine {rank}: {e}", flush=True)
        return 1
    print(f"grpoflow: machine {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
