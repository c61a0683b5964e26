"""Weights in and out of a live, possibly TP/PP-sharded Megatron model.

``iter_hf_weights`` is the one weight iterator of vime_ext: HF conversion and engine weight sync both use it.
"""

from typing import Callable, Iterator

import torch
import torch.distributed as dist
from tqdm import tqdm

from vime_ext.convert import mapping_for
from vime_ext.convert.mapping import canonical, global_param_name
from vime_ext.models.model_config import ModelShape, padded_vocab_size
from vime_ext.trainer.model_provider import unwrap


def _tp():
    from megatron.core import parallel_state

    return (parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_group())


def trainable_params(model: torch.nn.Module, shape: ModelShape,
                     with_tied_copy: bool = False) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """(global canonical name, param) for this stage's params.

    With tied embeddings and several pipeline stages the last stage keeps its own copy of the embedding as
    ``output_layer.weight``; it is skipped unless ``with_tied_copy``, and then named after the embedding.
    """
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    model = unwrap(model)
    offset = get_transformer_layer_offset(model.config)
    for local_name, param in model.named_parameters():
        if local_name == "output_layer.weight" and shape.tie_word_embeddings:
            if with_tied_copy:
                yield "embedding.word_embeddings.weight", param
            continue
        yield canonical(global_param_name(local_name, offset)), param


@torch.no_grad()
def load_hf_weights(model: torch.nn.Module, shape: ModelShape, get_hf: Callable[[str], torch.Tensor],
                    progress: bool = False) -> int:
    """Copy HF tensors (fetched by name through ``get_hf``) into this rank's shard of ``model``.

    Returns the number of params filled; every param of the stage is covered, including the last stage's
    copy of a tied embedding.
    """
    mapping = mapping_for(shape)
    tp_size, tp_rank, _ = _tp()
    padded = padded_vocab_size(shape, tp_size)
    params = list(trainable_params(model, shape, with_tied_copy=True))
    for name, param in tqdm(params, desc="load HF weights", unit="tensor", disable=not progress):
        full = mapping.to_megatron(name, [get_hf(n) for n in mapping.hf_names(name)], padded)
        local = mapping.shard(name, full, param, tp_size, tp_rank)
        if local.shape != param.shape:
            raise ValueError(
                f"{name}: HF tensors {mapping.hf_names(name)} give shape {tuple(local.shape)} on TP rank "
                f"{tp_rank}, but the model expects {tuple(param.shape)}"
            )
        param.copy_(local)
    return len(params)


@torch.no_grad()
def iter_hf_weights(model: torch.nn.Module, shape: ModelShape) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` for this pipeline stage's params, gathered over TP.

    Every TP rank of the stage takes part in the gathers and receives the same tensors.
    """
    mapping = mapping_for(shape)
    tp_size, _, tp_group = _tp()
    for name, param in trainable_params(model, shape):
        shards = [param.data]
        if tp_size > 1 and getattr(param, "tensor_model_parallel", False):
            shards = [torch.empty_like(param.data) for _ in range(tp_size)]
            dist.all_gather(shards, param.data.contiguous(), group=tp_group)
        yield from mapping.to_hf(name, mapping.unshard(name, shards, param))


@torch.no_grad()
def iter_all_hf_weights(model: torch.nn.Module, shape: ModelShape) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` for every pipeline stage's params, on this rank's device: its own stage's
    gathered over TP (``iter_hf_weights``), the other stages' broadcast over the pipeline group by the rank that
    holds them. For receivers on every trainer GPU (colocated engines, each mapping the copy on its own GPU).

    Every rank of the model takes part; each stage's ranks broadcast in stage order, one tensor at a time (name,
    dtype and shape first), so no rank holds more than one foreign tensor at once."""
    from megatron.core import parallel_state

    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    if pp_size == 1:
        yield from iter_hf_weights(model, shape)
        return
    group = parallel_state.get_pipeline_model_parallel_group()
    stage_ranks = dist.get_process_group_ranks(group)
    own_stage = parallel_state.get_pipeline_model_parallel_rank()
    device = next(unwrap(model).parameters()).device
    for stage, src in enumerate(stage_ranks):
        own = iter_hf_weights(model, shape) if stage == own_stage else None
        while True:
            item = next(own, None) if own is not None else None
            meta = [None if item is None else (item[0], item[1].dtype, tuple(item[1].shape))]
            dist.broadcast_object_list(meta, src=src, group=group, device=device if device.type == "cuda" else None)
            if meta[0] is None:
                break
            name, dtype, size = meta[0]
            tensor = item[1].contiguous() if item is not None else torch.empty(size, dtype=dtype, device=device)
            dist.broadcast(tensor, src=src, group=group)
            yield name, tensor
