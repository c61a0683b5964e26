"""Process groups: torch.distributed (gloo on CPU, NCCL on GPU) and megatron-core's model-parallel state."""

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from vime_ext.trainer import cpu_shim
from vime_ext.trainer.launch import free_port
from vime_ext.trainer.model_config import ParallelConfig


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
            dist.init_process_group(backend=backend, init_method=f"tcp://{rendezvous.addr}:{rendezvous.port}",
                                    rank=rendezvous.rank, world_size=rendezvous.world_size, timeout=timeout)
        elif "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:  # leave os.environ alone: child processes must not inherit a rank
            dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                    world_size=1, timeout=timeout)
    world = dist.get_world_size()
    if world % parallel.model_parallel_size:
        raise ValueError(f"world size {world} is not divisible by TP x PP = {parallel.model_parallel_size}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tensor_model_parallel_size,
            pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        )
    model_parallel_cuda_manual_seed(seed)


def destroy_distributed() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()

