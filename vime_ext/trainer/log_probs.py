"""log p(target) from vocab-sharded logits, in fp32 chunks, with a backward that recomputes instead of storing.

megatron-core's ``vocab_parallel_cross_entropy`` keeps the fp32 softmax of every row for its backward, so a
[tokens x vocab/TP] fp32 tensor lives until backward (10 GB at 16K tokens of a 152K vocabulary). Here forward
keeps only the per-row log-normaliser; backward recomputes each chunk's softmax from the logits (which the
output layer keeps anyway) and writes the gradient chunk by chunk. The entropy statistic can come out of the same
chunks, so logging it costs no fp32 [tokens x vocab] copy of its own.
"""

import torch
import torch.distributed as dist


def _reduce(tensor: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


class _ChunkedVocabParallelLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, vocab_start, valid_columns, chunk, group, with_entropy):
        n = targets.numel()
        out = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=logits.device)
        local = targets - vocab_start
        inside = (local >= 0) & (local < valid_columns)
        local = local.clamp(0, logits.shape[-1] - 1)
        for start in range(0, n, chunk):
            rows = slice(start, start + chunk)
            x = logits[rows, :valid_columns].float()
            row_max = _reduce(x.max(dim=-1).values, dist.ReduceOp.MAX, group)
            total = _reduce((x - row_max[:, None]).exp().sum(dim=-1), dist.ReduceOp.SUM, group)
            lse[rows] = row_max + total.log()
            picked = x.gather(-1, local[rows, None]).squeeze(-1) * inside[rows]
            out[rows] = _reduce(picked, dist.ReduceOp.SUM, group) - lse[rows]
            if with_entropy:  # -sum p log p from the same chunk (in place unless x is the fp32 logits themselves)
                log_p = x - lse[rows, None] if logits.dtype == torch.float32 else x.sub_(lse[rows, None])
                entropy[rows] = -_reduce((log_p.exp() * log_p).sum(dim=-1), dist.ReduceOp.SUM, group)
        ctx.save_for_backward(logits, local, inside, lse)
        ctx.valid_columns, ctx.chunk = valid_columns, chunk
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, _grad_entropy):
        logits, local, inside, lse = ctx.saved_tensors
        grad = torch.zeros_like(logits)
        cols = ctx.valid_columns
        for start in range(0, lse.numel(), ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            # d log p(t) / d x_j = 1[j = t] - softmax_j
            g = -(logits[rows, :cols].float() - lse[rows, None]).exp()
            g.scatter_add_(-1, local[rows, None], inside[rows, None].to(g.dtype))
            grad[rows, :cols] = (g * grad_out[rows, None]).to(grad.dtype)
        return grad, None, None, None, None, None, None


def chunked_log_probs(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, valid_columns: int,
                      chunk: int = 4096, group=None, with_entropy: bool = False):
    """``logits``: ``[tokens, shard]`` holding vocabulary columns ``vocab_start ...``; the first
    ``valid_columns`` are real (the rest pad the vocabulary to a multiple of TP). ``group``: the TP group
    (None alone). Returns fp32 ``[tokens]``; the gradient flows to ``logits`` in its dtype. ``with_entropy``:
    returns ``(log_probs, entropy)``, the entropy of each row's distribution as a statistic (no gradient)."""
    log_probs, entropy = _ChunkedVocabParallelLogProb.apply(logits, targets, vocab_start, max(valid_columns, 0),
                                                            chunk, group, with_entropy)
    return (log_probs, entropy) if with_entropy else log_probs
