"""Run a function on N local ranks (gloo on CPU, one GPU per rank on CUDA) when not started by torchrun."""

import os
import random
import socket
from pathlib import Path
from typing import Callable

import torch.multiprocessing as mp


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port free to listen on now, taken from below the kernel's ephemeral range.

    A port that bind(("", 0)) hands out lies in the ephemeral range, which every outgoing connection on the
    machine draws from too: between this call and the server's bind, a client socket (the router's own health
    checks to its workers, say) can take it, and the server dies with "Address already in use". Below the range
    only a process that names the port can. Ports already handed out by this process are not handed out again.
    """
    low, _ = _ephemeral_range()
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    for port in candidates:
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # every port below the range taken: fall back to one the kernel picks
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fn(*args)


def run_on_ranks(fn: Callable, world_size: int, *args, isolate: bool = False) -> None:
    """Call ``fn(*args)`` on ``world_size`` ranks.

    Runs in this process when already launched (torchrun sets WORLD_SIZE) or when ``world_size`` is 1, unless
    ``isolate`` asks for fresh processes (megatron-core's parallel state is process-global). ``fn`` must be
    importable at module level: ranks are started with the spawn method.
    """
    if not isolate and ("WORLD_SIZE" in os.environ or world_size == 1):
        fn(*args)
        return
    mp.start_processes(_entry, args=(world_size, free_port(), fn, args), nprocs=world_size,
                       start_method="spawn", join=True)
