"""The canary of a several-machine job (`distributed.num_machines` > 1): the same TrainJob shape as training, whose
nodes first meet in one collective across all ranks, then run the canary's one full-length step together.

The flow run's side (`grpoflow.tasks.canary`): `on_machines(job)` is the step runner `grpoflow.jobs.canary.run_canary`
takes; it creates the TrainJob (`grpoflow.cluster.multinode.run_on_machines` with the canary's folder, inside the job
folder on the shared volume) and watches it as the training stage does. Each node runs

    python -m grpoflow.cluster.node --canary <job folder>/<canary folder>

which calls `join_all` here before the step: every machine's rank meets rank 0 at PET_MASTER_ADDR on PET_MASTER_PORT
+ 1 (a port of its own, so the step's rendezvous on PET_MASTER_PORT never meets it), then one `all_reduce` runs over
all of them (NCCL on GPU nodes, gloo on CPU ones). A rank that cannot join within GRPOFLOW_CANARY_JOIN_TIMEOUT_S
(default 300: pods of one TrainJob may start minutes apart) fails the canary, naming it: rank 0 names the ranks that
never checked in, a rank that cannot reach rank 0 names itself and the address it tried.
"""

import os
from collections.abc import Callable
from datetime import timedelta

from grpoflow.core.errors import TrainingSetupError
from grpoflow.core.jobdir import JobDir
from grpoflow.core.spec import JobSpec
from grpoflow.jobs.launch import Machines

JOIN_TIMEOUT_ENV = "GRPOFLOW_CANARY_JOIN_TIMEOUT_S"
JOIN_TIMEOUT_S = 300.0
REACH_GRACE_S = 5.0  # the other ranks wait a little longer than rank 0, so that rank 0 (which knows them all) names
# the ranks missing when it is reachable


def join_timeout() -> float:
    """The seconds the ranks wait for each other (GRPOFLOW_CANARY_JOIN_TIMEOUT_S, default 300)."""
    return float(os.environ.get(JOIN_TIMEOUT_ENV) or JOIN_TIMEOUT_S)


def join_all(machines: Machines, gpu: bool, timeout: float | None = None) -> str:
    """Meets every machine's rank and runs one `all_reduce` over them; returns a line saying so.

    Args:
        machines (`Machines`): this machine's place (its rank, rank 0's host and port).
        gpu (`bool`): NCCL on this machine's first GPU, else gloo on the CPU.
        timeout (`float`, *optional*): seconds to wait for the others (default `join_timeout()`).

    Raises:
        `TrainingSetupError`: a rank did not join, naming it (and the address rank 0 is met at).
    """
    import torch
    import torch.distributed as dist

    timeout = join_timeout() if timeout is None else timeout
    rank, world = machines.machine_rank, machines.num_machines
    store = _store(machines, timeout)
    store.set(f"joined/{rank}", os.environ.get("HOSTNAME", "?"))
    if rank == 0:
        _wait_for_all(store, machines, timeout)
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    try:
        ones = torch.ones(1, device="cuda:0" if gpu else "cpu")
        dist.all_reduce(ones)
        if int(ones.item()) != world:
            raise TrainingSetupError(f"grpoflow: the canary's all_reduce over {world} ranks summed to {ones.item()}")
    finally:
        dist.destroy_process_group()
    store.set(f"done/{rank}", "1")
    if rank == 0:  # rank 0 holds the store: it stays up until every rank is done with it
        store.wait([f"done/{r}" for r in range(world)], timedelta(seconds=timeout))
    return f"canary: all {world} ranks joined; one {backend} all_reduce across them summed to {world}"


def _address(machines: Machines) -> str:
    return f"{machines.main_process_ip}:{machines.main_process_port + 1}"


def _store(machines: Machines, timeout: float):
    """Rank 0's TCPStore (it listens), or another rank's connection to it."""
    import torch.distributed as dist

    host, port, rank = machines.main_process_ip, machines.main_process_port + 1, machines.machine_rank
    if rank == 0:
        return dist.TCPStore(host if host in ("127.0.0.1", "localhost") else "0.0.0.0", port, is_master=True,
                             wait_for_workers=False, timeout=timedelta(seconds=timeout))  # fmt: skip
    wait = timeout + REACH_GRACE_S
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=wait))
    except (RuntimeError, dist.DistError) as e:
        raise TrainingSetupError(
            f"grpoflow: canary: rank {rank} of {machines.num_machines} could not reach rank 0 at "
            f"{_address(machines)} within {wait:.0f} s ({type(e).__name__}): is PET_MASTER_ADDR/PET_MASTER_PORT "
            "this TrainJob's, and may the machines reach each other (network policy, security group)?"
        ) from e


def _wait_for_all(store, machines: Machines, timeout: float) -> None:
    world = machines.num_machines
    keys = [f"joined/{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:  # a timeout: which ranks are missing is the message
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        names = ", ".join(map(str, missing))
        raise TrainingSetupError(
            f"grpoflow: canary: rank {names} of {world} did not join within {timeout:.0f} s ({JOIN_TIMEOUT_ENV}) at "
            f"{_address(machines)}: its machine cannot reach this one (a wrong PET_MASTER_ADDR/PET_MASTER_PORT, a "
            "network policy) or it never started"
        ) from None


def on_machines(job: JobDir) -> Callable[[JobSpec, JobDir], None]:
    """The canary's step runner for a several-machine job: a TrainJob over `distributed.num_machines` nodes that
    runs the step in `canary` (a folder inside `job`'s, on the shared volume)."""
    from grpoflow.cluster.multinode import run_on_machines

    def run(spec: JobSpec, canary: JobDir) -> None:
        run_on_machines(job, spec, canary=canary)

    return run
