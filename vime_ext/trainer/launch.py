"""Run a function on N local ranks (gloo on CPU, one GPU per rank on CUDA) when not started by torchrun."""

import os
from typing import Callable

import torch.multiprocessing as mp

from vime_ext.net import free_port


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
