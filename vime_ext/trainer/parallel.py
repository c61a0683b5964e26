"""Process groups: torch.distributed (gloo on CPU, NCCL on GPU) and megatron-core's model-parallel state."""

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from vime_ext.models.model_config import ParallelConfig
from vime_ext.net import loopback_sockets_env
from vime_ext.trainer import cpu_shim


@dataclass(frozen=True)
class Rendezvous:
    """Where this rank meets the others, passed explicitly rather than through os.environ: a trainer rank that
    runs inside the driver (--no-ray) must not leave RANK/WORLD_SIZE/MASTER_PORT behind for the processes the
    driver starts later (a converter subprocess would otherwise try to rendezvous on the trainer's port)."""
    rank: int
    world_size: int
    addr: str
    port: int
    local_rank: int = 0


def init_distributed(parallel: ParallelConfig, seed: int = 1234, timeout_s: int = 600,
                     rendezvous: Rendezvous | None = None) -> None:
    """Initialise the default group and Megatron's model-parallel state.

    The group comes from ``rendezvous`` when given, else from the usual env vars (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT, as torchrun sets them); a single process with neither becomes a world of one.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    cpu_shim.install()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            local_rank = rendezvous.local_rank if rendezvous else int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local_rank)
        timeout = timedelta(seconds=timeout_s)
        if rendezvous is not None:
            for key, value in loopback_sockets_env(rendezvous.addr).items():  # every rank on this node
                os.environ.setdefault(key, value)
            dist.init_process_group(backend=backend, store=_store(rendezvous, timeout), rank=rendezvous.rank,
                                    world_size=rendezvous.world_size, timeout=timeout)
        elif "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:  # leave os.environ alone: child processes must not inherit a rank
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    world = dist.get_world_size()
    if world % parallel.model_parallel_size:
        raise ValueError(f"world size {world} is not divisible by TP x PP = {parallel.model_parallel_size}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tensor_model_parallel_size,
            pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        )
    model_parallel_cuda_manual_seed(seed)


def _store(rendezvous: Rendezvous, timeout: timedelta) -> dist.Store:
    """The group's key-value store: in memory for a world of one (no socket at all); else a TCPStore served by
    rank 0 on the rendezvous address only. Given just a port, TCPStore listens on every interface; handed a socket
    bound to the address, it listens there (127.0.0.1 on one node)."""
    if rendezvous.world_size == 1:
        return dist.HashStore()
    fd = None
    if rendezvous.rank == 0:
        family = socket.AF_INET6 if ":" in rendezvous.addr else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((rendezvous.addr, rendezvous.port))
        listener.listen(128)
        fd = listener.detach()  # the store owns it from here
    return dist.TCPStore(rendezvous.addr, rendezvous.port, rendezvous.world_size, rendezvous.rank == 0, timeout,
                         master_listen_fd=fd)


def destroy_distributed() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()

