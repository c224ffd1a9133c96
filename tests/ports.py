"""Ports on 127.0.0.1 that no other test, and no connection the system opens, can take while a test holds them.

A port found free with `bind(0)` and closed again can be taken by anything before the process it is meant for binds
it: a client's outgoing connection (the system picks those from the same ephemeral range) or another xdist worker's
`bind(0)`. `reserve_ports()` picks from below the system's ephemeral range (net.ipv4.ip_local_port_range), which the
system never hands out by itself, and holds each port block under a file lock that every test process checks, so two
tests (in any worker, or any checkout on this machine) never get the same block:

    with reserve_ports() as port:  # port and port + 1 are this test's until the block ends
        ...
"""

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

BLOCK = 2  # a TrainJob's rendezvous port and the canary's (PET_MASTER_PORT + 1)
LOWEST = 20000
LOCKS = Path(tempfile.gettempdir()) / "grpoflow-test-ports"


def ephemeral_start() -> int:
    """The lowest port the system hands out on its own (32768 on Linux by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):  # rank 0 listens on loopback or on every address
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


@contextlib.contextmanager
def reserve_ports() -> Iterator[int]:
    """Holds `BLOCK` consecutive ports (the first is yielded) that nothing listens on, for the block's duration."""
    LOCKS.mkdir(exist_ok=True)
    starts = list(range(LOWEST, ephemeral_start() - BLOCK + 1, BLOCK))
    random.shuffle(starts)  # workers starting together do not all queue for the first block
    for start in starts:
        fd = os.open(LOCKS / f"{start}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            if all(_bindable(p) for p in range(start, start + BLOCK)):
                yield start
                return
        finally:
            os.close(fd)  # releases the lock
    raise RuntimeError(f"no free block of {BLOCK} ports between {LOWEST} and {ephemeral_start()}")
