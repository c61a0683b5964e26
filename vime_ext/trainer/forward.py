"""Forward passes through the (possibly pipelined) Megatron model via megatron-core's schedules."""

from functools import partial
from typing import Callable, NamedTuple

import torch

from vime_ext.models.model_config import ModelShape, padded_vocab_size
from vime_ext.trainer.packing import Packing, model_inputs, next_tokens, to_rows


class VocabShard(NamedTuple):
    """This TP rank's slice of the (padded) vocabulary: ``columns`` logits starting at token id ``start``, of
    which the first ``valid`` are real tokens; ``group`` is the TP group (None without TP)."""

    start: int
    columns: int
    valid: int
    group: object


def vocab_shard(shape: ModelShape) -> VocabShard:
    from megatron.core import parallel_state

    tp, rank = (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_tensor_model_parallel_rank())
    columns = padded_vocab_size(shape, tp) // tp
    valid = max(min(columns, shape.vocab_size - rank * columns), 0)
    group = parallel_state.get_tensor_model_parallel_group() if tp > 1 else None
    return VocabShard(rank * columns, columns, valid, group)


def _forward_step(batch_iter, model, on_output: Callable[[torch.Tensor], None]):
    output = model(**next(batch_iter))

    def consume(output_tensor):
        on_output(output_tensor)
        return output_tensor.new_zeros(()), {}

    return output, consume


def _device_inputs(tokens: torch.Tensor, packing: Packing | None) -> tuple[torch.Tensor, Packing | None]:
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        tokens, packing = tokens.to(device), packing if packing is None else packing.to(device)
    return tokens, packing


def run_forward(model, tokens: torch.Tensor, on_output: Callable[[torch.Tensor], None],
                packing: Packing | None = None) -> None:
    """One forward-only pass over right-padded rows ``tokens`` (given ``packing``: over their packing);
    ``on_output`` receives the model's output (vocab-sharded logits, or a critic's values) on the last stage,
    ``[b, s, ...]``, or ``[1, T, ...]`` packed."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    tokens, packing = _device_inputs(tokens, packing)
    inputs = model_inputs(tokens, packing)
    model.eval()
    get_forward_backward_func()(
        forward_step_func=partial(_forward_step, on_output=on_output),
        data_iterator=iter([inputs]),
        model=[model],
        num_microbatches=1,
        seq_length=inputs["input_ids"].shape[1],
        micro_batch_size=inputs["input_ids"].shape[0],
        forward_only=True,
    )


def forward_backward(model, batches: list, loss_fn: Callable) -> dict[str, float]:
    """Forward and backward over ``batches`` (micro-batches with ``tokens`` and ``loss_mask``) through megatron's
    pipeline schedule, accumulating gradients. ``loss_fn(output, batch)`` runs on the last stage and returns
    ``(loss, statistics)``; the statistics are summed over micro-batches (empty on other stages)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    collected: list[dict] = []

    def step(data_iterator, model):
        batch = next(data_iterator)
        output = model(**model_inputs(batch.tokens, batch.packing))

        def loss_func(output_tensor):
            loss, stats = loss_fn(output_tensor, batch)
            collected.append(stats)
            return loss, batch.loss_mask.sum().to(torch.int), {}

        return output, loss_func

    if batches:
        model.train()
        shapes = [tuple(b.tokens.shape) if b.packing is None else (1, b.packing.num_tokens) for b in batches]
        get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter(batches), model=[model], num_microbatches=len(batches),
            seq_length=max(s[1] for s in shapes), micro_batch_size=max(s[0] for s in shapes), forward_only=False)
    return {k: sum(float(c[k]) for c in collected) for k in (collected[0] if collected else {})}


