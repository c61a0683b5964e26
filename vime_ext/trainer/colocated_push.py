"""A trainer rank's part in the colocated weight push (CUDA IPC): every rank holds every stage's full tensors on
its own GPU and gives their handles to the engine on that GPU.

vLLM's IPC engine takes, per tensor, one handle per GPU of the engine, keyed by the GPU's UUID, in one request;
each of its workers maps the copy on its own GPU. So the ranks on one engine's GPUs (``WeightTarget.engine_ranks``,
placed by ``gpu_sharing.py``) form a group: each builds the full tensors (TP gathers within its model copy,
pipeline stages broadcast to each other: ``iter_all_hf_weights``), and the first of them gathers the group's
handles and posts them to the engines on those GPUs alone (several with ``--rollout-engines-per-gpu``, each
mapping the same copy through handles of its own). Every data-parallel copy feeds its own engines, so all GPUs work.
"""

from typing import Callable

import torch
import torch.distributed as dist

from vime_ext.engines.weight_sync import IpcShare, WeightSync, WeightTarget, cuda_ipc_share
from vime_ext.models.model_config import ModelShape
from vime_ext.trainer.hf_weights import iter_all_hf_weights


def engine_groups(engine_ranks: tuple[tuple[int, ...], ...]) -> dict[tuple[int, ...], object]:
    """One process group per set of ranks with engines, if it has more than one rank (None for one rank); engines
    sharing GPUs share the set. Every rank of the world must call this with the same routes, as
    ``torch.distributed.new_group`` requires."""
    return {ranks: dist.new_group(list(ranks)) if len(ranks) > 1 else None for ranks in dict.fromkeys(engine_ranks)}


class ColocatedPush:
    """This rank's sender for ``target``: kept between pushes, made again when the target changes."""

    def __init__(self, target: WeightTarget, rank: int, bucket_bytes: int,
                 share: Callable[[torch.Tensor], tuple[str, object]] = cuda_ipc_share):
        if target.transport != "ipc":
            raise ValueError(f"a colocated push goes over ipc, not {target.transport}")
        engines = target.ipc_engines_of(rank)
        ranks = target.engine_ranks[engines[0]]
        group = engine_groups(target.engine_ranks)[ranks]
        self.sync = WeightSync([target.urls[e] for e in engines], bucket_bytes=bucket_bytes, transport="ipc",
                               ipc=IpcShare(group, lead=ranks[0], posts=rank == ranks[0], share=share))

    def send(self, model: torch.nn.Module, shape: ModelShape) -> int:
        """Push every tensor; returns how many this rank posted (0 on a rank that only gives its handles)."""
        sent = self.sync.send(iter_all_hf_weights(model, shape))
        return sent if self.sync.ipc.posts else 0

    def close(self) -> None:
        self.sync.close()
