"""What each pod of a several-machine training job runs (the container command of
`grpoflow.cluster.kube.job_manifest`):

    python -m grpoflow.cluster.node s3://bucket/runs/<job_id> --main-process-ip HOST [--main-process-port 29500]
        [--checkpoint checkpoint-N | none]

Its machine rank is the indexed Job's JOB_COMPLETION_INDEX (or `--machine-rank`). It downloads the job folder into its
own staging folder (GRPOFLOW_STAGING_DIR), then the checkpoint the task picked for every machine (default: the newest
every machine uploaded its part of, `complete_checkpoint`), and runs the `grpoflow.trainers.grpo` child under
`accelerate launch --num_machines N --machine_rank R --main_process_ip HOST` (`grpoflow.trainers.launch`), its output
echoed to stdout (the pod's log) and kept in `logs/machine-R.log`. Rank 0 uploads each checkpoint as it is saved, with
the metrics and logs, and at the end the training results (`grpoflow.integrations.checkpoint_sync.CheckpointSync`). The
other machines' processes write files of their own into each checkpoint (their RNG state; with zero2/zero3 their
DeepSpeed shards), which no other machine's disk holds: each such machine uploads them into the same remote checkpoint
once rank 0's manifest says it is intact, with a manifest of its own (`grpoflow-checkpoint.machine-R.json`), and
downloads them with the checkpoint on a retry (`MachineCheckpoints`). Exit code: 0 trained, 2 a setup problem and 3 a
failed reward (the child's, which no retry cures), 1 any other failure.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from grpoflow.integrations.checkpoint_sync import (
    CHECK_S,
    CheckpointSync,
    download_checkpoint,
    remote_checkpoints,
    remote_manifest,
)
from grpoflow.integrations.jobs import download_job
from grpoflow.integrations.storage import filesystem, join, staging_root
from grpoflow.trainers.jobdir import JobDir
from grpoflow.trainers.launch import (
    REWARD_FAILED_EXIT,
    SETUP_ERROR_EXIT,
    Machines,
    RewardFailed,
    TrainingSetupError,
    run_child,
)
from grpoflow.trainers.spec import load_spec

# How long a machine of rank > 0 waits, after its child exited, for rank 0's upload of the newest checkpoint (its own
# part goes up after it).
FINAL_WAIT_S = 120.0


class MachineCheckpoints(threading.Thread):
    """On a machine of rank > 0: uploads the files its processes wrote into each local `checkpoint-N` (those rank
    0's manifest does not list) once rank 0's upload of that checkpoint is intact, then a manifest of this machine's
    files; removes the local checkpoints rank 0 no longer keeps (its `save_total_limit`, which only rank 0 applies)."""

    def __init__(self, job: JobDir, location: str, rank: int):
        super().__init__(name=f"machine-{rank}-checkpoints", daemon=True)
        self.job, self.rank, self.sent = job, rank, set()
        self.listed: dict[str, dict[str, int]] = {}  # checkpoint -> this machine's files in it, and their sizes
        self.fs, self.remote = filesystem(join(location, "checkpoints"))
        self.remote = self.remote.rstrip("/")
        self._stopping = threading.Event()

    @staticmethod
    def manifest_name(rank: int) -> str:
        return f"grpoflow-checkpoint.machine-{rank}.json"

    def run(self) -> None:
        while not self._stopping.wait(CHECK_S):
            self._round()
        # The child exited: nothing writes into the checkpoints any more, but rank 0 may still be uploading its part
        # of the newest one, which this machine's part waits for (up to FINAL_WAIT_S).
        deadline = time.monotonic() + FINAL_WAIT_S
        while True:
            self._round(final=True)
            local = self._local()
            if not local or local[-1].name in self.sent or time.monotonic() > deadline:
                return
            time.sleep(CHECK_S)

    def _round(self, final: bool = False) -> None:
        try:
            self.round(final)
        except Exception as e:  # a store hiccup or a rotation race: the next round retries
            print(f"grpoflow: machine {self.rank}: checkpoint upload failed (retried): {e}", flush=True)

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def _local(self) -> list[Path]:
        if not self.job.checkpoints.exists():
            return []
        return sorted((p for p in self.job.checkpoints.glob("checkpoint-*") if p.name[11:].isdigit()), key=_step)

    def round(self, final: bool = False) -> None:
        """One look: uploads this machine's part of each checkpoint rank 0 completed; `final` (the child exited) takes
        the files as they are, without waiting a round for them to stop changing."""
        local = self._local()
        if not local:
            return
        for path in local:
            if path.name in self.sent or (main := remote_manifest(self.fs, f"{self.remote}/{path.name}")) is None:
                continue
            ours = {n: p for n, p in _files(path).items() if n not in main["files"] and not n.startswith("grpoflow-")}
            sizes = {n: p.stat().st_size for n, p in ours.items()}
            if not final and self.listed.get(path.name) != sizes:  # still being written: the same a round later
                self.listed[path.name] = sizes
                continue
            entries = {}
            for name, file in ours.items():
                sha = _sha256(file)
                self.fs.put_file(str(file), f"{self.remote}/{path.name}/{name}")
                entries[name] = {"size": sizes[name], "sha256": sha}
            manifest = json.dumps({"step": _step(path), "files": entries}).encode()
            self.fs.pipe_file(f"{self.remote}/{path.name}/{self.manifest_name(self.rank)}", manifest)
            self.sent.add(path.name)
        kept = {r.rsplit("/", 1)[-1] for r in remote_checkpoints(self.fs, self.remote)}
        newest_sent = max((int(n.rsplit("-", 1)[-1]) for n in self.sent), default=0)
        for path in local[:-1]:  # the newest may be saving now
            if path.name not in kept and (path.name in self.sent or _step(path) < newest_sent):
                shutil.rmtree(path, ignore_errors=True)

    def restore(self, name: str) -> int:
        """Downloads this machine's files of the remote checkpoint `name` into the local one; returns how many (0 and
        a warning when the checkpoint has none of this machine's: its processes start that checkpoint without)."""
        try:
            manifest = json.loads(self.fs.cat_file(f"{self.remote}/{name}/{self.manifest_name(self.rank)}"))
        except FileNotFoundError:
            print(f"grpoflow: {name} on the store has no files of machine {self.rank}", flush=True)
            return 0
        for rel, entry in manifest["files"].items():
            dest = self.job.checkpoints / name / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(f"{self.remote}/{name}/{rel}", str(dest))
            if dest.stat().st_size != entry["size"] or _sha256(dest) != entry["sha256"]:
                raise RuntimeError(f"{name}/{rel} of machine {self.rank} does not match its manifest")
        return len(manifest["files"])


def _step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[-1])