@torch.no_grad()
def forward_logits(model, shape: ModelShape, input_ids: torch.Tensor) -> torch.Tensor | None:
    """Logits ``[batch, seq, vocab]`` (padding columns removed) on the last pipeline stage, None elsewhere.

    ``input_ids`` must be the same on every rank of the model-parallel group; they are moved to this rank's
    device. Leaves the model in eval mode. Gathers the full vocabulary: for log-probs use
    ``forward_log_probs``, which never does.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    collected: list[torch.Tensor] = []
    run_forward(model, input_ids, collected.append)
    if not parallel_state.is_pipeline_last_stage():
        return None
    return gather_from_tensor_model_parallel_region(collected[0])[..., : shape.vocab_size]


def vocab_parallel_log_probs(logits: torch.Tensor, targets: torch.Tensor, shape: ModelShape,
                             chunk_tokens: int = 4096, with_entropy: bool = False):
    """log p(target) per position from this TP rank's vocab shard of ``[tokens, vocab/TP]`` logits, in fp32,
    ``chunk_tokens`` rows at a time: fp32 [tokens x vocab/TP] never exists at once, in forward or backward
    (see ``log_probs.py``). Padding columns of the vocabulary are excluded. ``with_entropy``: also each row's
    entropy (a statistic, no gradient), as ``(log_probs, entropy)``."""
    from vime_ext.trainer.log_probs import chunked_log_probs

    shard = vocab_shard(shape)
    return chunked_log_probs(logits, targets, shard.start, shard.valid, chunk_tokens, shard.group, with_entropy)


def position_log_probs(logits: torch.Tensor, tokens: torch.Tensor, packing: Packing | None, shape: ModelShape,
                       chunk_tokens: int, with_entropy: bool = False):
    """log p(next token) ``[b, s-1]`` from the model's vocab-sharded logits of right-padded rows ``tokens`` (or
    their ``packing``); differentiable. Positions past a row's end hold meaningless values. ``with_entropy``:
    ``(log_probs, entropy)``, the entropy as a statistic (no gradient)."""
    flat = logits.reshape(-1, logits.shape[-1])  # a view: no copy of the [tokens x vocab] block
    scored = vocab_parallel_log_probs(flat, next_tokens(tokens, packing), shape, chunk_tokens, with_entropy)
    if with_entropy:
        return tuple(to_rows(x, tokens, packing)[:, :-1] for x in scored)
    return to_rows(scored, tokens, packing)[:, :-1]


@torch.no_grad()
def forward_log_probs(model, shape: ModelShape, input_ids: torch.Tensor, chunk_tokens: int = 4096,
                      temperature: float = 1.0, packing: Packing | None = None) -> torch.Tensor | None:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]) as ``[batch, seq-1]`` on the last stage (None elsewhere),
    from vocab-sharded logits divided by ``temperature``, without gathering the vocabulary. ``input_ids`` are
    right-padded rows; given their ``packing`` the model sees that instead. Forward only: no activations are
    kept for a backward pass."""
    from megatron.core import parallel_state

    input_ids, packing = _device_inputs(input_ids, packing)
    results: list[torch.Tensor] = []

    def score(logits: torch.Tensor) -> None:
        if temperature != 1.0:
            logits = logits / temperature
        results.append(position_log_probs(logits, input_ids, packing, shape, chunk_tokens))

    run_forward(model, input_ids, score, packing)
    if not parallel_state.is_pipeline_last_stage():
        return None
    return results[0]


def token_log_probs(model, shape: ModelShape, tokens: list[int], start: int,
                    temperature: float = 1.0) -> torch.Tensor | None:
    """log p(tokens[i] | tokens[:i]) for i in [start, len(tokens)) of one sequence, with the logits divided by
    ``temperature``, on the last pipeline stage (None elsewhere)."""
    if not 0 < start < len(tokens):
        raise ValueError(f"start={start} must leave at least one prompt and one scored token of {len(tokens)}")
    log_probs = forward_log_probs(model, shape, torch.tensor([tokens]), temperature=temperature)
    return None if log_probs is None else log_probs[0, start - 1:].cpu()


@torch.no_grad()
def greedy_generate(model, shape: ModelShape, prompt: list[int], max_new_tokens: int,
                    eos_token_id: int | None = None) -> list[int]:
    """Greedy continuation by full forward passes (no KV cache): a reference decoder for checks, not serving."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = forward_logits(model, shape, torch.tensor([tokens]))
        tokens.append(int(logits[0, -1].argmax()))
        if tokens[-1] == eos_token_id:
            break
    return tokens[len(prompt):]