def _files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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


def complete_checkpoint(location: str, num_machines: int) -> str | None:
    """The newest checkpoint under `<location>/checkpoints` that every machine can resume from: intact by rank 0's
    manifest and with each other machine's own manifest (a machine lost before it uploaded its files leaves a
    checkpoint the others cannot resume together). The training task picks it once, before any pod starts, so that
    every machine resumes from the same one. None: start from the beginning."""
    fs, remote = filesystem(join(location, "checkpoints"))
    for candidate in remote_checkpoints(fs, remote.rstrip("/")):
        try:
            names = {n.rsplit("/", 1)[-1] for n in fs.ls(candidate, detail=False)}
        except FileNotFoundError:  # removed since the listing (rank 0's rotation)
            continue
        machines = all(MachineCheckpoints.manifest_name(rank) in names for rank in range(1, num_machines))
        if machines and remote_manifest(fs, candidate) is not None:
            return candidate.rsplit("/", 1)[-1]
    return None


def fetch_job(location: str) -> JobDir:
    """The job folder from the store in this machine's staging folder, all but its checkpoints."""
    job = JobDir(staging_root() / location.rstrip("/").rsplit("/", 1)[-1])
    download_job(job, location)
    if not job.spec.exists():
        raise TrainingSetupError(f"grpoflow: no spec.yaml at {location}: the training task uploads the job first")
    return job


def restore(job: JobDir, location: str, rank: int, checkpoint: str) -> None:
    """Downloads `checkpoint`: rank 0's files (checked against its manifest) and this machine's own."""
    fs, remote = filesystem(join(location, "checkpoints", checkpoint))
    manifest = remote_manifest(fs, remote.rstrip("/"))
    if manifest is None or not download_checkpoint(fs, remote.rstrip("/"), manifest, job.checkpoints / checkpoint):
        raise RuntimeError(f"{checkpoint} at {location} is not intact (any more)")
    own = MachineCheckpoints(job, location, rank).restore(checkpoint) if rank else 0
    print(
        f"grpoflow: {checkpoint} downloaded ({own} files of this machine's own): training resumes from it", flush=True
    )


def train(job: JobDir, location: str, machines: Machines, restored: str | None = None) -> None:
    """Runs this machine's part of the training; rank 0 mirrors the job folder to `location` meanwhile (all but
    `restored`, the checkpoint every machine resumed from), the others their own checkpoint files."""
    spec, _ = load_spec(job.spec)
    rank, log_name = machines.machine_rank, f"machine-{machines.machine_rank}.log"
    print(f"grpoflow: machine {rank} of {machines.num_machines}, {spec.gpu_count} process(es) here", flush=True)
    sync = CheckpointSync(job, location, on_store=restored) if rank == 0 else MachineCheckpoints(job, location, rank)
    sync.start()
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
        sync.stop()
        if rank == 0:
            print(f"grpoflow: uploads to {location}: {sync.summary()}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("location", help="the job folder on the store: <output_uri>/<job_id>")
    parser.add_argument("--main-process-ip", required=True, help="the host of machine 0 (the rendezvous)")
    parser.add_argument("--main-process-port", type=int, default=29500)
    parser.add_argument("--machine-rank", type=int, default=None, help="default: $JOB_COMPLETION_INDEX")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="the checkpoint every machine resumes from, or none (default: the newest "
        "every machine can resume from, `complete_checkpoint`)",
    )
    args = parser.parse_args(argv)
    rank = args.machine_rank if args.machine_rank is not None else int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    try:
        job = fetch_job(args.location)
        spec, _ = load_spec(job.spec)
        checkpoint = args.checkpoint or complete_checkpoint(args.location, spec.distributed.num_machines) or "none"
        if checkpoint != "none":
            restore(job, args.location, rank, checkpoint)
        machines = Machines(spec.distributed.num_machines, rank, args.main_process_ip, args.main_process_port)
        train(job, args.location, machines, restored=None if checkpoint == "none" else checkpoint)
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
